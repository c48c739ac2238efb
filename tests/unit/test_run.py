"""The run boundary (trainers.runtime.run) driven in-process by a toy loop: what every trainer gets
from it — exact resume of states, RNG and position, one save per step, evaluation skipped after a
signal, results merged and written before the evaluation, throughput accounting."""

from __future__ import annotations

import json
import logging
import random
import signal

import numpy as np
import pytest
import torch

from toy_trainer import cfg_for, toy_loop
from trainers.runtime import rng
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.rundir import single_process_context


def test_a_stop_on_a_checkpoint_step_saves_once(tmp_path, monkeypatch):
    saved = []
    real = CheckpointManager.commit
    monkeypatch.setattr(CheckpointManager, "commit", lambda self, step, *a: (saved.append(step), real(self, step, *a)))
    toy_loop(cfg_for(tmp_path, ckpt_every=2, patience=0), total_steps=4)
    assert saved == [2, 3, 4]  # cadence 2 and 4, the evaluation at 3; the stop at 4 is not saved twice


def VALIDATION(step: int) -> float:  # evaluations at the epochs' ends 3, 6, 9, 12: new bests at 3 and 9
    return {3: 1.0, 6: 2.0, 9: 0.5, 12: 3.0}.get(step, 5.0)


@pytest.mark.parametrize("at_eval,extra,expected", [
    ("always", {}, [3, 6, 9, 12]), ("improved", {}, [3, 9, 12]),
    ("held", {}, [9, 12]),  # held: 3's best replaced by 9's before a write
    ("held", {"max_hours": 1.0}, [3, 9, 12]),  # a run's own budget keeps time for saves it measured: it writes each
])
def test_ckpt_at_eval_improved_saves_only_new_bests(tmp_path, monkeypatch, at_eval, extra, expected):
    saved = []
    real = CheckpointManager.commit
    monkeypatch.setattr(CheckpointManager, "commit", lambda self, step, *a: (saved.append(step), real(self, step, *a)))
    results, _ = toy_loop(cfg_for(tmp_path, ckpt_every=1000, patience=0, ckpt_at_eval=at_eval, **extra),
                          total_steps=12, val_metric=VALIDATION)
    assert saved == expected  # 12: the stop's own save (not a new best)
    metas = {int(m.stem[5:]): json.loads(m.read_text())["metric"]
             for m in (tmp_path / "run" / "checkpoints").glob("meta_*.json")}
    assert metas[9] == 0.5 and min(metas, key=lambda s: metas[s] if metas[s] is not None else 9e9) == 9
    assert results["training"]["best_val"]["step"] == 9


@pytest.mark.parametrize("ckpt_async", [False, True])
@pytest.mark.parametrize("ckpt_every, signal_at, expected", [
    (6, None, [3, 6, 9, 12]),  # each step-cadence save writes the best held before it, first
    (1000, 10, [9, 10]),  # a stop (SIGTERM) writes the held best, then the stop's own checkpoint
    (1000, 9, [9]),  # a stop at the held step writes it once, with its metric
])
def test_ckpt_at_eval_held_writes_the_held_best_before_the_next_checkpoint(tmp_path, monkeypatch, ckpt_every,
                                                                           signal_at, expected, ckpt_async):
    """--ckpt-at-eval held: a new best is copied to host memory at its evaluation and written, as its own step's
    checkpoint with its metric, before the next one (in the loop or behind it); the best the run restores is that
    step's, and what a held checkpoint holds is what the run had at its step (a resume from it ends as the run)."""
    saved = []
    real = CheckpointManager.commit
    monkeypatch.setattr(CheckpointManager, "commit", lambda self, step, *a: (saved.append(step), real(self, step, *a)))
    cfg = cfg_for(tmp_path / "held", ckpt_every=ckpt_every, patience=0, ckpt_at_eval="held", ckpt_async=ckpt_async)
    results, _ = toy_loop(cfg, total_steps=12, signal_at=signal_at, val_metric=VALIDATION)
    assert saved == expected
    ckpts = tmp_path / "held" / "run" / "checkpoints"
    metas = {int(m.stem[5:]): json.loads(m.read_text())["metric"] for m in ckpts.glob("meta_*.json")}
    assert metas[9] == 0.5 and CheckpointManager(ckpts, single_process_context(), 3, logging.getLogger()).best_step() == 9
    assert results["training"]["best_val"]["step"] == 9
    # the held step's checkpoint is that step's: resumed from it alone, the run ends as the uninterrupted one
    whole, whole_model = toy_loop(cfg_for(tmp_path / "whole", ckpt_every=1000, patience=0, ckpt_at_eval="always"),
                                  total_steps=12, val_metric=VALIDATION)
    for meta in ckpts.glob("meta_*.json"):
        if meta.name != "meta_00000009.json":
            meta.unlink()
    resumed, model = toy_loop(cfg, total_steps=12, val_metric=VALIDATION)
    torch.testing.assert_close(model.weight, whole_model.weight)
    assert resumed["training"]["steps"] == 12 and resumed["training"]["best_val"] == whole["training"]["best_val"]


