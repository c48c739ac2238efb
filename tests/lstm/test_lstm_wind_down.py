"""The LSTM job's budget keeps time for its end (trainers.lstm.wind_down): a worker stops the job once its elapsed
time plus twice what its stop would cost (the ends of the symbols it trains, the exports to come, the summary)
plus the exit reaches the budget, and starts no cohort whose start and ends, as measured, would not fit. The
summary says how far past its budget a job ended. The measured costs are made large here (a budget of an hour, ends of 2000 s)
so that each rule decides the job's course without a test racing a clock."""

import io
import json
import logging
import queue
import re

import pytest

from trainers.cli import main
from trainers.lstm import export_behind as behind
from trainers.lstm.summary import markdown
from trainers.lstm.wind_down import WindDown
from trainers.runtime.stops import EXIT_ALLOWANCE_S

TINY = ["--source", "synthetic", "--synthetic-tickers", "5", "--synthetic-days", "600", "--window", "16",
        "--hidden", "8", "--batch-size", "64", "--epochs", "2", "--dropout", "0", "--device", "cpu",
        "--max-hours", "1"]


def job(run_dir, *extra) -> tuple[dict, str]:
    assert main(["lstm", "train", "--run-dir", str(run_dir), *TINY, *extra]) == 0
    return json.loads((run_dir / "results.json").read_text()), (run_dir / "training.log").read_text()


def test_the_reserve_is_twice_the_measured_ends_exports_and_summary_plus_the_exit():
    w = WindDown()
    assert w.reserve_s(training=64) == EXIT_ALLOWANCE_S and not w.measured  # nothing measured: the exit only
    w.ended(1.0, 10)  # ten symbols ended together in 1 s,
    w.ended(3.0, 10)  # ten more in 3 s: 0.2 s a symbol
    w.summary_s, w.to_export = 0.5, 3
    assert w.measured and w.per_symbol_s() == pytest.approx(0.2)
    assert w.reserve_s(training=5, exports_waiting=2, export_s=0.1) == pytest.approx(
        2 * (0.2 * 5 + 0.1 * (2 + 3) + 0.5) + EXIT_ALLOWANCE_S)
    w.training = 7  # by default, the symbols the worker trains now
    assert w.reserve_s() == pytest.approx(2 * (0.2 * 7 + 0.5) + EXIT_ALLOWANCE_S)
    w.exported(9.0)  # exports in the worker: the first two (the job's first graph, its latency; the graph's reuse)
    w.exported(2.0)  # are left out
    assert w.seconds_per_export() == 0.0
    w.exported(0.2)
    w.exported(0.4)
    assert w.seconds_per_export() == pytest.approx(0.3)
    w.exported(1.0)  # the median: a slow one moves it little
    assert w.seconds_per_export() == pytest.approx(0.4)


def test_a_claims_start_is_measured_once_from_the_claim_to_its_first_step():
    w = WindDown()
    assert w.start_s(10) == 0.0
    w.claimed_at = 100.0
    w.started(103.0, 6)  # a cohort of 6 reached its first step 3 s after its claim
    w.started(110.0, 1)  # one of its symbols tried alone after it: not a start of the claim's
    assert w.start_s(10) == pytest.approx(5.0) and w.claimed_at is None


def test_the_exporters_pace_is_its_own_export_times_each_processs_first_two_left_out():
    exports = behind.ExportsBehind(logging.getLogger("test"))
    done = []
    exports.waiting = {f: done.append for f in ("/a", "/b", "/c", "/d")}
    for answer in (("/a", {"export": {}}, 5.0), ("/b", {"export": {}}, 2.5), ("/c", {"export": {}}, 0.2),
                   ("/d", {"export": {}}, 0.4)):
        exports.results.put(answer)
    assert exports.still_exporting() == 0  # four handed over, four answered, none collected yet
    assert exports.collect() == 4 and len(done) == 4
    assert exports.seconds_per_export() == pytest.approx(0.3)
    exports.waiting = {f: done.append for f in ("/f", "/g")}
    exports.results.put(("/f", {"export": {}}, 0.1))
    assert exports.still_exporting() == 1  # its answer in, not collected yet: /f costs the stop nothing more
    # an answer whose time is no finite number >= 0 is still the folder's answer, its time not measured
    answers = queue.Queue()
    lines = [json.dumps({"folder": "/d", "outcome": {}, "seconds": bad}) + "\n"
             for bad in ("x", -1, True, 1e400, 10**400)]
    behind._read_results(io.StringIO("".join(lines) + '{"folder": "/e", "outcome": {}, "seconds": NaN}\n'), answers)
    items = [answers.get_nowait() for _ in range(7)]
    assert items[:6] == [("/d", {}, 0.0)] * 5 + [("/e", {}, 0.0)] and items[6] is behind._GONE


