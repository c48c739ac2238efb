"""Packing: symbols spread over 2 torchrun workers from the c10d queue, a failing symbol retried and
reported while the others finish; a close-only file; one job per job folder (a second job, evaluate
and export are refused while it trains); the summary survives a killed agent or a killed launch.
(A SIGKILLed worker's symbols finished after the restart: the lstm entry of
tests/e2e/test_loop_contract.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import HANG_S, run_cli, run_torchrun, torchrun_cmd, wait_for

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
    assert t["stop_reason"] == "partial" and t["world_size"] == 2 and t["symbols"]["ok"] == 4  # (one failed)
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


def test_a_worker_whose_cuda_context_broke_is_restarted_by_torchrun_and_the_job_completes(tmp_path):
    """Worker 1 meets a kernel fault in its first symbol (sticky: every later device call of that process
    fails): it records no failure, stops the job and exits 1 (worker 0, unharmed, exits 0: torchrun restarts
    the group on worker 1's status alone); the restart (fresh contexts) trains what was left, on first tries."""
    run_dir = tmp_path / "job"
    proc = run_torchrun(["lstm", "train", "--run-dir", str(run_dir), *TINY], extra=["--max-restarts=1"],
                        env={"TRAINERS_FAULT_RAISE": "worker1@step2:lost"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads((run_dir / "results.json").read_text())
    assert {row["status"] for row in r["symbols"].values()} == {"ok"} and r["training"]["restarts"] == 1
    lost = [s for s in r["symbols"] if (run_dir / "symbols" / s / "device_lost.json").exists()]
    assert len(lost) == 1
    marker = json.loads((run_dir / "symbols" / lost[0] / "done.json").read_text())
    assert marker["tries"] == 1 and marker["restart"] == 1
    log = (run_dir / "training.log").read_text()
    assert log.count("CUDA's context is broken") == 1 and "[worker 1 cpu] ERROR this worker's cpu failed" in log
    assert f"with {lost[0]} pending, and torchrun's restart resumes with a fresh context (1 restart left)" in log


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


def quiet_env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRAINERS_FAULT", None)
    return env


def one_line(proc) -> str:
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


def test_a_running_job_holds_its_folder_against_a_second_job_evaluate_and_export(tmp_path):
    """A second `train` into the folder once ran beside the first: it marked the first one's symbol
    failed ("in use by pid ...") and trained the others; evaluate and export wrote into it unlocked."""
    run_dir = tmp_path / "job"
    args = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--epochs", "5000", "--patience", "0",
            "--run-dir", str(run_dir)]
    first = subprocess.Popen([sys.executable, "-m", "trainers", *args], stderr=subprocess.PIPE, text=True,
                             env=quiet_env())
    try:
        wait_for(lambda: any(run_dir.rglob("checkpoints/meta_*.json")), 120, first)
        holder = f"is in use by pid {first.pid} on "
        assert holder in one_line(run_cli(args, timeout=HANG_S))  # refused at once, in one line, exit 2
        check = run_cli(args, env={"TRAINERS_CHECK_ONLY": "1"}, timeout=HANG_S)  # the deploy's check before torchrun
        assert check.returncode == 2 and holder in one_line(check)
        for verb in (["evaluate", "--device", "cpu"], ["export"]):
            proc = run_cli(["lstm", *verb, "--run-dir", str(run_dir)], timeout=HANG_S)
            assert proc.returncode == 2 and holder in one_line(proc), verb
        assert not any(run_dir.glob("symbols/*/done.json"))  # nothing marked failed (or done) by the others
    finally:
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=HANG_S) == 0, first.stderr.read()[-3000:]
    r = json.loads((run_dir / "results.json").read_text())
    assert r["training"]["stop_reason"] == "signal" and r["training"]["symbols"]["failed"] == 0
    assert "in use" not in (run_dir / "training.log").read_text()


def test_killing_torchruns_agent_still_leaves_the_summary_of_what_finished(tmp_path):
    """`kill -9` of the agent: its workers get SIGTERM (PR_SET_PDEATHSIG) but the store it hosted is
    gone; they once died on it and no job results.json was written. Now each checkpoints its symbol
    and rank 0 summarises what is on disk."""
    run_dir = tmp_path / "job"
    # (--ckpt-at-eval always: a checkpoint at each epoch's end shows how far a symbol is, which times the kill)
    agent = subprocess.Popen(torchrun_cmd(["lstm", "train", *TINY, "--synthetic-tickers", "6", "--epochs", "15",
                                           "--patience", "0", "--ckpt-at-eval", "always", "--run-dir", str(run_dir)]),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=quiet_env())
    def last_step(folder) -> int:
        return max((int(m.stem.split("_")[1]) for m in folder.glob("checkpoints/meta_*.json")), default=0)

    def one_done_one_training() -> bool:
        """Killed while a symbol is early in its training, not about to end it: with no early stop every
        symbol runs the same number of steps, so one under half a finished symbol's has many left."""
        folders = [p for p in run_dir.glob("symbols/*") if p.is_dir()]
        finished = [last_step(p) for p in folders if (p / "done.json").exists()]
        return bool(finished) and any(0 < last_step(p) < min(finished) // 2 and not (p / "done.json").exists()
                                      for p in folders)
    wait_for(one_done_one_training, 120, agent)
    agent.kill()
    agent.wait()

    def summarised() -> dict | None:
        try:
            r = json.loads((run_dir / "results.json").read_text())
        except (OSError, ValueError):
            return None
        return r if r["training"]["stop_reason"] == "signal" else None

    deadline = time.monotonic() + 60
    while summarised() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    r = summarised()
    assert r is not None, (run_dir / "training.log").read_text()[-3000:]

    def rows_match_the_folders() -> bool:
        """A worker that finishes a symbol after rank 0 read the folders adds it to the summary itself (rank 0
        cannot wait for it: the store is gone); it once stayed out of the summary."""
        nonlocal r
        r = summarised() or r
        ok = {s for s, row in r["symbols"].items() if row["status"] == "ok"}
        return ok == {p.parent.name for p in run_dir.glob("symbols/*/done.json")} and bool(ok)

    deadline = time.monotonic() + 60
    while not rows_match_the_folders() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert rows_match_the_folders(), (r["symbols"], sorted(run_dir.glob("symbols/*/done.json")))
    time.sleep(1.0)  # let the other worker finish writing its checkpoint before the folders are compared
    rows = r["symbols"]
    stopped = [s for s, row in rows.items() if row["status"] == "stopped"]
    assert r["training"]["symbols"]["failed"] == 0 and stopped  # symbols in training when the agent died
    for s in stopped:  # each stopped with a checkpoint at the step it reached: the next launch resumes it
        steps = json.loads((run_dir / "symbols" / s / "results.json").read_text())["training"]["steps"]
        assert (run_dir / "symbols" / s / "checkpoints" / f"meta_{steps:08d}.json").exists()
    assert "the job's store is gone" in (run_dir / "training.log").read_text()


def test_a_retry_of_a_failed_symbol_stopped_by_a_signal_is_stopped_not_the_old_failure(tmp_path):
    """A new launch tries a failed symbol again; SIGTERM during that retry once left the old failure's record,
    so the summary said failed and the job exited 1 for a run that was only stopped."""
    run_dir = tmp_path / "job"
    args = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--run-dir", str(run_dir)]
    assert run_cli(args, env={"TRAINERS_FAULT_RAISE": "SYN001@step2:always"}).returncode == 1
    stopped = run_cli(args, env={"TRAINERS_FAULT": "sigterm@rank0:step3"})  # the retry of SYN001, stopped
    assert stopped.returncode == 0, stopped.stderr[-2000:]
    r = json.loads((run_dir / "results.json").read_text())
    assert r["symbols"]["SYN001"]["status"] == "stopped" and r["training"]["symbols"]["failed"] == 0
    retrying = json.loads((run_dir / "symbols" / "SYN001" / "done.json").read_text())  # over the old: the mirror
    assert retrying["status"] == "retrying" and "RuntimeError" in retrying["before"]["error"]  # uploads it (kept)
    assert run_cli(args).returncode == 0  # the next launch resumes and finishes it
    assert json.loads((run_dir / "results.json").read_text())["training"]["symbols"]["ok"] == 2


def test_a_launch_killed_outright_still_finds_the_summary_of_what_earlier_ones_finished(tmp_path):
    """A launch SIGKILLed with all its processes writes nothing at its end: what earlier launches
    finished is summarised when a launch starts."""
    run_dir = tmp_path / "job"
    args = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--run-dir", str(run_dir)]
    assert run_cli(args, env={"TRAINERS_FAULT_RAISE": "SYN001@step2:always"}).returncode == 1
    for name in ("results.json", "results.md"):  # as if that launch had been killed before its summary
        (run_dir / name).unlink()
    killed = run_cli(args, env={"TRAINERS_FAULT": "sigkill@rank0:step3"})  # the retry of SYN001, killed outright
    assert killed.returncode == -signal.SIGKILL
    r = json.loads((run_dir / "results.json").read_text())
    assert r["symbols"]["SYN000"]["status"] == "ok" and r["training"]["symbols"]["ok"] == 1
    assert "1 of 2 symbols succeeded" in (run_dir / "results.md").read_text()


def test_a_file_where_a_symbols_folder_belongs_or_a_symbols_folder_as_the_job_is_refused_in_one_line(tmp_path):
    """Before anything is written: a file at a symbol's folder (its run, then the record of its failure, raised in
    the middle of the job: a traceback, exit 1, a stale summary) and a job started inside a symbol's folder of
    another job (it wrote its summary over that symbol's results) are one line each, exit 2."""
    run_dir = tmp_path / "job"
    args = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--run-dir", str(run_dir)]
    assert run_cli(args).returncode == 0
    results = (run_dir / "symbols" / "SYN000" / "results.json").read_bytes()
    nested = run_cli(["lstm", "train", *TINY, "--symbols", "SYN000", "--run-dir", str(run_dir / "symbols" / "SYN000")])
    assert nested.returncode == 2 and "Traceback" not in nested.stderr
    assert "is symbol SYN000's folder in the LSTM job" in nested.stderr.strip().splitlines()[-1]
    assert (run_dir / "symbols" / "SYN000" / "results.json").read_bytes() == results
    assert not (run_dir / "symbols" / "SYN000" / "symbols").exists()
    fresh = tmp_path / "fresh"
    (fresh / "symbols").mkdir(parents=True)
    (fresh / "symbols" / "SYN001").write_text("junk")
    refused = run_cli(["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--run-dir", str(fresh)])
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "is a file where symbol SYN001's folder belongs" in refused.stderr.strip().splitlines()[-1]
    assert sorted(p.name for p in fresh.rglob("*")) == ["SYN001", "symbols"]  # nothing written
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "symbols").write_text("junk")
    refused = run_cli(["lstm", "train", *TINY, "--symbols", "SYN000", "--run-dir", str(tmp_path / "flat")])
    assert refused.returncode == 2 and "is a file where the job's symbols folder belongs" in refused.stderr
    other = tmp_path / "other"  # another trainer's run (no LSTM job summary): a folder named symbols/ in it is free
    (other / "symbols").mkdir(parents=True)
    (other / "config.json").write_text("{}")
    (other / "results.json").write_text('{"training": {}}')
    assert run_cli(["lstm", "train", *TINY, "--symbols", "SYN000", "--run-dir", str(other / "symbols" / "mine")]
                   ).returncode == 0


