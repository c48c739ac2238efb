"""The LSTM job settles its config once, at its entry (trainers.lstm.job.resolve, issue 61): the dates pinned, the
saved job's options checked, and from there every write raises (RunOptions.settled). What a symbol's run gets is a
settled copy; a changed copy is a new value."""

import dataclasses
import json

import pytest

from trainers.cli import main
from trainers.errors import UsageError
from trainers.lstm.config import LstmConfig
from trainers.lstm.job import pin_dates, resolve, symbol_config
from trainers.runtime.options import RunOptions

TINY = ["--source", "synthetic", "--synthetic-tickers", "2", "--synthetic-days", "600", "--window", "16",
        "--hidden", "8", "--batch-size", "64", "--epochs", "1", "--no-export"]


def test_a_settled_config_refuses_every_write_and_its_copies_are_settled(tmp_path):
    cfg = LstmConfig(run_dir=str(tmp_path / "job"), source="synthetic")
    settled = resolve(cfg, tmp_path / "job")
    assert settled.is_settled and not cfg.is_settled
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"LstmConfig.epochs = 3: the config was settled"):
        settled.epochs = 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(settled, "start", "2020-01-01")
    cfg.epochs = 3  # (the caller's own object is not the settled one)
    symbol = symbol_config(settled, "SYN000")
    assert symbol.is_settled and symbol.symbols == "SYN000" and settled.symbols != "SYN000"
    with pytest.raises(dataclasses.FrozenInstanceError):
        symbol.seed = 1
    again = settled.replaced(restart=True)
    assert again.is_settled and again.restart and not settled.restart
    later = RunOptions.for_attempt(again, 1)  # (the runtime's: a torchrun restart's options; the LSTM's keeps them)
    assert later.is_settled and not later.restart
    assert json.loads(json.dumps(dataclasses.asdict(settled)))["epochs"] == settled.epochs  # (not a field)


def test_resolve_pins_real_datas_dates_from_the_saved_job_and_refuses_another_config(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "config.json").write_text(json.dumps(dataclasses.asdict(LstmConfig(
        run_dir=str(job), source="cache", start="2001-01-02", end="2002-01-02"))))
    cfg = LstmConfig(run_dir=str(job), source="cache")
    settled = resolve(cfg, job)
    assert (settled.start, settled.end) == ("2001-01-02", "2002-01-02") and cfg.start is None
    first = pin_dates(cfg, None)  # a first run: --years back from today
    assert first.start and first.end and cfg.start is None
    with pytest.raises(UsageError, match="different config"):
        resolve(dataclasses.replace(cfg, hidden=cfg.hidden + 1), job)


def test_the_job_trains_on_settled_configs_only(tmp_path, monkeypatch):
    """Every config the worker and the loop hold is settled: a write anywhere in the job would raise (and fail it)."""
    import trainers.lstm.cohort as cohort_mod
    import trainers.lstm.worker as worker_mod

    seen = []
    worker_init, member_init = worker_mod.Worker.__init__, cohort_mod.Member.__init__

    def worker(self, cfg, *args, **kwargs):
        seen.append(("worker", cfg.is_settled))
        worker_init(self, cfg, *args, **kwargs)

    def member(self, cfg, *args, **kwargs):
        seen.append((cfg.symbols, cfg.is_settled))
        member_init(self, cfg, *args, **kwargs)
    monkeypatch.setattr(worker_mod.Worker, "__init__", worker)
    monkeypatch.setattr(cohort_mod.Member, "__init__", member)
    assert main(["lstm", "train", "--run-dir", str(tmp_path / "job"), *TINY, "--cohort", "2"]) == 0
    assert main(["lstm", "train", "--run-dir", str(tmp_path / "alone"), *TINY, "--cohort", "1"]) == 0
    assert sorted(seen) == sorted([("worker", True)] * 2 + [("SYN000", True), ("SYN001", True)] * 2), seen
