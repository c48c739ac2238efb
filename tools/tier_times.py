"""Per-tier time of a pytest run, from its JUnit XML: the table .ci/run prints at its end.

    python tools/tier_times.py JUNIT.xml [JUNIT2.xml ...] [--wall-s SECONDS ...] [--ci-wall-s S] [--json OUT]

A tier is the folder under tests/ a test lives in (unit, e2e, forecast, ...). Each test's time in the
XML is its setup, call and teardown (a module fixture that trains a run counts in the first test that
uses it). Under pytest-xdist the tests of several workers run at once, so the tiers' times add up to
more than the run's wall time (about workers x wall when the workers stay busy): the last row gives the
wall time when it is passed, and the JSON records the machine's CPUs and the commit. No dependencies
beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path


def tier_of(classname: str, file: str | None) -> str:
    path = (file or classname.replace(".", "/")).replace("\\", "/")
    parts = path.split("/")
    if "tests" in parts and parts.index("tests") + 1 < len(parts) - 1:
        return parts[parts.index("tests") + 1]
    return parts[0] if len(parts) > 1 else "tests"


def tier_times(xml_path: Path) -> dict[str, dict]:
    tiers: dict[str, dict] = defaultdict(lambda: {"tests": 0, "seconds": 0.0, "failed": 0, "skipped": 0})
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        row = tiers[tier_of(case.get("classname", ""), case.get("file"))]
        row["tests"] += 1
        row["seconds"] += float(case.get("time") or 0.0)
        row["failed"] += any(child.tag in ("failure", "error") for child in case)
        row["skipped"] += any(child.tag == "skipped" for child in case)
    return dict(tiers)


def table(name: str, tiers: dict[str, dict], wall_s: float | None) -> str:
    lines = [f"{name}", f"  {'tier':<10} {'tests':>6} {'failed':>7} {'skipped':>8} {'test time':>10}"]
    for tier, row in sorted(tiers.items(), key=lambda kv: -kv[1]["seconds"]):
        lines.append(f"  {tier:<10} {row['tests']:>6} {row['failed']:>7} {row['skipped']:>8} "
                     f"{row['seconds'] / 60:>7.1f} min")
    total = sum(r["seconds"] for r in tiers.values())
    lines.append(f"  {'all tests':<10} {sum(r['tests'] for r in tiers.values()):>6} "
                 f"{sum(r['failed'] for r in tiers.values()):>7} {sum(r['skipped'] for r in tiers.values()):>8} "
                 f"{total / 60:>7.1f} min")
    if wall_s is not None:
        lines.append(f"  {'wall':<10} {'':>6} {'':>7} {'':>8} {wall_s / 60:>7.1f} min  (pytest's, start-up and "
                     f"collection included; test time / wall {total / wall_s if wall_s else 0.0:.2f})")
    return "\n".join(lines)


def provenance() -> dict:
    """Where the times were measured: the CPUs this process may use (taskset), the machine's, the commit."""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    except OSError:
        cpu = platform.processor()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    from importlib.metadata import PackageNotFoundError, version

    try:  # the torch the tests ran on, read without importing it
        torch_version = version("torch")
    except PackageNotFoundError:
        torch_version = None
    return {"machine": {"cpu": cpu, "cpus_usable": len(os.sched_getaffinity(0)), "cpus": os.cpu_count(),
                        "python": platform.python_version()},
            "device_name": f"CPU: {cpu} ({len(os.sched_getaffinity(0))} usable)", "versions": {"torch": torch_version},
            "git_commit": commit, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("junit", nargs="+", type=Path)
    p.add_argument("--wall-s", type=float, nargs="*", default=[], help="each run's wall time, in the same order")
    p.add_argument("--name", nargs="*", default=[], help="each run's name, in the same order")
    p.add_argument("--ci-wall-s", type=float, default=None, help="the whole CI run's wall time, install included")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    out = {}
    for i, path in enumerate(args.junit):
        if not path.is_file():
            print(f"{path}: no JUnit XML (the run did not get that far)", file=sys.stderr)
            continue
        name = args.name[i] if i < len(args.name) else path.stem
        wall = args.wall_s[i] if i < len(args.wall_s) else None
        tiers = tier_times(path)
        print(table(name, tiers, wall))
        out[name] = {"tiers": {t: dict(row, minutes=round(row["seconds"] / 60, 2)) for t, row in tiers.items()},
                     "wall_s": wall, "wall_min": None if wall is None else round(wall / 60, 2)}
    ci_min = None if args.ci_wall_s is None else round(args.ci_wall_s / 60, 2)
    if ci_min is not None:
        print(f"the whole CI run, install included: {ci_min:.1f} min")
    if args.json:
        args.json.write_text(json.dumps({"runs": out, "ci_wall_s": args.ci_wall_s, "ci_wall_min": ci_min,
                                         **provenance()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