def test_a_failure_that_cannot_be_recorded_leaves_the_symbol_pending_and_the_job_going_on(tmp_path, monkeypatch):
    """A symbol that fails twice where its failure cannot be written (its folder turned into a file mid-job, a
    read-only folder): one error line, the other symbols finish, the summary is written, and the job's exit says it
    did not succeed (it raised FileExistsError with a traceback, the summary left stale)."""
    import trainers.lstm.worker as worker_mod
    from trainers.cli import main

    real_write = worker_mod.jobqueue.write_marker

    def write_marker(folder, marker):
        if marker["status"] == "failed":
            raise PermissionError(13, "Permission denied", str(folder))
        real_write(folder, marker)

    monkeypatch.setattr(worker_mod.jobqueue, "write_marker", write_marker)
    monkeypatch.setenv("TRAINERS_FAULT_RAISE", "SYN001@step2:always")
    run_dir = tmp_path / "job"
    assert main(["lstm", "train", *TINY, "--symbols", "SYN000,SYN001,SYN002", "--run-dir", str(run_dir)]) == 1
    log = (run_dir / "training.log").read_text()
    assert "SYN001: failed twice" in log and "the failure could not be recorded" in log
    summary = json.loads((run_dir / "results.json").read_text())
    assert summary["training"]["symbols"] == {"ok": 2, "failed": 0, "stopped": 0, "pending": 1}
    assert summary["symbols"]["SYN001"]["status"] == "pending"