@pytest.mark.parametrize("cohort", [1, 2])
def test_a_stop_keeps_time_for_the_ends_of_the_symbols_it_trains(tmp_path, monkeypatch, cohort):
    """Measured ends of 2000 s a symbol: with an hour's budget, training one symbol (or a cohort of two) keeps
    4,002 s (8,002 s) free, more than the budget: the job stops at its first step, a checkpoint and results left
    for the next run, inside the budget, and says what it kept."""
    monkeypatch.setattr(WindDown, "per_symbol_s", lambda self: 2000.0)
    summary, log = job(tmp_path / "job", "--symbols", "SYN000,SYN001", "--cohort", str(cohort), "--no-export")
    t = summary["training"]
    assert t["stop_reason"] == "time_budget"
    assert t["symbols"] == {"ok": 0, "failed": 0, "stopped": cohort, "pending": 2 - cohort}
    assert summary["symbols"]["SYN000"]["steps"] == 1
    assert t["budget_s"] == 3600.0 and t["over_budget_s"] == 0.0
    assert "stopping the job: time_budget at SYN000 step 1" in log
    kept = float(re.search(r"([0-9.]+) s kept for the end", log).group(1))  # (and twice the summary's time)
    assert 2 * 2000 * cohort + EXIT_ALLOWANCE_S <= kept < 2 * 2000 * cohort + EXIT_ALLOWANCE_S + 5
    assert "Budget 3600.0 s (--max-hours, --budget-usd): not exceeded." in (tmp_path / "job" / "results.md") \
        .read_text()


@pytest.mark.parametrize("cohort", [1, 2])
def test_no_cohort_starts_whose_measured_ends_would_not_fit(tmp_path, monkeypatch, cohort):
    """The first claim trains (nothing is measured before its end); its ends are measured at 2000 s a symbol
    (made so): the next claim's ends would not fit in the hour, so it is not trained at all; its symbols stay
    pending, not stopped after a step."""
    measured = WindDown.ended
    monkeypatch.setattr(WindDown, "ended", lambda self, seconds, symbols=1: measured(self, 2000.0 * symbols, symbols))
    summary, log = job(tmp_path / "job", "--symbols", "SYN000,SYN001,SYN002,SYN003", "--cohort", str(cohort),
                       "--no-export")
    t = summary["training"]
    assert t["stop_reason"] == "time_budget"
    assert t["symbols"] == {"ok": cohort, "failed": 0, "stopped": 0, "pending": 4 - cohort}
    assert f"SYN00{cohort}: claimed" not in log and "kept for the end" in log
    assert not (tmp_path / "job" / "symbols" / f"SYN00{cohort}").exists()


@pytest.mark.parametrize("cohort", [1, 2])
def test_no_claim_starts_whose_start_and_ends_would_not_fit(tmp_path, monkeypatch, cohort):
    """Each claim's start is measured, from the claim to its first step; made 4000 s a symbol here, the second
    claim would not reach a step in the hour: it is not started (a cohort that starts only to stop at its first
    step wastes its start and its ends)."""
    seen, measured = [], WindDown.started

    def started(self, now, symbols):
        if self.claimed_at is not None:
            seen.append((now - self.claimed_at, symbols))
        measured(self, now, symbols)

    monkeypatch.setattr(WindDown, "started", started)
    monkeypatch.setattr(WindDown, "start_s", lambda self, symbols: 4000.0 * symbols if seen else 0.0)
    summary, log = job(tmp_path / "job", "--symbols", "SYN000,SYN001,SYN002,SYN003", "--cohort", str(cohort),
                       "--no-export")
    assert summary["training"]["symbols"] == {"ok": cohort, "failed": 0, "stopped": 0, "pending": 4 - cohort}
    assert len(seen) == 1 and seen[0][0] > 0 and seen[0][1] == cohort  # the first claim's, measured
    assert f"SYN00{cohort}: claimed" not in log


def test_a_cohort_keeps_time_for_the_exports_of_its_members_that_ended_trained(tmp_path, monkeypatch):
    """In a cohort, a member that stops early is exported once the cohort is over: from then on its export is
    part of what a stop costs (made 2000 s here): the members still training stop at their next step."""
    monkeypatch.setattr(WindDown, "seconds_per_export", lambda self: 2000.0)
    summary, log = job(tmp_path / "job", "--symbols", "SYN000,SYN001,SYN002,SYN003", "--cohort", "4",
                       "--epochs", "4", "--eval-every", "1", "--patience", "1")
    rows = summary["symbols"]
    ended = {s for s, r in rows.items() if r["status"] == "ok"}
    assert summary["training"]["stop_reason"] == "time_budget" and ended, rows
    assert all(rows[s]["export"]["sha256"] for s in ended)  # exported as the cohort ended
    assert {r["status"] for s, r in rows.items() if s not in ended} == {"stopped"}
    assert "kept for the end" in log


