"""Checkpoints written behind the loop (--ckpt-async): the loop goes on while a write runs, the
checkpoint only becomes complete (its meta) after every file is on disk, a stop waits for its save,
a kill mid-write resumes from the previous complete checkpoint, and a failed write stops the run in
one line without harming what is on disk."""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

from toy_trainer import cfg_for, toy_loop
from trainers.errors import RunEnded, RunFailed
from trainers.runtime.async_save import BackgroundWrite, HostSnapshot
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.checkpointer import Checkpointer
from trainers.runtime.run import Run, RunSpec


def meta_steps(tmp_path) -> list[int]:
    return sorted(int(p.name[5:13]) for p in (tmp_path / "run" / "checkpoints").glob("meta_*.json"))


def test_the_snapshot_is_a_copy_the_loop_cannot_change():
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "position": {"seen": [1, 2]}, "t": (1, "a")}
    snap = HostSnapshot().take(state)
    before = {k: v.clone() for k, v in snap["model"].items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    state["position"]["seen"].append(3)
    opt.step()
    for k, v in before.items():
        assert torch.equal(snap["model"][k], v)
    assert snap["position"] == {"seen": [1, 2]} and snap["t"] == (1, "a")
    assert snap["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]


def test_writes_behind_the_loop_take_turns_and_a_write_in_the_loop_does_not_wait_for_them():
    """An LSTM cohort's members each write behind the loop, all at an epoch's end: at once, their pickling
    starved the loop's thread of the GIL (bench/gil_convoy.py: a tiny op 11x slower with 4 writers at once, 2x
    with 4 taking turns). Four writes started together run one after another, each completes with its own
    files, its seconds counting its wait for a turn; a write in the loop runs while they wait."""
    running, most, lock = [0], [0], threading.Lock()
    release = threading.Event()

    def write(name: str):
        def run():
            with lock:
                running[0] += 1
                most[0] = max(most[0], running[0])
            assert release.wait(60)  # (a wait lets the GIL go: threads not made to take turns would all be in here)
            with lock:
                running[0] -= 1
            return {name: "sha"}
        return run

    writes = [BackgroundWrite(step, {}, write(f"w{step}")) for step in range(4)]
    in_loop = []
    loop = threading.Thread(target=lambda: in_loop.append(BackgroundWrite(9, {}, lambda: {"loop": "sha"},
                                                                          in_thread=False)), daemon=True)
    try:
        loop.start()
        loop.join(timeout=10)  # while the first write holds its turn: one in the loop that took a turn would hang
        assert not loop.is_alive() and in_loop[0].done() and in_loop[0].files == {"loop": "sha"}
        time.sleep(0.2)
    finally:
        release.set()
    for w in writes:
        w.wait()
    assert most[0] == 1
    assert [w.files for w in writes] == [{f"w{step}": "sha"} for step in range(4)] and all(w.done() for w in writes)
    assert max(w.seconds for w in writes) >= 0.2  # the last in turn waited out the first's 0.2 s


def test_async_and_sync_runs_end_equal_and_every_checkpoint_completes(tmp_path):
    sync, model_sync = toy_loop(cfg_for(tmp_path / "s", ckpt_every=2, patience=0), total_steps=9)
    done, model_async = toy_loop(cfg_for(tmp_path / "a", ckpt_every=2, patience=0, ckpt_async=True), total_steps=9)
    torch.testing.assert_close(model_async.weight, model_sync.weight)
    assert meta_steps(tmp_path / "a") == meta_steps(tmp_path / "s")  # same saves, same pruning
    assert done["training"]["throughput"]["checkpoint_writes_behind_s"] > 0
    assert sync["training"]["throughput"]["checkpoint_writes_behind_s"] == 0
    # the newest is the last step trained, complete and verified
    ckpt = CheckpointManager(tmp_path / "a" / "run" / "checkpoints", _ctx(), 1, _log())
    assert ckpt.complete_steps()[0] == 9 and ckpt.verify(9) is None


def test_the_loop_trains_on_while_a_write_runs_and_the_meta_comes_after_the_files(tmp_path, monkeypatch):
    """The write of step 3 is held until the loop has trained 2 more steps: with a synchronous save
    that would deadlock; here the loop runs, and step 3 becomes complete only once its files are done."""
    release = threading.Event()
    seen_at_write: dict = {}
    real_write = CheckpointManager.write_local

    def slow_write(self, step, shared, rank_state):
        if step == 3:
            assert release.wait(timeout=30), "the loop never got past the save"
            seen_at_write["metas"] = sorted(p.name for p in self.dir.glob("meta_*.json"))
        files = real_write(self, step, shared, rank_state)
        return files

    real_step_done = Run.step_done
    commits: list = []

    def step_done(self, step, position, items=0, loss=None):
        if step == 5:
            release.set()  # steps 4 and 5 ran while step 3 was being written
        if not commits and self.ckpt.manager.meta_path(3).exists():
            commits.append(step)
        return real_step_done(self, step, position, items, loss)

    monkeypatch.setattr(CheckpointManager, "write_local", slow_write)
    monkeypatch.setattr(Run, "step_done", step_done)
    results, _ = toy_loop(cfg_for(tmp_path, ckpt_every=3, patience=0, ckpt_async=True), total_steps=8,
                          epoch_steps=100)
    assert seen_at_write["metas"] == []  # nothing of step 3 (nor later) looked complete while it was written
    assert commits and commits[0] >= 6  # completed at an agreement after the write ended
    assert results["training"]["steps"] == 8 and 8 in meta_steps(tmp_path)


def test_a_stop_waits_for_its_save(tmp_path, monkeypatch):
    real_write = CheckpointManager.write_local

    def slow_write(self, step, shared, rank_state):
        import time

        time.sleep(0.3)
        return real_write(self, step, shared, rank_state)

    monkeypatch.setattr(CheckpointManager, "write_local", slow_write)
    results, _ = toy_loop(cfg_for(tmp_path, ckpt_every=100, patience=0, ckpt_async=True), total_steps=50, signal_at=4)
    assert results["training"]["stop_reason"] == "signal" and meta_steps(tmp_path)[-1] == 4


class Killed(Exception):
    pass


def test_a_kill_while_a_write_is_uncommitted_resumes_from_the_previous_complete_checkpoint(tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0, ckpt_async=True)
    real_commit = Checkpointer._commit

    def dies_before_commit(self):
        if self._pending.step == 4:
            raise Killed  # the files of step 4 are on disk, its meta never is
        return real_commit(self)

    monkeypatch.setattr(Checkpointer, "_commit", dies_before_commit)
    with pytest.raises(Killed):
        toy_loop(cfg, total_steps=8, epoch_steps=100)
    folder = tmp_path / "run" / "checkpoints"
    assert (folder / "model_00000004.pt").exists() and meta_steps(tmp_path) == [2]
    monkeypatch.setattr(Checkpointer, "_commit", real_commit)
    results, model = toy_loop(cfg, total_steps=8, epoch_steps=100)
    assert "resumed from checkpoint step 2" in (tmp_path / "run" / "training.log").read_text()
    _, ref_model = toy_loop(cfg_for(tmp_path / "ref", ckpt_every=2, patience=0), total_steps=8, epoch_steps=100)
    torch.testing.assert_close(model.weight, ref_model.weight)


@pytest.mark.parametrize("ckpt_async", [True, False])
def test_a_full_disk_ends_the_run_as_disk_full_and_keeps_what_is_on_disk(tmp_path, monkeypatch, ckpt_async):
    """Written behind the loop or in it, a full disk is agreed by every rank: the run ends (RunEnded:
    a rerun would end the same way), results.json says disk_full, the checkpoints before it stay."""
    real_write = CheckpointManager.write_local

    def disk_full(self, step, shared, rank_state):
        if step == 4:
            raise OSError(28, "No space left on device")
        return real_write(self, step, shared, rank_state)

    monkeypatch.setattr(CheckpointManager, "write_local", disk_full)
    with pytest.raises(RunEnded) as err:
        toy_loop(cfg_for(tmp_path, ckpt_every=2, patience=0, ckpt_async=ckpt_async), total_steps=8, epoch_steps=100)
    assert "the disk filled up at step" in str(err.value) and "newest complete checkpoint is step 2" in str(err.value)
    log = (tmp_path / "run" / "training.log").read_text()
    assert "checkpoint of step 4 failed" in log and "No space left on device" in log
    assert meta_steps(tmp_path) == [2]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["training"]["stop_reason"] == "disk_full" and "disk filled up" in results["evaluation"]["skipped"]
    ckpt = CheckpointManager(tmp_path / "run" / "checkpoints", _ctx(), 1, _log())
    assert ckpt.verify(2) is None
    # the same command, disk fixed, resumes from step 2
    monkeypatch.setattr(CheckpointManager, "write_local", real_write)
    results, _ = toy_loop(cfg_for(tmp_path, ckpt_every=2, patience=0, ckpt_async=ckpt_async), total_steps=8,
                          epoch_steps=100)
    assert results["training"]["steps"] == 8 and results["training"]["stop_reason"] == "completed"
    assert "resumed from checkpoint step 2" in (tmp_path / "run" / "training.log").read_text()


def test_another_write_failure_stops_the_run_in_one_line_for_a_retry(tmp_path, monkeypatch):
    """Not a full disk (an I/O error, a lost mount): RunFailed on every rank, so torchrun may retry."""
    real_write = CheckpointManager.write_local

    def io_error(self, step, shared, rank_state):
        if step == 4:
            raise OSError(5, "Input/output error")
        return real_write(self, step, shared, rank_state)

    monkeypatch.setattr(CheckpointManager, "write_local", io_error)
    with pytest.raises(RunFailed) as err:
        toy_loop(cfg_for(tmp_path, ckpt_every=2, patience=0, ckpt_async=True), total_steps=8, epoch_steps=100)
    assert "checkpoint of step 4 failed" in str(err.value) and "Input/output error" in str(err.value)
    assert meta_steps(tmp_path) == [2]


def test_async_is_on_by_default_only_with_cuda(tmp_path):
    from trainers.runtime.rundir import single_process_context

    ctx = single_process_context()

    def write_behind(cfg, ctx) -> bool:
        with Run(cfg, ctx, RunSpec("toy", {}, 1)) as run:
            return run.ckpt.write_behind

    assert write_behind(cfg_for(tmp_path), ctx) is False  # CPU: a host copy buys nothing, the write would compete for cores
    assert write_behind(cfg_for(tmp_path, ckpt_async=True), ctx) is True
    ctx_cuda = type(ctx)(**{**ctx.__dict__, "device": torch.device("cuda", 0)})
    manager = CheckpointManager(tmp_path / "c", ctx_cuda, 1, _log())
    assert Checkpointer(manager, ctx_cuda, 1, None, None).write_behind is True
    assert Checkpointer(manager, ctx_cuda, 1, None, False).write_behind is False


def _ctx():
    from trainers.runtime.rundir import single_process_context

    return single_process_context()


def _log():
    import logging

    return logging.getLogger("test")


def test_results_name_the_write_time_hidden_behind_training(tmp_path):
    results, _ = toy_loop(cfg_for(tmp_path, ckpt_every=1, patience=0, ckpt_async=True), total_steps=5)
    t = results["training"]["throughput"]
    assert t["checkpoint_writes_behind_s"] > 0 and t["breakdown_s"]["checkpoint"] >= 0
    assert json.loads((tmp_path / "run" / "results.json").read_text())["training"]["steps"] == 5
