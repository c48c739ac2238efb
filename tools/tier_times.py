"""Per-tier wall time of a pytest run, from its JUnit XML: the table .ci/run prints at its end.

    python tools/tier_times.py JUNIT.xml [JUNIT2.xml ...] [--wall-s SECONDS ...] [--json OUT]

A tier is the folder under tests/ a test lives in (unit, e2e, forecast, ...). Each test's time in the
XML is its setup, call and teardown (a module fixture that trains a run counts in the first test that
uses it), so the tiers' sums are the run's wall time less pytest's own start-up and collection, which
the last row shows when the run's wall time is given. No dependencies beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
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
    lines = [f"{name}", f"  {'tier':<10} {'tests':>6} {'failed':>7} {'skipped':>8} {'wall':>10}"]
    for tier, row in sorted(tiers.items(), key=lambda kv: -kv[1]["seconds"]):
        lines.append(f"  {tier:<10} {row['tests']:>6} {row['failed']:>7} {row['skipped']:>8} "
                     f"{row['seconds'] / 60:>7.1f} min")
    total = sum(r["seconds"] for r in tiers.values())
    lines.append(f"  {'all tests':<10} {sum(r['tests'] for r in tiers.values()):>6} "
                 f"{sum(r['failed'] for r in tiers.values()):>7} {sum(r['skipped'] for r in tiers.values()):>8} "
                 f"{total / 60:>7.1f} min")
    if wall_s is not None:
        lines.append(f"  {'pytest':<10} {'':>6} {'':>7} {'':>8} {wall_s / 60:>7.1f} min  (start-up and collection "
                     f"{max(wall_s - total, 0.0):.0f} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("junit", nargs="+", type=Path)
    p.add_argument("--wall-s", type=float, nargs="*", default=[], help="each run's wall time, in the same order")
    p.add_argument("--name", nargs="*", default=[], help="each run's name, in the same order")
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
        out[name] = {"tiers": tiers, "wall_s": wall}
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
