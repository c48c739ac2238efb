"""docs/measurements.md, made from bench/results/index.json and the JSONs it names.

    python tools/measurements.py            # rewrite docs/measurements.md
    python tools/measurements.py --check    # exit 1 when the page is not what this prints (CI: test_measurements)

Every figure is read from its file and printed at the digits the index gives, with a claim mark naming that one
number, so the page can neither drift from its measurements nor be edited by hand. The machine, versions,
commit and command of each row come from the measured file itself ("not recorded" where it has none)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
INDEX = ROOT / "bench" / "results" / "index.json"
PAGE = ROOT / "docs" / "measurements.md"
NOT_RECORDED = "not recorded"


def leaf(record, key: str):
    node = record
    for part in key.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, bool) or not isinstance(node, (int, float)):
        raise ValueError(f"{key} is not one number: {type(node).__name__}")
    return node


def figure_text(value: float, figure: dict, file: str) -> str:
    scale = figure.get("scale", 1)
    digits = figure["digits"]
    option = f" scale={scale}" if scale != 1 else ""
    unit = figure["unit"]
    joined = "" if unit.startswith("%") else " "
    return (f"{value * scale:,.{digits}f}{joined}{unit}"
            f" <!-- claim: {file}#{figure['key']}{option} -->")


def provenance(record: dict) -> dict:
    """What the measured file says of where it ran: the device's name, torch, the commit and the command."""
    run = record.get("run") if isinstance(record.get("run"), dict) else {}  # a results.json's own record of its run
    versions = record.get("versions") if isinstance(record.get("versions"), dict) else run.get("versions") or {}
    session = record.get("session") if isinstance(record.get("session"), dict) else {}
    device = record.get("device_name") or (record.get("device") if isinstance(record.get("device"), str) else None)
    if device in (None, "auto", "cpu", "cuda", "x86_64"):
        device = session.get("device_name")
    machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
    if device in (None, "auto", "cpu", "cuda", "x86_64"):  # a CPU run names its processor, not a model
        device = (f"CPU ({machine.get('processor') or machine.get('arch')})"
                  if not machine.get("gpu_driver") and (machine.get("processor") or machine.get("arch"))
                  and record.get("device") in ("cpu", "x86_64", None) else None)
    commit = record.get("git_commit") or run.get("git_commit")
    commit = commit if isinstance(commit, str) else None
    tree = None
    if session.get("tree_measured") and (commit or "")[:7] != session["tree_measured"]:
        # the session's own account of its tree, where the device's copy recorded another commit (its note says why)
        tree = f"{session['tree_measured']} (the file records {(commit or 'none')[:7]}: see its session note)"
    return {"device": device, "torch": versions.get("torch") or NOT_RECORDED,
            "commit": tree or (commit[:7] if commit else NOT_RECORDED),
            "dirty": record.get("git_dirty"), "by_hand": "measured_tree_note" in record,
            "date": str(record.get("measured_at") or record.get("date") or run.get("written_at")
                        or session.get("date") or NOT_RECORDED)[:10],
            "command": record.get("command") if isinstance(record.get("command"), str) else NOT_RECORDED}


def render(index: dict) -> str:
    lines = ["# Measurements", "",
             "The latest result of each benchmark on each device, made by `python tools/measurements.py` from",
             "[`bench/results/index.json`](../bench/results/index.json) and the JSON files it names; do not edit it by",
             "hand (a test compares it with the generator's output). Each figure is read from its file. The device,",
             "torch, commit and date are what that file recorded when the benchmark ran; the commands are below the",
             "table. The CPU rows ran on the 2-core, no-GPU development machine (a shared VM: seconds move between",
             "runs). Older results are in git's history. Back to the [README](../README.md).", "",
             "| measured | figures | device | torch | commit | date |", "| --- | --- | --- | --- | --- | --- |"]
    commands = []
    for n, row in enumerate(index["rows"], 1):
        file = row["file"]
        stored = json.loads((ROOT / file).read_text())
        # a benchmark run in several sessions keeps every run in one <name>.runs.json: the row names the run
        record, prefix = (stored["runs"][row["run"]], f"runs.{row['run']}.") if "run" in row else (stored, "")
        facts = provenance(record)
        figures = "; ".join(figure_text(leaf(record, f["key"]), dict(f, key=prefix + f["key"]), file)
                            for f in row["figures"])
        note = f" ({row['note']} <!-- external: {row['note_source']} -->)" if row.get("note_source") else (
            f" ({row['note']})" if row.get("note") else "")
        device = f"`{facts['device']}`" if facts["device"] else f"`{row['device']}` (the index's word: the file names none)"
        commit = facts["commit"] + (" (dirty tree)" if facts["dirty"] else "") + (
            " (set by hand afterwards: the file's measured_tree_note says why)" if facts["by_hand"] else "")
        lines.append(f"| {n}. {row['what']}{note} | {figures} | {device} | {facts['torch']} | {commit} | "
                     f"{facts['date']} |")
        commands.append(f"{n}. [`{file.removeprefix('bench/results/')}`](../{file}): `{facts['command']}`")
    return "\n".join(lines + ["", "## The commands", "", *commands, "", *every_file()])


def every_file() -> list[str]:
    """Every committed result, the index's rows or not: what each records of where it ran (a file of several runs:
    its latest), so no result sits in bench/results unlisted."""
    out = ["## Every result file", "",
           "Each JSON under `bench/results/`, with what it records of its device, torch, commit and date (a",
           "`.runs.json`: its latest run). The trainers' READMEs quote many of them; the table above is the headline",
           "of each benchmark.", "", "| file | benchmark | runs | device | torch | commit | date |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted((ROOT / "bench" / "results").rglob("*.json")):
        rel = path.relative_to(ROOT / "bench" / "results").as_posix()
        if rel == "index.json":
            continue
        stored = json.loads(path.read_text())
        if not isinstance(stored, dict):
            continue
        runs = stored.get("runs") if stored.get("benchmark") == "runs" and isinstance(stored.get("runs"), list) else None
        record = runs[-1] if runs else stored
        facts = provenance(record if isinstance(record, dict) else {})
        benchmark = str(record.get("benchmark") or record.get("trainer") or "") if isinstance(record, dict) else ""
        out.append(f"| [`{rel}`](../bench/results/{rel}) | {benchmark} | {len(runs) if runs else 1} | "
                   f"{facts['device'] or NOT_RECORDED} | {facts['torch']} | {facts['commit']} | {facts['date']} |")
    return out + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the page differs from what is printed")
    args = parser.parse_args(argv)
    page = render(json.loads(INDEX.read_text()))
    if args.check:
        if not PAGE.is_file() or PAGE.read_text() != page:
            print(f"{PAGE} is not what tools/measurements.py makes: run it", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(page)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