class Killed(BaseException):
    """A SIGKILL in-process: nothing after it runs (no stop, no settle)."""


@pytest.mark.parametrize("ckpt_every, every_min", [(3, None), (1000, 1e-9)])
def test_a_best_on_a_step_the_cadence_saves_is_written_there_not_held(tmp_path, monkeypatch, ckpt_every, every_min):
    """--ckpt-at-eval held holds a best only where nothing else saves: at a step the step cadence or the time cadence
    (rank 0's clock, agreed apart from the evaluation's save) checkpoints, the best is written then, and a kill at
    the next step keeps it."""
    import trainers.runtime.run as run_mod

    def kill_at_step_4(rank, step, restart_count):
        if step == 4:
            raise Killed()

    monkeypatch.setattr(run_mod, "maybe_inject", kill_at_step_4)
    with pytest.raises(Killed):
        toy_loop(cfg_for(tmp_path, ckpt_every=ckpt_every, ckpt_every_min=every_min, patience=0, ckpt_at_eval="held"),
                 total_steps=12, val_metric=VALIDATION)
    assert json.loads((tmp_path / "run" / "checkpoints" / "meta_00000003.json").read_text())["metric"] == 1.0


def test_a_best_held_while_a_write_behind_the_loop_runs_leaves_that_writes_copy_alone(tmp_path, monkeypatch):
    """Step 6's checkpoint is written behind the loop (held up here until step 9's best is held): the held copy has
    buffers of its own, so step 6's checkpoint holds step 6's states (a resume from it alone ends as the run)."""
    import threading

    from trainers.runtime.checkpointer import Checkpointer

    best_held, real_write, real_hold = threading.Event(), CheckpointManager.write_local, Checkpointer.hold

    def write_local(self, step, *args):
        if step == 6:
            assert best_held.wait(60)
        return real_write(self, step, *args)

    def hold(self, step, *args, **kwargs):
        stalled = real_hold(self, step, *args, **kwargs)
        if step == 9:  # (3's best was held, and written, before step 6's write began)
            best_held.set()
        return stalled

    monkeypatch.setattr(CheckpointManager, "write_local", write_local)
    monkeypatch.setattr(Checkpointer, "hold", hold)
    cfg = cfg_for(tmp_path / "held", ckpt_every=6, patience=0, ckpt_at_eval="held", ckpt_async=True)
    toy_loop(cfg, total_steps=12, val_metric=VALIDATION)
    _, whole_model = toy_loop(cfg_for(tmp_path / "whole", ckpt_every=1000, patience=0), total_steps=12,
                              val_metric=VALIDATION)
    for meta in (tmp_path / "held" / "run" / "checkpoints").glob("meta_*.json"):
        if meta.name != "meta_00000006.json":
            meta.unlink()
    _, model = toy_loop(cfg, total_steps=12, val_metric=VALIDATION)
    torch.testing.assert_close(model.weight, whole_model.weight)