def test_a_run_of_a_job_whose_budget_is_spent_already_says_so_and_how_to_go_on(tmp_path):
    """--max-hours counts every run of the job: a run started with it spent stops at once (exit 0, its symbols left
    pending as they were), and says why and what to do (it said only "stopping the job: time_budget")."""
    args = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--max-hours", "1e-9", "--run-dir",
            str(tmp_path / "job")]
    first = run_cli(args)
    assert first.returncode == 0 and "stop reason time_budget" in first.stderr
    again = run_cli(args)
    assert again.returncode == 0
    assert "its budget is spent already" in again.stderr and "raise it to train the 2 symbol(s) left" in again.stderr


def test_a_symbol_finished_after_the_summary_is_added_keeping_the_stop_that_skipped_the_evaluation(tmp_path):
    """What a worker writes when the store is gone (trainers.lstm.worker): the rows read again, under the
    summary's lock, and the stop that skipped the job's evaluation kept."""
    from trainers.lstm.queue import write_marker
    from trainers.lstm.summary import refresh_job_summary

    job_dir = tmp_path / "job"
    for s in ("A", "B", "OLD"):
        (job_dir / "symbols" / s).mkdir(parents=True)
    write_marker(job_dir / "symbols" / "OLD", {"status": "ok", "seconds": 1.0})  # an earlier launch's symbol
    stop = {"reason": "signal", "signal": "SIGTERM"}
    before = {"training": {"stop_reason": "signal", "stopped_by": stop, "symbols": {"ok": 0}},
              "symbols": {s: {"status": "pending", "planned_steps": 7} for s in ("A", "B")}}
    (job_dir / "results.json").write_text(json.dumps(before))
    write_marker(job_dir / "symbols" / "A", {"status": "ok", "seconds": 1.0})  # finished after rank 0 read
    r = refresh_job_summary(job_dir, ["A", "B"], keep_stop=True)
    assert r["symbols"]["A"]["status"] == "ok" and r["symbols"]["B"]["status"] == "pending"
    assert r["symbols"]["OLD"]["status"] == "ok" and "OLD" in r["runs"]  # (the worker's rows once dropped it)
    assert r["training"]["symbols"] == {"ok": 2, "failed": 0, "stopped": 0, "pending": 1}
    assert r["training"]["stop_reason"] == "signal" and "stopped by SIGTERM" in r["evaluation"]["skipped"]
    assert "2 of 3 symbols succeeded" in (job_dir / "results.md").read_text()
    assert "skipped" not in refresh_job_summary(job_dir, ["A", "B"])["evaluation"]  # (after `evaluate`: no stop)


