"""The verdict of bench/gpu_session.sh's broken-context step: an LSTM cohort job whose worker met a real kernel
fault on a GPU (TRAINERS_FAULT_RAISE=SYN001@step2:lost: a device-side assert) under torchrun --max-restarts=1.
torchrun's exit status cannot tell (under torchrun failed symbols exit 0), so this reads what the job left:

    python3 bench/lost_context_check.py --run-dir OUT/lstm_lost --log OUT/bench/lstm_lost.log --out check.json

Passes (exit 0) when CUDA's own words were recognised as a broken context (the log has "device-side assert
triggered" and the worker's "CUDA's context is broken", not the CPU's simulated error), every symbol finished
ok with none failed, and SYN001 finished on torchrun's restart 1, on its first try. Writes each check, the
summary's counts and SYN001's done.json as JSON either way; exit 1 on any check failing.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import write_record  # noqa: E402


def read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def checks(run_dir: Path, log: str) -> tuple[dict[str, bool], dict]:
    results = read_json(run_dir / "results.json")
    counts = results.get("training", {}).get("symbols", {})
    done = read_json(run_dir / "symbols" / "SYN001" / "done.json")
    return {
        "cuda_words": "device-side assert triggered" in log,
        "recognised_as_broken_context": "CUDA's context is broken" in log,
        "real_fault_not_simulated": "TRAINERS_FAULT_RAISE asked" not in log,
        "all_ok_none_failed": counts.get("ok") == 4 and counts.get("failed") == 0,
        "restarted_on_first_try": done.get("status") == "ok" and done.get("restart") == 1 and done.get("tries") == 1,
    }, {"counts": counts, "SYN001_done": done}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    log = args.log.read_text(errors="replace") if args.log.is_file() else ""
    verdict, facts = checks(args.run_dir, log)
    passed = all(verdict.values())
    write_record({"benchmark": "lost_context_check", "passed": passed, "checks": verdict, **facts}, str(args.out))
    print(f"lost_context_check: {'passed' if passed else 'FAILED'} {verdict}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