def test_a_held_best_that_cannot_be_written_as_a_run_diverges_leaves_the_run_diverged(tmp_path, monkeypatch):
    """The divergence at step 5 writes the best held at step 3 (finite); that write failing is logged, and the run
    still ends diverged, not as a failed write (which a retry would meet again, diverging)."""
    import errno

    from trainers.errors import RunEnded

    real_write = CheckpointManager.write_local

    def write_local(self, step, *args):
        if step == 3:
            raise OSError(errno.EIO, "Input/output error")
        return real_write(self, step, *args)

    monkeypatch.setattr(CheckpointManager, "write_local", write_local)
    with pytest.raises(RunEnded) as err:
        toy_loop(cfg_for(tmp_path, ckpt_every=1000, patience=0, ckpt_at_eval="held"), total_steps=12, nan_at=5,
                 val_metric=VALIDATION)
    assert "training diverged" in str(err.value)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["training"]["stop_reason"] == "diverged"
    assert "writing the checkpoint of step 3 failed" in (tmp_path / "run" / "training.log").read_text()


def test_ckpt_at_eval_improved_restores_the_runs_best_whatever_the_cadence_saved(tmp_path, monkeypatch):
    """An evaluation that is not a new best (here by less than --min-delta) is saved by the step cadence
    without its metric: the checkpoint restored as the best is the run's best, not whichever the cadence hit."""
    best = []
    real = CheckpointManager.best_step
    monkeypatch.setattr(CheckpointManager, "best_step", lambda self: (best.append(real(self)), best[-1])[1])
    results, _ = toy_loop(cfg_for(tmp_path, ckpt_every=6, patience=0, ckpt_at_eval="improved", min_delta=0.1),
                          total_steps=12, val_metric={3: 1.0, 6: 0.95, 9: 2.0, 12: 3.0}.get,
                          evaluate=lambda: {"ok": True})
    assert results["training"]["best_val"]["step"] == 3 and best[-1] == 3  # (the cadence saved step 6: 0.95)


def test_ckpt_at_eval_improved_saves_when_any_rank_has_a_new_best(tmp_path, monkeypatch):
    """The save decision rides on the stop agreement: a new best on another rank (here the agreed value
    says so at step 6) makes this rank save at the same step, so every rank enters the save's collectives."""
    import trainers.runtime.stops as stops

    saved, sent, real_commit, real_reduce = [], [], CheckpointManager.commit, stops.all_reduce_max
    monkeypatch.setattr(CheckpointManager, "commit", lambda self, step, *a: (saved.append(step), real_commit(self, step, *a)))
    steps = iter(range(1, 13))

    def another_rank_has_a_best(ctx, values, on_device=None):
        step = next(steps)
        sent.append((step, values[2]))  # [stop, save by time, save an evaluation, ...]: what this rank tells the others
        agreed = real_reduce(ctx, values, on_device=on_device)
        return [*agreed[:2], 1.0, *agreed[3:]] if step == 6 else agreed
    monkeypatch.setattr(stops, "all_reduce_max", another_rank_has_a_best)
    toy_loop(cfg_for(tmp_path, ckpt_every=1000, patience=0, ckpt_at_eval="improved", agree_every=1), total_steps=12,
             val_metric=VALIDATION)
    assert saved == [3, 6, 9, 12]
    assert [step for step, save in sent if save] == [3, 9]  # its own new bests, told to every rank


def test_ckpt_at_eval_improved_resumes_from_the_last_best_to_the_same_run(tmp_path):
    """A kill after an evaluation that saved nothing: the run redoes its steps from the last best, with
    the early-stopping count it had there, and ends as the uninterrupted run does."""
    whole, whole_model = toy_loop(cfg_for(tmp_path / "a", ckpt_every=1000, patience=3, ckpt_at_eval="improved"),
                                  total_steps=12, val_metric=VALIDATION)
    cfg = cfg_for(tmp_path / "b", ckpt_every=1000, patience=3, ckpt_at_eval="improved")
    toy_loop(cfg, total_steps=8, val_metric=VALIDATION)  # saved at 3 (a best) and 8 (its last step), not at 6
    ckpts = tmp_path / "b" / "run" / "checkpoints"
    (ckpts / "meta_00000008.json").unlink()  # killed before step 8's save completed
    assert [m.name for m in ckpts.glob("meta_*.json")] == ["meta_00000003.json"]  # it resumes from step 3
    resumed, model = toy_loop(cfg, total_steps=12, val_metric=VALIDATION)
    torch.testing.assert_close(model.weight, whole_model.weight)
    for key in ("steps", "best_val", "last_val", "stop_reason"):
        assert resumed["training"][key] == whole["training"][key], key