def test_the_mirrors_last_word_in_the_summary_waits_for_a_late_workers_rewrite(tmp_path):
    """--remote: rank 0's mirror merges its state into results.json at the end while a worker left without a
    store may be rewriting it (above); unlocked, the mirror's merge of a stale read could drop that worker's
    symbol. It takes the job's summary lock, as the worker does, and keeps both."""
    import logging
    import threading

    from trainers.lstm.summary import summary_lock
    from trainers.runtime.remote import Mirror
    from trainers.runtime.results import merge_results

    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "results.json").write_text(json.dumps({"symbols": {"A": {"status": "pending"}}}))
    mirror = Mirror(f"file://{tmp_path / 'bucket'}", job_dir, logging.getLogger("test")).start()
    merged = {}
    with summary_lock(job_dir):  # a late worker's rewrite in progress
        finishing = threading.Thread(target=lambda: merged.update(
            mirror.finish(5, None, results_lock=lambda: summary_lock(job_dir))))
        finishing.start()
        finishing.join(timeout=1.0)
        assert finishing.is_alive(), "the mirror rewrote results.json under a worker's rewrite"
        merge_results(job_dir, {"symbols": {"A": {"status": "ok"}}})
    finishing.join(timeout=10)
    on_disk = json.loads((job_dir / "results.json").read_text())
    assert on_disk["symbols"]["A"]["status"] == "ok" and on_disk["remote"]["caught_up"] is True
    assert merged == on_disk


