import os
import signal

import pytest

from trainers.errors import UsageError
from trainers.runtime.budget import Budget, StopReason
from trainers.runtime.rundir import single_process_context
from trainers.runtime.stops import EarlyStopping, StopAgreement, heard_stop_signals


@pytest.mark.parametrize("kwargs,match", [({"max_hours": 0}, "--max-hours 0"), ({"max_hours": -1}, "--max-hours -1"),
                                          ({"budget_usd": 0, "usd_per_gpu_hour": 2}, "--budget-usd 0"),
                                          ({"budget_usd": 5}, "needs --usd-per-gpu-hour")])
def test_bad_budgets_are_usage_errors(kwargs, match):
    with pytest.raises(UsageError, match=match):
        Budget(**kwargs)


def test_time_and_money_budgets():
    b = Budget(max_hours=1.0)
    assert b.exceeded(3599) == StopReason.NONE and b.exceeded(3600) == StopReason.TIME_BUDGET
    m = Budget(budget_usd=10.0, usd_per_gpu_hour=2.5, billed_devices=8)  # $20/hour
    assert m.cost_usd(1800) == pytest.approx(10.0)
    assert m.exceeded(1700) == StopReason.NONE and m.exceeded(1800) == StopReason.MONEY_BUDGET


def test_budget_counts_time_of_earlier_attempts():
    s = StopAgreement(single_process_context(), Budget(max_hours=1.0), elapsed_before_s=3600.0)
    assert s.agree()[0] == StopReason.TIME_BUDGET


def test_sigterm_becomes_an_agreed_stop():
    s = StopAgreement(single_process_context(), Budget())
    s.install_signal_handlers()
    try:
        assert s.agree()[0] == StopReason.NONE
        os.kill(os.getpid(), signal.SIGTERM)
        assert s.agree()[0] == StopReason.SIGNAL and s.signal_name == "SIGTERM"
    finally:
        s.restore_signal_handlers()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_strongest_reason_wins():
    s = StopAgreement(single_process_context(), Budget())
    s.request(StopReason.EARLY_STOP)
    s.request(StopReason.SIGNAL)
    s.request(StopReason.EARLY_STOP)
    assert s.agree()[0] == StopReason.SIGNAL


def test_early_stopping_patience():
    e = EarlyStopping(patience=2, min_delta=0.01)
    assert e.update(1.0) and not e.should_stop
    assert not e.update(0.995)  # within min_delta: no improvement
    assert not e.should_stop
    assert not e.update(1.2)
    assert e.should_stop
    assert EarlyStopping(patience=0, bad_evals=99).should_stop is False


@pytest.mark.parametrize("mode,stops", [("stop", True), ("ignore", False)])
def test_a_hangup_stops_a_foreground_job_and_is_ignored_by_a_detached_one(monkeypatch, mode, stops):
    monkeypatch.setenv("TRAINERS_ON_HANGUP", mode)
    before = signal.getsignal(signal.SIGHUP)
    s = StopAgreement(single_process_context(), Budget())
    s.install_signal_handlers()
    try:
        os.kill(os.getpid(), signal.SIGHUP)
        assert (s.agree()[0] == StopReason.SIGNAL) is stops
        assert (s.signal_name == "SIGHUP") is stops
    finally:
        s.restore_signal_handlers()
    assert signal.getsignal(signal.SIGHUP) == before


def test_the_process_has_one_stop_handler_every_listener_hears_and_the_last_to_leave_gives_back():
    """An LSTM job holds the stop signals across its symbols' runs (heard_stop_signals); each run listens while it
    is open. A run that closes takes nothing from the others (a cohort's members once each installed a handler,
    given back out of turn as they closed), and the handler found before the job is back after it."""
    before = signal.getsignal(signal.SIGTERM)
    ctx = single_process_context()
    with heard_stop_signals() as job:
        closed, open_ = StopAgreement(ctx, Budget()), StopAgreement(ctx, Budget())
        closed.install_signal_handlers()
        open_.install_signal_handlers()
        handler = signal.getsignal(signal.SIGTERM)
        closed.restore_signal_handlers()  # a member's run closes first
        assert signal.getsignal(signal.SIGTERM) == handler != before
        os.kill(os.getpid(), signal.SIGTERM)
        assert job.name == "SIGTERM" and open_.agree()[0] == StopReason.SIGNAL and open_.signal_name == "SIGTERM"
        assert closed.agree()[0] == StopReason.NONE  # (it no longer listens)
        open_.restore_signal_handlers()
        open_.restore_signal_handlers()  # (twice: nothing more is let go)
        assert signal.getsignal(signal.SIGTERM) == handler  # the job still holds it
    assert signal.getsignal(signal.SIGTERM) == before
