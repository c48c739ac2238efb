"""Bring a lent GPU session's results into its device's folder, the one layout bench/results/gpu_<device>/ keeps.

    python tools/merge_gpu_session.py OUT/bench bench/results/gpu_h200 --date 2026-12-02 --tree 1234abc \
        --torch 2.11.0+cu130 --device-name "NVIDIA H200" --note "the tree of 1234abc, nothing uncommitted"

A benchmark measured for the first time is copied as `<name>.json`. One measured before joins the runs of
`<name>.runs.json` (oldest first; a lone `<name>.json` becomes the first run of it), since `trainers plan` takes the
median of a configuration's runs and the READMEs cite a run by its place. Logs go to `logs/`, replacing the ones of
the same name (their history is git's). Each record gets the `session` block that says where it ran. Nothing is
written when a file of the session is not a JSON object; no folder per session, stamped with a commit, is made.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def session_block(args: argparse.Namespace) -> dict:
    return {"device_name": args.device_name, "date": args.date, "tree_measured": args.tree, "torch": args.torch,
            "note": args.note, "source": f"tools/merge_gpu_session.py from {args.session}"}


def without_session(record: dict) -> dict:
    return {k: v for k, v in record.items() if k != "session"}


def merge(session: Path, device_dir: Path, block: dict) -> list[str]:
    """Every file of the session merged into device_dir; returns what was done, a line a file."""
    records = {}
    for path in sorted(session.glob("*.json")):
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise SystemExit(f"error: {path} is not a JSON object: nothing merged")
        records[path.name] = {**record, "session": block}
    device_dir.mkdir(parents=True, exist_ok=True)
    done = []
    for name, record in records.items():
        single, runs = device_dir / name, device_dir / f"{name[:-5]}.runs.json"
        if runs.exists():
            stored = json.loads(runs.read_text())
            if any(without_session(run) == without_session(record) for run in stored["runs"]):
                done.append(f"{name}: already run of {runs.name} (a session merged twice): left as it was")
                continue  # (the plan's median would count one run twice)
            stored["runs"].append(record)
            runs.write_text(json.dumps(stored, indent=2) + "\n")
            done.append(f"{name}: run {len(stored['runs']) - 1} of {runs.name}")
        elif single.exists():
            earlier = json.loads(single.read_text())
            if without_session(earlier) == without_session(record):
                done.append(f"{name}: already {single.name} (a session merged twice): left as it was")
                continue
            stored = {"benchmark": "runs", "of": name, "device_name": block["device_name"],
                      "about": f"every committed run of {name}, oldest first (runs.-1 is the latest); each run is "
                               "the record its benchmark wrote, with the session it ran in",
                      "runs": [earlier, record]}
            runs.write_text(json.dumps(stored, indent=2) + "\n")
            single.unlink()
            done.append(f"{name}: run 1 of {runs.name} (the earlier {name} is run 0: cite it as runs.0)")
        else:
            single.write_text(json.dumps(record, indent=2) + "\n")
            done.append(f"{name}: new")
    logs = [p for p in session.rglob("*") if p.is_file() and p.suffix in (".log", ".txt")]
    for path in logs:
        target = device_dir / ("nvidia_smi.txt" if path.name == "nvidia_smi.txt" else f"logs/{path.name}")
        target.parent.mkdir(exist_ok=True)
        shutil.copy(path, target)
        done.append(f"{path.name}: {target.relative_to(device_dir)}")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("session", type=Path, help="the session's output folder (its JSON files and logs)")
    p.add_argument("device_dir", type=Path, help="the device's folder, e.g. bench/results/gpu_h200")
    p.add_argument("--date", required=True)
    p.add_argument("--tree", required=True, help="the commit of the tree that ran (short hash)")
    p.add_argument("--torch", required=True)
    p.add_argument("--device-name", required=True)
    p.add_argument("--note", required=True, help="what the session says of its tree (uncommitted edits, a stale .git)")
    args = p.parse_args(argv)
    if not args.session.is_dir():
        p.error(f"{args.session} is not a folder")
    for line in merge(args.session, args.device_dir, session_block(args)):
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