def test_an_lstm_job_hands_the_mirror_its_summary_lock(tmp_path, monkeypatch):
    """The wiring of the test above: the job's own `mirror.finish` merges holding `<job>/.summary.lock`."""
    import contextlib
    import fcntl

    from trainers.cli import main
    from trainers.runtime.remote import Mirror

    job_dir, held, original = tmp_path / "job", [], Mirror.finish

    def finish(self, wait_s, merged, results_lock=contextlib.nullcontext):
        if self.run_dir == job_dir:  # (each symbol's run mirrors its own folder, whose results are its own)
            with results_lock(), open(job_dir / ".summary.lock", "a") as other:  # another open file: flocks conflict
                try:
                    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    held.append(False)
                except BlockingIOError:
                    held.append(True)
        return original(self, wait_s, merged, results_lock)

    monkeypatch.setattr(Mirror, "finish", finish)
    (tmp_path / "volume").mkdir()  # (a mounted volume is there: a missing one is refused)
    args = ["lstm", "train", *TINY[:1], "2", *TINY[2:], "--remote", f"file://{tmp_path / 'volume'}/job"]
    assert main([*args, "--run-dir", str(job_dir)]) == 0
    assert held == [True]


def test_a_launch_on_other_symbols_keeps_the_jobs_earlier_ones_in_its_summary(tmp_path):
    """`--symbols` may change between launches (the job grows): a launch on SYN002 once wrote a summary of SYN002
    alone, and `evaluate` and `export` then refused SYN000 ("not in this job"). Its stop reason and exit code are
    still its own: an earlier symbol that failed is shown, not counted against it."""
    from trainers.cli import main

    run_dir = tmp_path / "job"
    train = ["lstm", "train", *TINY, "--no-export", "--run-dir", str(run_dir)]
    os.environ["TRAINERS_FAULT_RAISE"] = "SYN001@step2:always"
    try:
        assert main([*train, "--symbols", "SYN000,SYN001"]) == 1
    finally:
        del os.environ["TRAINERS_FAULT_RAISE"]
    assert main([*train, "--symbols", "SYN002"]) == 0
    r = json.loads((run_dir / "results.json").read_text())
    assert {s: row["status"] for s, row in r["symbols"].items()} == {"SYN002": "ok", "SYN000": "ok",
                                                                      "SYN001": "failed"}
    assert r["training"]["stop_reason"] == "completed" and r["training"]["symbols_asked"]["ok"] == 1
    assert r["training"]["failed_asked"] == []  # (what the deploy's verdict counts)
    assert r["training"]["symbols"] == {"ok": 2, "failed": 1, "stopped": 0, "pending": 0}
    assert main(["lstm", "export", "--run-dir", str(run_dir), "--symbols", "SYN000"]) == 0
    assert main(["lstm", "evaluate", "--run-dir", str(run_dir), "--symbols", "SYN000"]) == 0