def test_a_resume_from_an_early_stops_checkpoint_trains_no_further(tmp_path):
    """Killed after its early stop was saved (in its final evaluation, its export, or as an LSTM cohort member
    waiting for the others), a run started again finishes where it stopped: it does not train on and find
    a later best that the uninterrupted run never saw (here: step 9's 0.5)."""
    cfg = cfg_for(tmp_path, ckpt_every=1000, patience=1)
    first, model = toy_loop(cfg, total_steps=12, val_metric=VALIDATION)
    assert (first["training"]["stop_reason"], first["training"]["steps"]) == ("early_stop", 6)
    again, model_again = toy_loop(cfg, total_steps=12, val_metric=VALIDATION)
    assert (again["training"]["stop_reason"], again["training"]["steps"]) == ("early_stop", 6)
    assert again["training"]["best_val"] == first["training"]["best_val"]
    torch.testing.assert_close(model_again.weight, model.weight)
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("meta_*.json")) == \
        ["meta_00000003.json", "meta_00000006.json"]
    # a larger --patience on the resume (a resume-safe option) trains on, as asked
    more, _ = toy_loop(cfg_for(tmp_path, ckpt_every=1000, patience=2), total_steps=12, val_metric=VALIDATION)
    assert more["training"]["steps"] == 12 and more["training"]["best_val"]["step"] == 9


def test_resume_restores_states_this_ranks_rng_and_position(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=100, patience=0)
    draws: list = []
    results, model = toy_loop(cfg, total_steps=5, draws=draws)
    assert results["training"]["steps"] == 5
    # A second start from the step-5 checkpoint: model, position and every RNG continue exactly.
    draws2: list = []
    _, model2 = toy_loop(cfg, total_steps=5, draws=draws2)
    assert draws2[0][1:] == draws[-1][1:]  # torch, numpy, python: the draws right after the save
    torch.testing.assert_close(model2.weight, model.weight)
    meta = json.loads((tmp_path / "run" / "checkpoints" / "meta_00000005.json").read_text())
    state = torch.load(tmp_path / "run" / "checkpoints" / "rank000_00000005.pt", weights_only=True)
    assert state["position"] == {"seen": 20} and meta["trainer"] == "toy"


def test_rng_capture_round_trip_and_checkpoint_safe(tmp_path):
    rng.seed_everything(5)
    state = rng.capture(torch.device("cpu"))
    torch.save(state, tmp_path / "s.pt")
    before = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    rng.restore(torch.load(tmp_path / "s.pt", weights_only=True), torch.device("cpu"))
    after = (torch.rand(3), np.random.rand(3), [random.random() for _ in range(3)])
    torch.testing.assert_close(before[0], after[0])
    assert np.array_equal(before[1], after[1]) and before[2] == after[2]
    assert set(state) == {"torch_cpu", "numpy", "python"}  # + torch_cuda on a GPU


def test_a_signal_skips_the_evaluation_and_names_the_command(tmp_path):
    called = []
    results, _ = toy_loop(cfg_for(tmp_path), total_steps=50, signal_at=4, evaluate=lambda: called.append(1) or {})
    assert called == [] and results["training"]["stop_reason"] == "signal" and results["training"]["steps"] == 4
    assert "trainers toy evaluate --run-dir" in results["evaluation"]["skipped"]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored when the run closes