@pytest.mark.parametrize("cohort", [1, 2])
def test_a_stop_at_the_last_step_keeps_time_for_the_exports_that_would_follow(tmp_path, monkeypatch, cohort):
    """Exports of 4000 s each (made so): at their last step the symbols would end trained and be exported, which
    does not fit in the hour: they stop there instead (stopped, not exported), and the next run ends and exports
    them without training again."""
    monkeypatch.setattr(WindDown, "seconds_per_export", lambda self: 4000.0)
    symbols = ["--symbols", ",".join(f"SYN00{i}" for i in range(cohort)), "--cohort", str(cohort), "--patience", "0"]
    summary, log = job(tmp_path / "job", *symbols)
    rows = summary["symbols"]
    assert summary["training"]["stop_reason"] == "time_budget", rows
    assert all(r["status"] == "stopped" and r["steps"] == r["planned_steps"] and "export" not in r
               for r in rows.values()), rows
    monkeypatch.undo()
    summary, log = job(tmp_path / "job", *symbols)
    assert summary["training"]["stop_reason"] == "completed"
    assert all(r["status"] == "ok" and r["export"]["sha256"] for r in summary["symbols"].values())
    assert "resumed from checkpoint step" in log


@pytest.mark.parametrize("end_s, export_s, export", [(2000.0, 1.0, False), (2000.0, 1.0, True), (0.0, 1000.0, True)],
                         ids=["no exports", "past the budget without them", "they fit at their measured cost"])
def test_no_stop_at_a_step_where_it_would_save_nothing_inside_the_budget(tmp_path, monkeypatch, end_s, export_s,
                                                                         export):
    """Every symbol the worker trains is at its last step, where the reserve says stop: a stop would still pay the
    ends and save only the exports, which are none (--no-export), not what takes the job past its budget (it is
    past it without them: ends made 2000 s each there), or fit at their measured cost (2 x 1000 s, in the hour;
    doubled as a margin they would not): the symbols end trained, the job completed."""
    monkeypatch.setattr(WindDown, "per_symbol_s", lambda self: end_s if self.finishing else 0.0)
    monkeypatch.setattr(WindDown, "seconds_per_export", lambda self: export_s)
    summary, log = job(tmp_path / "job", "--symbols", "SYN000,SYN001", "--cohort", "2", "--patience", "0",
                       *(() if export else ("--no-export",)))
    assert summary["training"]["stop_reason"] == "completed" and summary["training"]["symbols"]["ok"] == 2
    assert "stopping the job" not in log


def test_a_job_that_trained_everything_says_completed_even_past_its_budget(tmp_path):
    """Nothing left to train: no budget stop is made, and none is reported (the summary says how far past the
    budget the job is)."""
    args = ["--symbols", "SYN000", "--cohort", "1", "--no-export"]
    job(tmp_path / "job", *args)
    TINY[TINY.index("--max-hours") + 1] = "1e-9"
    try:
        summary, log = job(tmp_path / "job", *args)
    finally:
        TINY[TINY.index("--max-hours") + 1] = "1"
    t = summary["training"]
    assert t["stop_reason"] == "completed" and t["symbols"]["ok"] == 1 and t["over_budget_s"] > 0
    assert "stopping the job" not in log.split("lstm job: 1 symbols (1 done")[-1]
    assert "its budget is spent already" not in log


def test_a_cohorts_exports_once_made_are_not_kept_for_again(tmp_path, monkeypatch):
    """A cohort's symbols, exported once it is over, are no exports to come for the next claim's check."""
    seen, reserve = [], WindDown.reserve_s

    def recording(self, training=None, *args):
        if training is not None:  # (the claim's check)
            seen.append(self.to_export)
        return reserve(self, training, *args)

    monkeypatch.setattr(WindDown, "reserve_s", recording)
    summary, _ = job(tmp_path / "job", "--symbols", "SYN000,SYN001,SYN002,SYN003", "--cohort", "2", "--patience", "0")
    assert summary["training"]["stop_reason"] == "completed" and summary["training"]["symbols"]["ok"] == 4
    assert seen == [0], seen  # the second claim's (the first is made before any end is measured)


def test_the_summary_says_when_no_symbol_finished_and_how_far_past_its_budget_a_job_ended():
    training = {"stop_reason": "time_budget", "world_size": 1, "devices": 1, "device": "cpu", "device_name": "x",
                "wall_time_s_this_attempt": 0.1, "elapsed_s_all_attempts": 12.0, "restarts": 0, "budget_s": 10.8,
                "over_budget_s": 1.2, "packing": {"symbols_finished_this_attempt": 0, "efficiency": 0.0}}
    text = markdown({"training": training, "symbols": {}, "data": {}})
    assert "Budget 10.8 s (--max-hours, --budget-usd): 1.2 s past it." in text
    assert "No symbol finished in this attempt: no packing figures." in text and "Packing efficiency" not in text
    training.update(budget_s=None, over_budget_s=None, packing={"symbols_finished_this_attempt": 2, "efficiency": 0.5})
    text = markdown({"training": training, "symbols": {}, "data": {}})
    assert "Budget" not in text and "Packing efficiency 0.500" in text