def test_restart_trains_a_finished_job_again_once_and_a_retry_resumes(tmp_path):
    """`--restart` on a finished job once did nothing (every symbol was done). Now every symbol asked for starts
    over (its old marker and checkpoints set aside); a retry after an error resumes that run's checkpoint instead
    of starting over again; and torchrun's restart of the workers (same arguments) starts nothing over."""
    from trainers.cli import main

    run_dir = tmp_path / "job"
    train = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--ckpt-every", "2", "--run-dir", str(run_dir)]
    assert main(train) == 0
    first = json.loads((run_dir / "results.json").read_text())
    os.environ["TORCHELASTIC_RESTART_COUNT"] = "1"  # as in a worker torchrun restarted: --restart was the first's
    try:
        assert main([*train, "--restart"]) == 0
    finally:
        del os.environ["TORCHELASTIC_RESTART_COUNT"]
    assert all(json.loads(p.read_text())["status"] == "ok" for p in run_dir.glob("symbols/*/done.json"))
    assert not list(run_dir.glob("symbols/*/checkpoints*aside*"))
    os.environ["TRAINERS_FAULT_RAISE"] = "SYN001@step3:once"
    try:
        assert main([*train, "--restart"]) == 0
    finally:
        del os.environ["TRAINERS_FAULT_RAISE"]
    for s in ("SYN000", "SYN001"):
        folder = run_dir / "symbols" / s
        assert list(folder.glob("checkpoints*aside*")), sorted(p.name for p in folder.iterdir())
        assert "--restart: starting over from step 0" in (folder / "training.log").read_text()
    assert "SYN001: resumed from checkpoint step 2" in (run_dir / "training.log").read_text()  # try 2, not over
    again = json.loads((run_dir / "results.json").read_text())
    assert again["training"]["symbols"]["ok"] == 2
    assert again["symbols"]["SYN000"]["best_val_loss"] == first["symbols"]["SYN000"]["best_val_loss"]  # (same seed)


def test_a_failed_export_over_an_older_file_is_listed_not_exported(tmp_path):
    """A symbol trained again (--restart) whose new export failed keeps its old model.onnx, marked stale: the row
    once showed that file and said nothing of the failure."""
    from trainers.lstm.queue import write_marker
    from trainers.lstm.summary import not_exported, symbol_row

    folder = tmp_path / "job" / "symbols" / "A"
    folder.mkdir(parents=True)
    (folder / "results.json").write_text(json.dumps({"export": {"path": "model.onnx", "sha256": "0" * 64,
                                                                "parity": {"max_abs_error": 0.0}, "stale": True}}))
    write_marker(folder, {"status": "ok", "export_error": "RuntimeError: boom"})
    row = symbol_row(tmp_path / "job", "A", 5)
    assert row["export"]["stale"] and not_exported({"A": row}) == {"A": "RuntimeError: boom"}


def test_a_failed_symbols_log_file_is_closed(tmp_path):
    """A worker trains hundreds of symbols: a symbol whose run raised kept its training.log open (its handler was
    closed only when the run returned), one file a failure, until the process ran out of them."""
    from trainers.cli import main

    run_dir = tmp_path / "job"
    os.environ["TRAINERS_FAULT_RAISE"] = "SYN001@step2:always"
    try:
        assert main(["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--run-dir", str(run_dir)]) == 1
    finally:
        del os.environ["TRAINERS_FAULT_RAISE"]
    open_files = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")}
    assert not [f for f in open_files if f.startswith(str(run_dir.resolve()))], open_files


def test_a_restart_stopped_early_goes_on_after_a_lost_pod_without_the_old_models(tmp_path):
    """--restart stopped at its first symbol's third step, then the pod lost: a launch without --restart on a
    fresh folder once resumed SYN000 from the remote's old final checkpoint (step 8, the model from before the
    restart) and left SYN001, never reached, with its old model. Every symbol asked for is marked to start over
    as the launch starts, until its done marker; the remote's old checkpoints go as a run restarts."""
    from trainers.cli import main

    run_dir, remote = tmp_path / "job", f"file://{tmp_path / 'remote'}"
    train = ["lstm", "train", *TINY, "--symbols", "SYN000,SYN001", "--ckpt-every", "2", "--run-dir", str(run_dir),
             "--remote", remote]
    assert main(train) == 0
    os.environ["TRAINERS_FAULT"] = "sigterm@rank0:step3"
    try:
        assert main([*train, "--restart"]) == 0
    finally:
        del os.environ["TRAINERS_FAULT"]
    marked = {p.parent.name: json.loads(p.read_text()) for p in run_dir.glob("symbols/*/done.json")}
    assert all(m["status"] == "retrying" and m["restart"] for m in marked.values()) and len(marked) == 2
    on_remote = sorted(p.name for p in (tmp_path / "remote" / "symbols" / "SYN000" / "checkpoints").glob("meta_*"))
    assert on_remote and "meta_00000008.json" not in on_remote, on_remote  # the old run's, gone from there too
    import shutil

    shutil.rmtree(run_dir)  # the pod is gone; the next launch pulls the job from the remote
    assert main(train) == 0
    log = (run_dir / "training.log").read_text()
    assert "resumed from checkpoint step 8" not in log, log[-3000:]
    for s in ("SYN000", "SYN001"):
        assert "--restart: starting over from step 0" in (run_dir / "symbols" / s / "training.log").read_text(), s
        assert json.loads((run_dir / "symbols" / s / "done.json").read_text())["status"] == "ok"