def test_results_are_written_before_the_evaluation_and_merged(tmp_path):
    cfg = cfg_for(tmp_path)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text(json.dumps({"export": {"checkpoint_step": 999}, "mine": 1}))
    seen = {}

    def evaluate():
        seen.update(json.loads((tmp_path / "run" / "results.json").read_text()))
        return {"score": 1.0}

    results, _ = toy_loop(cfg, total_steps=6, evaluate=evaluate,
                          summary={"model": {"parameters": 4}, "training": {"extra": float("nan")}})
    assert seen["training"]["steps"] == 6 and "pending" in seen["evaluation"]  # a kill here loses no training result
    on_disk = json.loads((tmp_path / "run" / "results.json").read_text())
    assert on_disk["evaluation"] == {"score": 1.0} and on_disk["mine"] == 1
    assert "stale" in on_disk["export"]  # trained further since that export
    assert on_disk["training"]["extra"] is None  # NaN never reaches the file
    for key in ("trainer", "config", "model", "training", "evaluation", "run"):
        assert key in on_disk
    best = on_disk["training"]["best_val"]
    assert best["name"] == "val_loss" and best["step"] in (3, 6)


def test_garbage_results_file_is_moved_aside_not_fatal(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "results.json").write_text("[1, 2")
    results, _ = toy_loop(cfg_for(tmp_path), total_steps=2)
    assert results["training"]["steps"] == 2
    assert list((tmp_path / "run").glob("results.json.unreadable-*"))


def test_throughput_windows_count_every_item_and_report_the_breakdown(tmp_path):
    results, _ = toy_loop(cfg_for(tmp_path), total_steps=9)
    tp = results["training"]["throughput"]
    assert tp["items_this_attempt"] == 36 and tp["unit"] == "samples"
    assert tp["steady_steps"] == 8  # the first window (warm-up, compile) is left out
    assert tp["per_s_steady"] > 0 and tp["effective_per_s"] > 0
    assert set(tp["breakdown_s"]) >= {"startup", "first_window", "steady_steps", "evaluation", "checkpoint", "wall"}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if r["kind"] == "train"]
    assert len(train_rows) == 9 and all(r["samples_per_s"] > 0 and "step_time_s" in r for r in train_rows)


@pytest.mark.parametrize("patience,expected", [(1, "early_stop"), (0, "completed")])
def test_early_stopping_is_an_agreed_stop_with_a_checkpoint(tmp_path, patience, expected):
    results, _ = toy_loop(cfg_for(tmp_path, patience=patience), total_steps=200)
    t = results["training"]
    assert t["stop_reason"] == expected
    assert (tmp_path / "run" / "checkpoints" / f"meta_{t['steps']:08d}.json").exists()


def test_checkpoints_by_wall_clock_as_well_as_by_steps(tmp_path, monkeypatch):
    saved = []
    real = CheckpointManager.commit
    monkeypatch.setattr(CheckpointManager, "commit", lambda self, step, *a: (saved.append(step), real(self, step, *a)))
    toy_loop(cfg_for(tmp_path, ckpt_every=1000, patience=0, ckpt_every_min=1e-6), total_steps=5)
    assert saved == [1, 2, 3, 4, 5]


def test_a_budget_keeps_time_for_the_final_save_and_evaluation(tmp_path):
    import time

    budget_s = 3.0

    def final_evaluation():
        time.sleep(0.3)  # as slow as the periodic ones
        return {}

    t0 = time.perf_counter()
    results, _ = toy_loop(cfg_for(tmp_path, patience=0, max_hours=budget_s / 3600), total_steps=10**6,
                          evaluate=final_evaluation, eval_seconds=0.3)
    wall = time.perf_counter() - t0
    assert results["training"]["stop_reason"] == "time_budget"
    assert wall < budget_s + 0.5, f"the run took {wall:.2f} s of a {budget_s} s budget"


