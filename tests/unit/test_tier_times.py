"""tools/tier_times.py: the per-tier table .ci/run prints from pytest's JUnit reports."""

import json
import subprocess
import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import tier_times  # noqa: E402

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.e2e.test_deploy" name="test_a" time="30.0"/>
  <testcase classname="tests.e2e.test_loop_contract" name="test_b[gpt]" time="90.0"><failure message="x"/></testcase>
  <testcase classname="tests.unit.test_inputs" name="test_c" time="6.0"/>
  <testcase classname="tests.unit.test_inputs" name="test_d" time="0.0"><skipped message="no gcol"/></testcase>
</testsuite></testsuites>
"""


def test_each_tier_sums_its_tests_and_counts_failures_and_skips(tmp_path):
    (tmp_path / "main.xml").write_text(JUNIT)
    tiers = tier_times.tier_times(tmp_path / "main.xml")
    assert tiers == {"e2e": {"tests": 2, "seconds": 120.0, "failed": 1, "skipped": 0},
                     "unit": {"tests": 2, "seconds": 6.0, "failed": 0, "skipped": 1}}


def test_the_table_and_json_give_the_wall_time_beside_the_summed_test_time(tmp_path):
    """Under xdist two workers' tests overlap: 126 s of test time in a 63 s run is 2.00, said as such."""
    (tmp_path / "main.xml").write_text(JUNIT)
    out = tmp_path / "tiers.json"
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "tier_times.py"), str(tmp_path / "main.xml"),
                           str(tmp_path / "missing.xml"), "--name", "python -m pytest -q", "narrowed",
                           "--wall-s", "63", "10", "--ci-wall-s", "90", "--json", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "python -m pytest -q" and lines[2].split()[:2] == ["e2e", "2"]  # the slowest tier first
    assert "2.1 min" in lines[4] and "1.1 min" in lines[5] and "test time / wall 2.00" in lines[5]
    assert "missing.xml: no JUnit XML" in proc.stderr  # a pass that never ran is said, not invented
    record = json.loads(out.read_text())
    assert list(record["runs"]) == ["python -m pytest -q"] and record["runs"]["python -m pytest -q"]["wall_s"] == 63
    assert record["runs"]["python -m pytest -q"]["tiers"]["e2e"]["minutes"] == 2.0 and record["ci_wall_min"] == 1.5
    assert "the whole CI run, install included: 1.5 min" in proc.stdout
    assert record["machine"]["cpus_usable"] >= 1 and len(record["git_commit"]) == 40