def test_restart_starts_the_jobs_budget_over(tmp_path):
    """--max-hours and --budget-usd count every launch of a job; --restart starts the job over, budget included
    (it once found the old launches' time spent already and trained nothing, exit 0)."""
    from trainers.cli import main

    run_dir = tmp_path / "job"
    train = ["lstm", "train", *TINY, "--symbols", "SYN000", "--run-dir", str(run_dir), "--max-hours", "1"]
    assert main(train) == 0
    results = json.loads((run_dir / "results.json").read_text())
    results["training"]["elapsed_s_all_attempts"] = 10_000.0  # as if earlier launches had spent the hour
    (run_dir / "results.json").write_text(json.dumps(results))
    assert main([*train, "--restart"]) == 0
    after = json.loads((run_dir / "results.json").read_text())["training"]
    assert after["stop_reason"] == "completed" and after["elapsed_s_all_attempts"] < 3600
    assert "--restart: starting over" in (run_dir / "symbols" / "SYN000" / "training.log").read_text()


def test_the_deploys_verdict_counts_the_launchs_own_failures(tmp_path):
    """A launch on other --symbols keeps an earlier launch's failed symbol in the summary: the deploy's verdict
    (trainers/lstm/deploy.sh) once failed every later deploy of the job on it."""
    from pathlib import Path

    script = (Path(__file__).parents[2] / "trainers/lstm/deploy.sh").read_text()
    verdict = script.split("<<'EOF_PY'\n", 1)[1].split("\nEOF_PY", 1)[0]
    rows = {"SYN000": {"status": "ok"}, "SYN001": {"status": "failed"}, "SYN002": {"status": "ok"}}
    for failed_asked, code in (([], 0), (["SYN001"], 1), (None, 1)):  # (None: a summary from before the field)
        training = {} if failed_asked is None else {"failed_asked": failed_asked}
        (tmp_path / "results.json").write_text(json.dumps({"symbols": rows, "training": training}))
        proc = subprocess.run([sys.executable, "-", str(tmp_path / "results.json")], input=verdict, text=True,
                              capture_output=True)
        assert proc.returncode == code, (failed_asked, proc.stdout, proc.stderr)


@pytest.mark.parametrize("failing, reason", [("SYN000,SYN001", "failed"), ("SYN001", "partial")])
def test_a_job_whose_symbols_failed_says_so_in_its_stop_reason(tmp_path, failing, reason):
    """A regression (issue 66): a job whose every symbol failed recorded "stop_reason": "completed" (exit 1, ok 0,
    failed 2). Only failures: "failed"; a mix: "partial"; the exit status is 1 either way."""
    faults = ", ".join(f"{s}@step1:always" for s in failing.split(","))
    proc = run_cli(["lstm", "train", *TINY[:1], "2", *TINY[2:], "--run-dir", str(tmp_path / "job")],
                   env={"TRAINERS_FAULT_RAISE": faults})
    assert proc.returncode == 1, proc.stderr[-2000:]
    t = json.loads((tmp_path / "job" / "results.json").read_text())["training"]
    assert t["stop_reason"] == reason and t["symbols"]["failed"] == len(failing.split(",")), t
