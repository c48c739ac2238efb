"""Packing: symbols spread over 2 torchrun workers from the c10d queue, a failing symbol retried and
reported while the others finish. (A SIGKILLed worker's symbols finished after the restart: the lstm
entry of tests/e2e/test_loop_contract.py.)"""

import json

import pytest

from conftest import run_torchrun

pytestmark = pytest.mark.slow

TINY = ["--synthetic-tickers", "5", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--batch-size", "64",
        "--epochs", "2", "--no-export"]


def test_five_symbols_on_two_workers_with_one_failing_and_one_retried(tmp_path):
    run_dir = tmp_path / "job"
    proc = run_torchrun(["lstm", "train", "--run-dir", str(run_dir), *TINY],
                        env={"TRAINERS_FAULT_RAISE": "SYN001@step2:always,SYN002@step2:once"})
    assert proc.returncode == 0  # under torchrun failures are counted, not an exit code (see train.py)
    r = json.loads((run_dir / "results.json").read_text())
    rows = r["symbols"]
    assert list(rows) == [f"SYN00{i}" for i in range(5)]
    assert {s: row["status"] for s, row in rows.items()} == {"SYN000": "ok", "SYN001": "failed", "SYN002": "ok",
                                                            "SYN003": "ok", "SYN004": "ok"}
    assert rows["SYN001"]["tries"] == 2 and "asked SYN001 to fail at step 2 (try 2)" in rows["SYN001"]["error"]
    assert rows["SYN002"]["tries"] == 2 and rows["SYN002"]["steps"] == rows["SYN002"]["planned_steps"]
    assert {row["worker"] for row in rows.values()} == {0, 1}  # both workers took symbols from the queue
    t = r["training"]
    assert t["stop_reason"] == "completed" and t["world_size"] == 2 and t["symbols"]["ok"] == 4
    assert t["steps"] == sum(row["steps"] for row in rows.values() if row["status"] == "ok") > 0
    p = t["packing"]
    assert p["symbols_finished_this_attempt"] == 5 and 0 < p["efficiency"] <= 1.05
    assert p["sum_symbol_seconds"] == pytest.approx(sum(row["seconds"] for row in rows.values()))
    for s, row in rows.items():
        if row["status"] == "ok":  # every finished symbol has its own complete run folder and metrics
            one = json.loads((run_dir / "symbols" / s / "results.json").read_text())
            assert one["config"]["symbols"] == s and one["training"]["world_size"] == 1
            assert {"val", "test"} <= set(one["evaluation"]) and row["test"]["verdict"]
    md = (run_dir / "results.md").read_text()
    assert "4 of 5 symbols succeeded, 1 failed" in md and "Packing efficiency" in md
    assert "| SYN003 | ok |" in md and "SYN001: RuntimeError" in md
    log = (run_dir / "training.log").read_text()
    assert "[worker 0 cpu]" in log and "[worker 1 cpu]" in log and "SYN002: try 1 failed" in log
