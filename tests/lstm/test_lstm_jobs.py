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


def close_only_csv(path, symbols=("A", "B"), days=700, seed=0):
    """date, ticker, close: what the forecaster accepts, and the LSTM once refused ("lacks column(s)
    open, high, low, volume")."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    dates = pd.bdate_range("2018-01-01", periods=days)
    rows = [pd.DataFrame({"date": dates.strftime("%Y-%m-%d"), "ticker": s,
                          "close": 50 * np.exp(np.cumsum(rng.normal(0, 0.01, days)))}) for s in symbols]
    pd.concat(rows).to_csv(path, index=False)
    return path


def test_a_close_only_file_trains_on_two_workers_and_reports_the_features_left_out(tmp_path):
    csv = close_only_csv(tmp_path / "close_only.csv")
    run_dir = tmp_path / "job"
    run_torchrun(["lstm", "train", "--source", f"file:{csv}", "--symbols", "A,B", "--run-dir", str(run_dir),
                  "--window", "16", "--hidden", "8", "--batch-size", "64", "--epochs", "1"])
    r = json.loads((run_dir / "results.json").read_text())
    assert {s: row["status"] for s, row in r["symbols"].items()} == {"A": "ok", "B": "ok"}
    lacks = {"1d:range_hl": "needs high, low, which the data lacks", "1d:ret_oc": "needs open, which the data lacks",
             "1d:volume_z": "needs volume, which the data lacks", "1w:range_hl": "needs high, low, which the data lacks",
             "1M:range_hl": "needs high, low, which the data lacks"}
    assert r["data"]["features_left_out"] == {"A": lacks, "B": lacks}  # the job's summary
    assert r["data"]["sources"] == {f"file:{csv.resolve()}": 2}  # provenance from the market reader
    assert r["data"]["validation"]["columns_absent"] == ["open", "high", "low", "volume"]
    kept = ["1d:ret", "1d:vol_20", "1w:ret", "1w:gap", "1M:ret", "1M:gap"]
    for s in ("A", "B"):
        one = json.loads((run_dir / "symbols" / s / "results.json").read_text())
        assert one["data"]["features"] == kept and one["data"]["features_left_out"] == lacks  # each symbol's own
        assert one["model"]["n_features"] == len(kept) and one["preprocessing"]["features"] == kept
        assert one["export"]["input"]["shape"] == ["batch", 16, len(kept)]  # the ONNX takes what the model was fed
    assert "Features left out" in (run_dir / "results.md").read_text()