def test_agreeing_every_n_steps_stops_at_the_next_agreement_with_a_checkpoint(tmp_path, monkeypatch):
    from trainers.runtime import stops

    calls = []
    real = stops.all_reduce_max
    monkeypatch.setattr(stops, "all_reduce_max",
                        lambda ctx, values, **kw: (calls.append(1), real(ctx, values, **kw))[1])
    results, _ = toy_loop(cfg_for(tmp_path, agree_every=4, patience=0), total_steps=50, signal_at=7)
    t = results["training"]
    # evaluations (every 3rd step here) always agree; so the SIGTERM at step 7 is agreed at step 9
    assert t["stop_reason"] == "signal" and t["steps"] == 9
    assert (tmp_path / "run" / "checkpoints" / "meta_00000009.json").exists()
    assert len(calls) == 4  # steps 1 (the first agrees on N), 3, 6, 9: not one collective per step


def test_adaptive_agreement_is_rare_and_still_stops_within_seconds(tmp_path, monkeypatch):
    import time

    from trainers.runtime import stops

    calls = []
    real = stops.all_reduce_max
    monkeypatch.setattr(stops, "all_reduce_max",
                        lambda ctx, values, **kw: (calls.append(1), real(ctx, values, **kw))[1])
    t0 = time.perf_counter()
    results, _ = toy_loop(cfg_for(tmp_path, agree_every=0, patience=0), total_steps=10**6, signal_at=300,
                          epoch_steps=10**9)
    t = results["training"]
    assert t["stop_reason"] == "signal" and 300 <= t["steps"] <= 300 + 100
    assert len(calls) < t["steps"] / 5  # far fewer collectives (host syncs on a GPU) than steps
    assert time.perf_counter() - t0 < 30


@pytest.mark.parametrize("agree_every,stops_at", [(1, 5), (4, 6)])
def test_a_non_finite_loss_stops_the_run_as_diverged_and_nothing_after_it_is_saved(tmp_path, agree_every, stops_at):
    """A diverged run once ended "completed" with null metrics; now every rank stops at the next
    agreement, the newest checkpoint is the last finite state, and the run ends RunEnded."""
    from trainers.errors import RunEnded

    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0, agree_every=agree_every)
    with pytest.raises(RunEnded) as err:
        toy_loop(cfg, total_steps=50, nan_at=5, epoch_steps=100)
    assert "training diverged" in str(err.value) and "the newest checkpoint (step 4) is the last finite" in str(err.value)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    t = results["training"]
    # every step agrees, or (every 4) the save due at 6 is an agreement: it sees the NaN and is skipped
    assert t["stop_reason"] == "diverged" and t["steps"] == stops_at
    assert "diverged" in results["evaluation"]["skipped"]
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("meta_*")) == \
        ["meta_00000002.json", "meta_00000004.json"]
    state = torch.load(tmp_path / "run" / "checkpoints" / "model_00000004.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state["states"]["model"].values())


def test_a_non_finite_validation_metric_is_a_divergence_too(tmp_path):
    from trainers.errors import RunEnded

    cfg = cfg_for(tmp_path, ckpt_every=100, patience=0, agree_every=50)
    with pytest.raises(RunEnded):
        toy_loop(cfg, total_steps=20, val_nan_at=6, epoch_steps=3)
    t = json.loads((tmp_path / "run" / "results.json").read_text())["training"]
    assert t["stop_reason"] == "diverged" and t["steps"] == 6  # the evaluation at 6 (NaN) is an agreement
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("meta_*")) == ["meta_00000003.json"]


def test_restart_starts_over_on_torchruns_first_attempt_only(tmp_path, monkeypatch):
    """torchrun restarts failed workers with the same arguments: with --restart each restart once set the run's
    progress aside again and began at step 0 (RunOptions.for_attempt)."""
    toy_loop(cfg_for(tmp_path, patience=0), total_steps=4)
    toy_loop(cfg_for(tmp_path, patience=0, restart=True), total_steps=6, signal_at=3)
    asides = sorted(p.name for p in (tmp_path / "run").glob("checkpoints*aside*"))
    assert len(asides) == 1  # the first attempt set the old run aside
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # torchrun's restart of that attempt
    again, _ = toy_loop(cfg_for(tmp_path, patience=0, restart=True), total_steps=6)
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoints*aside*")) == asides  # nothing set aside
    assert again["training"]["steps"] == 6
    assert "resumed from checkpoint step 3" in (tmp_path / "run" / "training.log").read_text()
