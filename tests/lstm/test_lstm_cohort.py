"""Cohorts (`--cohort`, trainers.lstm.cohort): K symbols trained at once as one stacked model, each still
its own run. The stacked pieces equal the per-model ones; a cohort job equals the one-at-a-time job
(dropout 0: nn.LSTM's own masks come from the global stream); with dropout a symbol's training does
not depend on which symbols share its cohort; a symbol stopped in a cohort resumes alone or in another
cohort; a symbol that raises is tried again alone while the others finish."""

import contextlib
import json
import os
import signal
from collections import Counter

import pytest
import torch

from fake_accelerator import FakeAccelerator
from trainers.cli import main
from trainers.lstm.model import DirectionLSTM
from trainers.lstm.stacked import StackedAdamW, StackedLSTM, adamw_param_groups, clip_per_model

TINY = ["--source", "synthetic", "--synthetic-tickers", "5", "--synthetic-days", "600", "--window", "16",
        "--hidden", "8", "--batch-size", "64", "--epochs", "4", "--eval-every", "1", "--patience", "1", "--no-export"]


def models(k: int, features: int = 5, hidden: int = 8, layers: int = 2, dropout: float = 0.0) -> list[DirectionLSTM]:
    out = []
    for seed in range(k):
        torch.manual_seed(seed)
        out.append(DirectionLSTM(features, hidden, layers, dropout))
    return out


def test_the_stack_computes_what_each_model_computes_also_for_a_subset_of_rows():
    ms = models(4)
    stack = StackedLSTM.of(ms)
    x = torch.randn(4, 7, 12, 5)
    with torch.no_grad():
        want = torch.stack([m.eval()(x[k]) for k, m in enumerate(ms)])
        assert torch.allclose(stack.eval()(x), want, atol=1e-5)
        rows = torch.tensor([3, 1])
        assert torch.allclose(stack(x[rows], rows=rows), want[rows], atol=1e-5)
    assert all(torch.equal(a, b) for a, b in zip(stack.model(2).state_dict().values(), ms[2].state_dict().values()))


def test_the_stacks_backward_does_not_grow_with_the_square_of_the_window():
    """Each time step reads its slice of the input gates through one unbind: the backward stacks the T
    slices' gradients once. A slice per step (gates_in[:, :, t]) gives each a backward that fills a
    gradient of the whole [K, B, T, 4H] tensor: T^2 memory traffic, 33 s against 1.3 s for a stack of 8
    of the default model on 2 CPU cores, and the H100's cohorts no faster than one symbol at a time."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    def backward_ops(window: int) -> list[str]:
        stack = StackedLSTM.of(models(3))
        loss = stack(torch.randn(3, 4, window, 5)).sum()
        with Ops() as ops:
            loss.backward()
        return ops.names

    short, long = backward_ops(8), backward_ops(16)
    # no whole-tensor gradient per time step (one select remains: the last step's output, read by the head)
    assert long.count("select_backward") == short.count("select_backward") <= 1
    assert long.count("stack") == short.count("stack")  # one stack of the gates' slices per layer, any window


def test_stacked_adamw_and_per_model_clipping_are_adamw_and_clip_grad_norm_per_model():
    """Twelve steps of each model alone (AdamW, clip_grad_norm_) against the stack; model 1 leaves after
    step 4 and stays exactly as it was, moments too, while the others go on; at step 8 model 3 leaves
    too and the stack shrinks to models 0 and 2 (the cohort's shrink), which train on."""
    ms, lr, clip = models(4), 3e-3, 0.05
    stack = StackedLSTM.of(ms)
    opt = StackedAdamW(list(stack.parameters()), lr, 0.01)
    alone = [torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=0.01) for m in ms]
    torch.manual_seed(7)
    rows = [0, 1, 2, 3]  # which model sits in each row of the stack
    for step in range(12):
        if step == 8:
            keep = torch.tensor([0, 2])
            stack.keep(keep)
            opt.keep(keep, list(stack.parameters()))
            rows = [0, 2]
        x, y = torch.randn(len(rows), 16, 6, 5), torch.randint(0, 2, (len(rows), 16)).float()
        active = torch.tensor([k != 3 and (k != 1 or step < 4) for k in rows])
        for r, k in enumerate(rows):
            if active[r]:
                alone[k].zero_grad()
                torch.nn.functional.binary_cross_entropy_with_logits(ms[k].train()(x[r]), y[r]).backward()
                torch.nn.utils.clip_grad_norm_(ms[k].parameters(), clip)
                alone[k].step()
        opt.zero_grad()
        losses = torch.nn.functional.binary_cross_entropy_with_logits(stack.train()(x), y, reduction="none").mean(1)
        losses.sum().backward()
        clip_per_model(list(stack.parameters()), clip, active)
        opt.step(active)
        if step == 4:
            frozen = {n: t.clone() for n, t in stack.model_state(1).items()}
        if step == 7:
            assert all(torch.equal(frozen[n], t) for n, t in stack.model_state(1).items())
    assert stack.k == 2
    for r, k in enumerate(rows):
        for name, t in stack.model_state(r).items():
            assert torch.allclose(t, ms[k].state_dict()[name], atol=2e-5), (k, name)
    # a model's optimizer state is AdamW's own: loaded into torch's AdamW, the next step is the same
    saved = opt.model_state(1, adamw_param_groups(ms[2], lr, 0.01))
    assert float(saved["state"][0]["step"]) == 12
    again = DirectionLSTM(5, 8, 2, 0.0)
    again.load_state_dict(stack.model_state(1))
    theirs = torch.optim.AdamW(again.parameters(), lr=lr, weight_decay=0.01)
    theirs.load_state_dict(saved)
    assert torch.equal(theirs.state_dict()["state"][3]["exp_avg"], alone[2].state_dict()["state"][3]["exp_avg"]) or \
        torch.allclose(theirs.state_dict()["state"][3]["exp_avg"], alone[2].state_dict()["state"][3]["exp_avg"],
                       atol=1e-6)
    x, y = torch.randn(16, 6, 5), torch.randint(0, 2, (16,)).float()
    for model, optimizer in ((again, theirs), (ms[2], alone[2])):
        optimizer.zero_grad()
        torch.nn.functional.binary_cross_entropy_with_logits(model.train()(x), y).backward()
        optimizer.step()
    # each parameter's own step count (one tensor shared by all would have counted a step per parameter)
    assert {float(s["step"]) for s in theirs.state_dict()["state"].values()} == {13.0}
    assert all(torch.allclose(a, b, atol=2e-5) for a, b in zip(again.parameters(), ms[2].parameters()))


def test_a_models_dropout_masks_do_not_depend_on_its_neighbours():
    gen = torch.Generator()
    alone = StackedLSTM.of(models(1, dropout=0.3)).dropout_masks([11], [5], 4, 6, gen)
    shared = StackedLSTM.of(models(3, dropout=0.3)).dropout_masks([2, 11, 3], [9, 5, 0], 4, 6, gen)
    assert set(alone) == {"layer0", "head"}
    for name in alone:
        assert torch.equal(alone[name][0], shared[name][1])
        assert not torch.equal(shared[name][0], shared[name][1])
    later = StackedLSTM.of(models(1, dropout=0.3)).dropout_masks([11], [6], 4, 6, gen)
    assert not torch.equal(later["head"], alone["head"])  # a new step draws new masks


# What the worker does after a fault (exit codes, markers, who is tried alone): the same kernels whatever the CPU's
# SIMD, so these leave the narrowed-SIMD second pass of .ci/run (its marker expression skips `slow`)
FAULT_PATH = pytest.mark.slow


def train(run_dir, *extra, env: dict | None = None) -> int:
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return main(["lstm", "train", "--run-dir", str(run_dir), *TINY, *extra])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def symbol_results(run_dir) -> dict[str, dict]:
    return {d.name: json.loads((d / "results.json").read_text()) for d in sorted((run_dir / "symbols").iterdir())
            if (d / "results.json").exists()}


def assert_same_training(a: dict, b: dict, tol: float = 1e-4) -> None:
    """The same steps, stop, best step and values (to `tol`) and the same test figures."""
    ta, tb = a["training"], b["training"]
    assert (ta["steps"], ta["stop_reason"], ta["best_val"]["step"]) == (tb["steps"], tb["stop_reason"],
                                                                         tb["best_val"]["step"])
    assert ta["best_val"]["value"] == pytest.approx(tb["best_val"]["value"], abs=tol)
    for split in ("val", "test"):
        ea, eb = a["evaluation"][split]["model"], b["evaluation"][split]["model"]
        for key in ("log_loss", "accuracy", "roc_auc", "brier"):
            assert ea[key] == pytest.approx(eb[key], abs=tol), (split, key)


def ending_cohort(tmp_path, stacked: bool, bests: list):
    """A cohort of 4 members ending at one step, their runs stand-ins: member k's restore_best returns
    bests[k] (an exception: raises it); the last one was stopped by a signal. Returns the cohort, its
    members and the list of what was restored, in order."""
    from types import SimpleNamespace

    from trainers.lstm.cohort import Cohort, Member
    from trainers.lstm.config import LstmConfig
    from trainers.lstm.features import build_symbol_data
    from trainers.lstm.job import prepare_job, symbol_config
    from trainers.runtime.budget import StopReason

    cfg = LstmConfig(synthetic_tickers=4, synthetic_days=700, window=16, hidden=8, layers=2, dropout=0.0)
    plan = prepare_job(cfg, log=lambda _msg: None)
    members = [Member(symbol_config(cfg, s), build_symbol_data(plan.bars[s], cfg, plan.timeframes), 10)
               for s in plan.symbols]
    cohort = Cohort(members, cfg, torch.device("cpu"))
    assert cohort.stacked_evaluation is False  # a CPU's default
    cohort.stacked_evaluation = stacked
    restored = []

    def run(reason, best):
        def restore_best():
            restored.append(best)
            if isinstance(best, Exception):
                raise best
            return best
        return SimpleNamespace(reason=reason, run_dir=tmp_path, restore_best=restore_best)

    reasons = [StopReason.COMPLETED, StopReason.COMPLETED, StopReason.EARLY_STOP, StopReason.SIGNAL]
    for m, reason, best in zip(members, reasons, bests):
        m.run = run(reason, best)
    return cfg, cohort, members, restored


def assert_evaluated_alone(got: dict, cohort, k: int, data, cost_bps: float) -> None:
    """`got` is what evaluating row k's own DirectionLSTM alone gives."""
    from trainers.lstm.evaluate import evaluate_symbol

    want = evaluate_symbol(cohort.model.model(k), data, 64, cost_bps, 4)
    for split in ("val", "test"):
        for key in ("log_loss", "accuracy", "roc_auc", "brier"):
            assert got[split]["model"][key] == pytest.approx(want[split]["model"][key], abs=1e-6), (k, split, key)
        assert got[split]["baselines"] == want[split]["baselines"]
        assert got[split]["strategy"]["long_flat"]["total_return"] == \
            pytest.approx(want[split]["strategy"]["long_flat"]["total_return"], abs=1e-9)


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "one-by-one"])
def test_members_ending_together_are_evaluated_together_each_with_its_own_outcome(tmp_path, stacked):
    """The final evaluation of members that end at one step runs their models together (on an accelerator;
    on a CPU one after another): each member's figures equal evaluating its own DirectionLSTM alone (rows 0
    and 2: not the first rows in order); a member whose best checkpoint cannot be restored gets its own
    error, the others their figures; one stopped by a signal is not restored."""
    from trainers.lstm.cohort import FinalEvaluations, validation_losses
    from trainers.lstm.evaluate import validation_loss

    broken = OSError("best checkpoint unreadable")
    cfg, cohort, members, restored = ending_cohort(tmp_path, stacked, [7, broken, 5, 9])
    evaluations = FinalEvaluations(cohort, members, 64, cfg.cost_bps, 4)
    for k, best in ((0, 7), (2, 5)):
        got = evaluations.of(members[k])
        assert got["checkpoint_step"] == best
        assert_evaluated_alone(got, cohort, k, members[k].data, cfg.cost_bps)
    with pytest.raises(OSError, match="unreadable"):
        evaluations.of(members[1])
    assert restored == [7, broken, 5]  # the signalled member's checkpoint was left alone
    want = [validation_loss(cohort.model.model(k), m.data, 64) for k, m in enumerate(members)]
    assert validation_losses(cohort, members, 64) == pytest.approx(want, abs=1e-6)


def test_a_failed_stacked_evaluation_is_made_member_by_member_each_error_its_own(tmp_path, monkeypatch, caplog):
    """The stacked pass fails (as out of memory would): the members are evaluated one by one, each to its
    own figures, and a member whose own data then fails is the only one that fails."""
    import logging

    import trainers.lstm.cohort as cohort_mod

    def out_of_memory(*_args):
        raise RuntimeError("CUDA out of memory (as it would say)")

    monkeypatch.setattr(cohort_mod, "evaluation_logits", out_of_memory)
    cfg, cohort, members, _restored = ending_cohort(tmp_path, True, [7, 6, 5, 9])

    def unreadable(_anchors):
        raise ValueError("this member's windows are broken")

    members[1].data.gather = unreadable  # one member's own error, in the one-by-one pass
    evaluations = cohort_mod.FinalEvaluations(cohort, members, 64, cfg.cost_bps, 4, logging.getLogger("cohort-test"))
    with caplog.at_level(logging.WARNING, logger="cohort-test"):
        for k in (0, 2):
            assert_evaluated_alone(evaluations.of(members[k]), cohort, k, members[k].data, cfg.cost_bps)
    assert "cohort members together failed (RuntimeError: CUDA out of memory" in caplog.text
    with pytest.raises(ValueError, match="windows are broken"):
        evaluations.of(members[1])


ALL_TRAINING = [True] * 5


def a_batch(active: list[bool]):
    """One step's batch for 5 models (x, labels, row weights, class weights); a finished model's rows weigh 0."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 16, 6, 5, generator=gen)
    labels = torch.randint(0, 2, (5, 16), generator=gen).float()
    weights = (torch.rand(5, 16, generator=gen) > 0.2).float() * torch.tensor(active).float()[:, None]
    return x, labels, weights, torch.rand(5, generator=gen) + 0.5


def stacked_step_of(rows_per_pass: int | None, active: list[bool] = ALL_TRAINING):
    """A stack of 5 models with dropout, one batch: (the step's cohort, its losses, its gradients)."""
    from types import SimpleNamespace

    from trainers.lstm.cohort import EVALUATION, STEP, stacked_step

    stack = StackedLSTM.of(models(5, dropout=0.3)).train()
    cohort = SimpleNamespace(model=stack, optimizer=StackedAdamW(list(stack.parameters()), 1e-3, 0.0),
                             rows_per_pass={STEP: rows_per_pass, EVALUATION: None}, members=list(range(5)), log=None)
    losses = stacked_step(cohort, *a_batch(active)[:3], masks_of(stack), a_batch(active)[3], active)
    return cohort, losses, [p.grad.clone() for p in stack.parameters()]


def masks_of(stack):
    """The dropout masks of a slice of the 5 models of `stack` (each model's own stream)."""
    seeds, steps = [11, 12, 13, 14, 15], [0, 3, 1, 4, 2]
    return lambda rows: stack.dropout_masks(seeds[rows], steps[rows], 16, 6, torch.Generator())


@pytest.mark.parametrize("rows_per_pass", [1, 2, 3])
@pytest.mark.parametrize("active", [ALL_TRAINING, [True, False, False, True, False]], ids=["all", "some-finished"])
def test_a_step_in_passes_gives_each_model_the_loss_and_gradients_of_one_pass(rows_per_pass, active):
    """A cohort too large for the device's memory in one pass trains in passes of fewer models: each model's
    loss and gradients (its own masks, weights and class weight) are what the one pass gives it; a pass of
    finished models only (their rows weigh nothing) is skipped, their gradients 0 as in the one pass."""
    _, want_losses, want_grads = stacked_step_of(None, active)
    _, losses, grads = stacked_step_of(rows_per_pass, active)
    on = torch.tensor(active)
    assert torch.allclose(losses[on], want_losses[on], atol=1e-6, rtol=0)
    for got, want in zip(grads, want_grads):
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
        assert not got[~on].any()


def test_a_pass_out_of_memory_is_made_again_in_halves_from_clean_gradients(monkeypatch):
    """Out of memory in the second pass of a step (the first pass's gradients already added): the step is made
    again in passes of half as many models, from zeroed gradients, to the one pass's numbers; the warning says
    so once. A single model that does not fit raises."""
    import logging

    from trainers.lstm.cohort import EVALUATION, STEP, halving_on_out_of_memory, stacked_step

    cohort, want_losses, want_grads = stacked_step_of(None)
    cohort.rows_per_pass[STEP], cohort.log = 2, logging.getLogger("halving-test")
    stack, forward, calls = cohort.model, type(cohort.model).forward, []

    def second_pass_runs_out(self, x, masks=None, rows=None):
        calls.append(len(x))
        assert all(len(m) == len(x) for m in masks.values())  # each pass draws its own models' masks only
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(self, x, masks, rows)

    monkeypatch.setattr(type(stack), "forward", second_pass_runs_out)
    x, labels, weights, pos_weight = a_batch(ALL_TRAINING)
    warnings = []
    monkeypatch.setattr(cohort.log, "warning", lambda msg, *args: warnings.append(msg % args))

    def step():
        return stacked_step(cohort, x, labels, weights, masks_of(stack), pos_weight, ALL_TRAINING)
    losses = halving_on_out_of_memory(cohort, STEP, "training step", 5, step)
    assert calls == [2, 2, 1, 1, 1, 1, 1] and cohort.rows_per_pass == {STEP: 1, EVALUATION: None}
    assert torch.allclose(losses, want_losses, atol=1e-6, rtol=0)
    for p, want in zip(stack.parameters(), want_grads):
        assert torch.allclose(p.grad, want, atol=1e-6, rtol=0)
    assert len(warnings) == 1 and "training step with 2 models in one pass ran out of device memory (CUDA out of " \
        "memory. Tried to allocate 2.00 GiB); making it in passes of 1 model (equal to rounding" in warnings[0]
    monkeypatch.setattr(type(stack), "forward", lambda *_a, **_k: (_ for _ in ()).throw(torch.OutOfMemoryError("x")))
    with pytest.raises(torch.OutOfMemoryError):
        halving_on_out_of_memory(cohort, STEP, "training step", 5, step)
    # cuBLAS's words for the same condition are the same condition; another error is not halved over
    monkeypatch.setattr(type(stack), "forward", lambda *_a, **_k: (_ for _ in ()).throw(
        RuntimeError("CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`")))
    cohort.rows_per_pass[STEP] = None
    with pytest.raises(RuntimeError, match="CUBLAS_STATUS_ALLOC_FAILED"):
        halving_on_out_of_memory(cohort, STEP, "training step", 5, step)
    assert cohort.rows_per_pass[STEP] == 1 and len(warnings) == 4
    monkeypatch.setattr(type(stack), "forward", lambda *_a, **_k: (_ for _ in ()).throw(RuntimeError("a bug")))
    cohort.rows_per_pass[STEP] = None
    with pytest.raises(RuntimeError, match="a bug"):
        halving_on_out_of_memory(cohort, STEP, "training step", 5, step)
    assert cohort.rows_per_pass[STEP] is None and len(warnings) == 4


def test_an_evaluation_out_of_memory_halves_the_evaluations_passes_not_the_training_steps(tmp_path, monkeypatch):
    """Evaluations (no gradients, --eval-batch-size) and training steps need different memory: a validation
    that runs out halves the evaluations' passes only, to the values of one pass."""
    from trainers.lstm.cohort import EVALUATION, STEP, validation_losses

    _cfg, cohort, members, _restored = ending_cohort(tmp_path, True, [7, 6, 5, 9])
    want = validation_losses(cohort, members, 64)
    monkeypatch.setenv("TRAINERS_FAULT_MEMORY", "1")
    assert validation_losses(cohort, members, 64) == pytest.approx(want, abs=1e-6)
    assert cohort.rows_per_pass == {STEP: None, EVALUATION: 1}


def test_a_cohort_out_of_device_memory_trains_in_passes_to_the_same_results(tmp_path):
    """TRAINERS_FAULT_MEMORY=1: no pass of 2 or more models fits. The first cohort of 3 halves twice (two
    warnings) and trains in passes of one model; the worker's second cohort (2 symbols) starts there (no third
    warning); every symbol ends as in the same job with the memory it needs, one pass a step. Under
    --gpu-defaults, the settings a GPU deploy runs these with (checkpoints written behind the loop)."""
    assert train(tmp_path / "fits", "--cohort", "3", "--gpu-defaults") == 0
    assert train(tmp_path / "short", "--cohort", "3", "--gpu-defaults", env={"TRAINERS_FAULT_MEMORY": "1"}) == 0
    fits, short = symbol_results(tmp_path / "fits"), symbol_results(tmp_path / "short")
    assert sorted(fits) == sorted(short) == [f"SYN00{k}" for k in range(5)]
    for s in fits:
        assert_same_training(fits[s], short[s], tol=1e-6)
        assert "cohort_rows_per_pass" not in fits[s]["training"] and short[s]["training"]["cohort_rows_per_pass"] == 1
    log = (tmp_path / "short" / "training.log").read_text()
    assert log.count("ran out of device memory") == 2, log
    assert "training step with 3 models in one pass ran out of device memory" in log
    assert "training step with 2 models in one pass ran out of device memory" in log


def test_when_not_one_model_fits_a_pass_each_member_is_tried_alone_and_cohorts_shrink(tmp_path, monkeypatch):
    """TRAINERS_FAULT_MEMORY=0 (a stacked pass of even one model is out of memory): the first cohort's members
    leave with the error and each is tried alone (nn.LSTM; the cohort's error does not use up a try of theirs),
    to what the one-at-a-time job gives; the worker's next cohorts take at most half as many symbols (1 here:
    SYN003 and SYN004 one at a time). When the tries alone start, nothing holds the cohort's stack any more
    (an error's traceback, the worker's locals): its device memory is free for them."""
    import weakref

    import trainers.lstm.scheduler as scheduler_mod

    assert train(tmp_path / "alone", "--dropout", "0", "--cohort", "1") == 0
    stacks, datas, alive_at_try = [], [], []
    of, work_on, build = StackedLSTM.of, scheduler_mod.work_on, scheduler_mod.build_symbol_data

    def remembered(ms):
        stack = of(ms)
        stacks.append(weakref.ref(stack))
        return stack

    def built(*args, **kwargs):
        data = build(*args, **kwargs)
        if not alive_at_try:  # the cohort's (its tries alone build their own)
            datas.append(weakref.ref(data))
        return data

    def tried_alone(*args, **kwargs):  # (no gc.collect here: the worker must free them itself)
        alive_at_try.append(sum(ref() is not None for ref in stacks + datas))
        return work_on(*args, **kwargs)

    monkeypatch.setattr(StackedLSTM, "of", staticmethod(remembered))
    monkeypatch.setattr(scheduler_mod, "build_symbol_data", built)
    monkeypatch.setattr(scheduler_mod, "work_on", tried_alone)
    assert train(tmp_path / "none", "--dropout", "0", "--cohort", "3", env={"TRAINERS_FAULT_MEMORY": "0"}) == 0
    alone, tried = symbol_results(tmp_path / "alone"), symbol_results(tmp_path / "none")
    assert sorted(alone) == sorted(tried)
    for s in alone:
        assert_same_training(alone[s], tried[s])
        assert tried[s]["training"]["try"] == 1 and "cohort" not in tried[s]["training"]
    log = (tmp_path / "none" / "training.log").read_text()
    assert "a cohort of 3 symbols ran out of device memory (CUDA out of memory" in log and "at most 1" in log
    assert "in a cohort of 2" not in log and "try 1 failed" not in log
    assert len(stacks) == 1 and len(datas) == 3 and alive_at_try and set(alive_at_try) == {0}, alive_at_try


@pytest.mark.parametrize("where", ["stack", "batch", "silent-batch"])
def test_out_of_memory_outside_the_passes_sends_the_members_alone(tmp_path, monkeypatch, where):
    """Out of device memory where halving the passes cannot help (building the stack; gathering a step's
    batch): the worker does not crash; the members still training are each tried alone, on a first try of
    their own, and end as in the one-at-a-time job; one warning names the cohort (an error without a message
    by its type's name)."""
    import trainers.lstm.cohort as cohort_mod

    message = "" if where == "silent-batch" else "CUDA out of memory. Tried to allocate 8.00 GiB"

    def out_of_memory(*_args, **_kwargs):
        raise torch.OutOfMemoryError(message)
    if where == "stack":
        monkeypatch.setattr(StackedLSTM, "of", staticmethod(out_of_memory))
    else:
        monkeypatch.setattr(cohort_mod, "batch_of", out_of_memory)
    assert train(tmp_path / "alone", "--dropout", "0", "--cohort", "1") == 0
    assert train(tmp_path / "short", "--dropout", "0", "--cohort", "5") == 0
    alone, tried = symbol_results(tmp_path / "alone"), symbol_results(tmp_path / "short")
    assert sorted(alone) == sorted(tried) and len(tried) == 5
    for s in alone:
        assert_same_training(alone[s], tried[s])
        assert tried[s]["training"]["try"] == 1 and "cohort" not in tried[s]["training"]
    log = (tmp_path / "short" / "training.log").read_text()
    assert log.count(f"a cohort of 5 symbols ran out of device memory ({message or 'OutOfMemoryError'}); each is "
                     "tried alone, and this worker's next cohorts take at most 2") == 1, log


def test_a_cohort_job_trains_what_the_one_at_a_time_job_trains(tmp_path):
    """Dropout 0: the same training records (steps, early stops, best values) and test figures to 1e-4 (patience
    1 stops some symbols before their last step); SYN002 raises at step 2 in the cohort, is tried again alone
    and finishes like the others; SYN004 raises on every try and is recorded failed. The weights themselves are
    compared by the next test."""
    faults = {"TRAINERS_FAULT_RAISE": "SYN002@step2:once,SYN004@step3:always"}
    assert train(tmp_path / "alone", "--dropout", "0", "--cohort", "1", env=faults) == 1  # a failed symbol: exit 1
    assert train(tmp_path / "cohort", "--dropout", "0", "--cohort", "5", env=faults) == 1
    alone, cohort = symbol_results(tmp_path / "alone"), symbol_results(tmp_path / "cohort")
    assert sorted(alone) == sorted(cohort) == ["SYN000", "SYN001", "SYN002", "SYN003"]
    stops = {s: r["training"]["stop_reason"] for s, r in alone.items()}
    assert "early_stop" in stops.values(), stops  # the comparison covers a symbol that stopped early
    for s in alone:
        assert_same_training(alone[s], cohort[s])
    assert cohort["SYN000"]["training"]["cohort"] == 5
    assert cohort["SYN002"]["training"]["try"] == 2 and "cohort" not in cohort["SYN002"]["training"]
    job = json.loads((tmp_path / "cohort" / "results.json").read_text())
    assert job["symbols"]["SYN004"]["status"] == "failed" and job["symbols"]["SYN004"]["tries"] == 2
    marker = json.loads((tmp_path / "cohort" / "symbols" / "SYN000" / "done.json").read_text())
    assert marker["cohort"] == 5 and marker["seconds"] == pytest.approx(marker["cohort_seconds"] / 5)
    assert job["training"]["packing"]["efficiency"] <= 1.05  # shares of the worker's time, not 5 overlapping spans
    # the time in training steps, each a share of the stacked steps: inside each symbol's share of the worker
    assert 0 < marker["step_seconds"] < marker["seconds"]
    # and its share of each part of the cohort's loop (trainers.lstm.cohort.PHASES): every part ran, together
    # within its share of the worker's time; summed in the job's packing, a cohort job's alone
    from trainers.lstm.cohort import PHASES

    parts = marker["phase_seconds"]
    assert sorted(parts) == sorted(PHASES) and all(v > 0 for v in parts.values()), parts
    assert sum(parts.values()) < marker["seconds"]
    assert sorted(job["training"]["packing"]["sum_phase_seconds"]) == sorted(PHASES)
    assert "sum_phase_seconds" not in json.loads((tmp_path / "alone" / "results.json").read_text())["training"]["packing"]
    for name in ("alone", "cohort"):
        packing = json.loads((tmp_path / name / "results.json").read_text())["training"]["packing"]
        assert 0 < packing["sum_step_seconds"] < packing["sum_symbol_seconds"], (name, packing)
        assert packing["share_outside_steps"] == pytest.approx(1 - packing["sum_step_seconds"]
                                                               / packing["sum_symbol_seconds"])
    log = (tmp_path / "cohort" / "training.log").read_text()
    assert "in a cohort of 5" in log and "SYN002: try 1 failed in its cohort" in log


def final_weights(run_dir, symbol: str) -> tuple[int, dict]:
    """A symbol's last checkpoint: its step and the model's weights."""
    checkpoints = run_dir / "symbols" / symbol / "checkpoints"
    newest = max(checkpoints.glob("model_*.pt"))
    return int(newest.stem.split("_")[1]), torch.load(newest, weights_only=False)["states"]["model"]


@pytest.mark.parametrize("clip", [[], ["--grad-clip", "0.05"]], ids=["default-clip", "every-step-clipped"])
def test_each_symbols_weights_are_the_same_alone_and_in_a_cohort(tmp_path, clip):
    """Issue 66: the equivalence compares the models themselves, per symbol, after 21 steps each (7 epochs of 3,
    no early stop, dropout 0): every tensor of every symbol's final checkpoint trained in a cohort of 4 equals the
    one trained alone to 1e-4. A cohort step that fed a member another symbol's windows (the leak tier's
    cohort_rows_of_another_symbol) trains different weights and fails here, whatever the exit codes say. With a
    clip every step reaches, a symbol alone (cohort.Fused) that skipped its clip fails here too: at the default one
    the tiny models' gradients stay under it."""
    job = ["--synthetic-tickers", "4", "--epochs", "7", "--patience", "0", "--dropout", "0", *clip]
    assert train(tmp_path / "alone", *job, "--cohort", "1") == 0
    assert train(tmp_path / "cohort", *job, "--cohort", "4") == 0
    symbols = ["SYN000", "SYN001", "SYN002", "SYN003"]
    assert json.loads((tmp_path / "cohort" / "symbols" / "SYN003" / "done.json").read_text())["cohort"] == 4
    for symbol in symbols:
        (step_a, alone), (step_c, cohort) = final_weights(tmp_path / "alone", symbol), final_weights(
            tmp_path / "cohort", symbol)
        assert step_a == step_c >= 20, (symbol, step_a, step_c)
        assert sorted(alone) == sorted(cohort)
        for name in alone:
            assert torch.allclose(alone[name], cohort[name], rtol=0, atol=1e-4), (
                symbol, name, (alone[name] - cohort[name]).abs().max().item())
    # the comparison has teeth: two symbols' models differ by far more than the tolerance
    _, first = final_weights(tmp_path / "alone", "SYN000")
    _, second = final_weights(tmp_path / "alone", "SYN001")
    assert max((first[n] - second[n]).abs().max().item() for n in first) > 1e-2


def test_a_cohorts_members_draw_no_progress_bar(tmp_path, capfd):
    """A member's run quiets its bar as it opens (one bar per symbol would fill the terminal); on a
    stderr that is not a terminal (a log file, nohup) it once left a "0%" line per symbol all the same."""
    assert train(tmp_path / "cohort", "--cohort", "3", "--synthetic-tickers", "3", "--epochs", "1") == 0
    err = capfd.readouterr().err
    assert "it/s]" not in err and "in a cohort of 3" in err


def test_each_member_of_a_cohort_logs_into_its_own_folder(tmp_path):
    """One process opens K runs: they shared one logger, and every member's lines went to the training.log
    of the member opened last."""
    assert train(tmp_path / "cohort", "--cohort", "3", "--synthetic-tickers", "3", "--epochs", "1") == 0
    for s in ("SYN000", "SYN001", "SYN002"):
        log = (tmp_path / "cohort" / "symbols" / s / "training.log").read_text()
        others = {"SYN000", "SYN001", "SYN002"} - {s}
        assert f"lstm {s}: " in log and not any(f"lstm {o}: " in log for o in others), (s, log[:2000])


def test_with_dropout_a_symbol_trains_the_same_whichever_symbols_share_its_cohort(tmp_path):
    """...and under --gpu-defaults (what a GPU deploy turns on: checkpoints written behind the loop)."""
    assert train(tmp_path / "two", "--symbols", "SYN000,SYN001", "--cohort", "2") == 0
    assert train(tmp_path / "three", "--symbols", "SYN003,SYN000,SYN002", "--cohort", "3", "--gpu-defaults") == 0
    two, three = symbol_results(tmp_path / "two")["SYN000"], symbol_results(tmp_path / "three")["SYN000"]
    assert (two["training"]["cohort"], three["training"]["cohort"]) == (2, 3)  # trained in cohorts, not alone
    assert_same_training(two, three)


@pytest.fixture
def restore_sigterm():
    previous = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, previous)


def test_a_cohort_stopped_by_a_signal_resumes_alone_or_in_another_cohort(tmp_path, restore_sigterm):
    """SIGTERM at step 3 stops every member with a checkpoint; run again, each symbol resumes from its own
    and ends where the uninterrupted run ends: in a cohort with dropout (its masks are its own stream),
    and alone with nn.LSTM at dropout 0 (a member's checkpoint is a DirectionLSTM's and AdamW's)."""
    symbols = ["--symbols", "SYN000,SYN001,SYN003", "--patience", "0"]
    stop = {"TRAINERS_FAULT": "sigterm@rank0:step3"}
    for name, extra, resume_with in (("dropout", [], ["--cohort", "3"]),
                                     ("plain", ["--dropout", "0"], ["--cohort", "1"])):
        assert train(tmp_path / f"{name}_whole", *symbols, *extra, "--cohort", "3") == 0
        assert train(tmp_path / f"{name}_cut", *symbols, *extra, "--cohort", "3", env=stop) == 0
        cut = json.loads((tmp_path / f"{name}_cut" / "results.json").read_text())
        assert cut["training"]["stop_reason"] == "signal" and cut["training"]["symbols"]["ok"] == 0
        assert train(tmp_path / f"{name}_cut", *symbols, *extra, *resume_with) == 0
        whole, resumed = symbol_results(tmp_path / f"{name}_whole"), symbol_results(tmp_path / f"{name}_cut")
        assert sorted(resumed) == ["SYN000", "SYN001", "SYN003"]
        for s in whole:
            assert_same_training(whole[s], resumed[s])
        log = (tmp_path / f"{name}_cut" / "training.log").read_text()
        assert "SYN001: resumed from checkpoint step" in log


@pytest.mark.parametrize("env", [{}, {"TRAINERS_ON_HANGUP": "ignore"}])
def test_a_hangup_stops_every_member_of_a_cohort_or_none_of_a_detached_job(tmp_path, env):
    """SIGHUP (the terminal of a foreground job went away) stops the run like SIGTERM: it once stopped only the
    member whose run had installed its handler last, and the others trained on. A detached job ignores it."""
    before = signal.getsignal(signal.SIGHUP)
    assert train(tmp_path / "job", "--symbols", "SYN000,SYN001,SYN003", "--patience", "0", "--cohort", "3",
                 env={"TRAINERS_FAULT": "sighup@rank0:step3", **env}) == 0
    assert signal.getsignal(signal.SIGHUP) == before  # (the job gives the caller its handler back)
    job = json.loads((tmp_path / "job" / "results.json").read_text())["training"]
    reasons = {s: r["training"]["stop_reason"] for s, r in symbol_results(tmp_path / "job").items()}
    if env:
        assert job["stop_reason"] == "completed" and set(reasons.values()) == {"completed"}, reasons
    else:
        assert (job["stop_reason"], job["signal"], job["symbols"]["stopped"]) == ("signal", "SIGHUP", 3), job
        assert reasons == dict.fromkeys(("SYN000", "SYN001", "SYN003"), "signal")


@pytest.mark.parametrize("cohort", ["1", "4"])
def test_a_symbol_killed_after_its_early_stop_finishes_where_it_stopped(tmp_path, cohort):
    """A cohort's member writes its done.json only when the whole cohort has finished (a symbol alone: after
    its export): killed in between, the symbol is pending again. Run again, it resumes at its early stop's
    checkpoint and finishes there, as the uninterrupted job did, instead of training on (a hostile test
    found it training 75 more steps to another model)."""
    symbols = ["--symbols", "SYN000,SYN001,SYN002,SYN003", "--dropout", "0", "--cohort", cohort]
    assert train(tmp_path / "job", *symbols) == 0
    whole = symbol_results(tmp_path / "job")
    assert all(("cohort" in r["training"]) == (cohort != "1") for r in whole.values())  # the cohort did run
    stopped = [s for s, r in whole.items() if r["training"]["stop_reason"] == "early_stop"
               and r["training"]["steps"] < r["training"]["total_steps"]]
    assert stopped, {s: r["training"]["stop_reason"] for s, r in whole.items()}
    for s in stopped:  # as if killed before its done.json
        (tmp_path / "job" / "symbols" / s / "done.json").unlink()
    assert train(tmp_path / "job", *symbols) == 0
    again = symbol_results(tmp_path / "job")
    for s in stopped:
        assert_same_training(whole[s], again[s], tol=0.0)
        assert (tmp_path / "job" / "symbols" / s / "done.json").exists()
    assert "resumed from checkpoint step" in (tmp_path / "job" / "training.log").read_text()


def test_the_cohort_option_is_checked_and_auto_is_one_on_a_cpu(tmp_path, capsys):
    assert main(["lstm", "train", "--run-dir", str(tmp_path / "x"), "--cohort", "0"]) == 2
    assert "--cohort" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    from trainers.lstm.config import LstmConfig, parse_timeframes
    from trainers.lstm.size import cohort_size

    tfs = parse_timeframes("1d,1w,1M")
    assert cohort_size(LstmConfig(), tfs, torch.device("cpu")) == 1
    assert cohort_size(LstmConfig(cohort=7), tfs, torch.device("cpu")) == 7


@FAULT_PATH
@pytest.mark.parametrize("cohort, extra", [("1", []), ("5", []), ("5", ["--gpu-defaults"])])
def test_a_broken_cuda_context_leaves_the_worker_with_no_symbol_recorded_failed(tmp_path, cohort, extra):
    """After a kernel fault (an illegal memory access) every later CUDA call of the process fails: a second try
    and every later symbol used to fail too, each recorded failed after two tries, none by its own fault. The
    worker now stops the job at once, exits 1 (torchrun restarts it with a fresh context: tests/lstm/
    test_lstm_jobs.py) and leaves its symbols pending; the next run trains them alone, each on its first try."""
    lost = {"TRAINERS_FAULT_RAISE": "SYN001@step1:lost"}
    assert train(tmp_path / "job", "--cohort", cohort, *extra, env=lost) == 1
    job = json.loads((tmp_path / "job" / "results.json").read_text())
    done = {s for s, row in job["symbols"].items() if row["status"] == "ok"}
    assert done == ({"SYN000"} if cohort == "1" else set()) and job["training"]["symbols"]["failed"] == 0
    assert job["training"]["signal"] == "a broken CUDA context"  # the stop published to every worker
    assert not any((tmp_path / "job" / "symbols" / s / "done.json").exists() for s in job["symbols"] if s not in done)
    log = (tmp_path / "job" / "training.log").read_text()
    pending = ["SYN001"] if cohort == "1" else ["SYN000", "SYN001", "SYN002", "SYN003", "SYN004"]
    assert log.count("CUDA's context is broken") == 1 and f"the job stops with {', '.join(pending)} pending" in log
    assert "no symbol is recorded failed (each is trained alone next time)" in log and "try 1 failed" not in log
    assert ("SYN002: claimed" in log) == (cohort == "5"), log
    assert "ran out of device memory" not in log  # a broken context is not a cohort too large
    assert train(tmp_path / "job", "--cohort", cohort, *extra) == 0
    again = symbol_results(tmp_path / "job")
    assert len(again) == 5 and all(r["training"]["try"] == 1 for r in again.values())
    assert all("cohort" not in again[s]["training"] for s in pending)  # alone: it may have been the cause


@FAULT_PATH
@pytest.mark.parametrize("fault, extra, left", [
    ("SYN001@step12:lost", ["--patience", "0"], "SYN001, SYN002, SYN003, SYN004"),  # every member's bookkeeping
    ("SYN002@step2:lost", [], "SYN001, SYN002, SYN003, SYN004"),  # then the stack's next step
])
def test_a_cohort_member_that_finished_before_the_context_broke_stays_finished(tmp_path, fault, extra, left):
    """The error is sticky: once the fault fires, every later member's bookkeeping and the stack's next pass fail
    with it. SYN000 had finished before (patience 0: its last step, 12; patience 1: an early stop at step 2): it
    stays finished (its done.json); the others leave in the cohort's outcomes, none tried again alone."""
    assert train(tmp_path / "job", "--cohort", "5", *extra, env={"TRAINERS_FAULT_RAISE": fault}) == 1
    job = json.loads((tmp_path / "job" / "results.json").read_text())
    assert {s: row["status"] for s, row in job["symbols"].items() if row["status"] in ("ok", "failed")} == \
        {"SYN000": "ok"}
    assert symbol_results(tmp_path / "job")["SYN000"]["training"]["cohort"] == 5
    log = (tmp_path / "job" / "training.log").read_text()
    assert f"stops with {left} pending" in log and "try 1 failed" not in log, log
    assert "ran out of device memory" not in log and "a cohort of 5 symbols failed" not in log


@FAULT_PATH
def test_a_symbol_that_breaks_the_context_every_time_is_recorded_failed_after_the_others_finish(tmp_path):
    """SYN002 breaks the context on every run (its own data, say): run 1 in the cohort (all five pending, each
    counted once); run 2 each alone, SYN002 breaks it alone for the second time: recorded failed, so a torchrun
    restart would go on without it; run 3 (a new launch retries failed symbols) takes SYN002 after the others,
    which finish."""
    lost = {"TRAINERS_FAULT_RAISE": "SYN002@step2:lost"}
    job_dir = tmp_path / "job"
    assert train(job_dir, "--cohort", "5", "--patience", "0", env=lost) == 1
    assert all(json.loads((job_dir / "symbols" / s / "device_lost.json").read_text())["count"] == 1
               for s in ("SYN000", "SYN001", "SYN002", "SYN003", "SYN004"))
    assert train(job_dir, "--cohort", "5", "--patience", "0", env=lost) == 1
    rows = json.loads((job_dir / "results.json").read_text())["symbols"]
    assert {s: row["status"] for s, row in rows.items()} == {"SYN000": "ok", "SYN001": "ok", "SYN002": "failed",
                                                            "SYN003": "pending", "SYN004": "pending"}
    assert "broke 2 times while it trained, the last time alone" in rows["SYN002"]["error"]
    assert "SYN002 broke it alone for the second time and is recorded failed" in (job_dir / "training.log").read_text()
    assert train(job_dir, "--cohort", "5", "--patience", "0", env=lost) == 1
    rows = json.loads((job_dir / "results.json").read_text())["symbols"]
    assert {s: row["status"] for s, row in rows.items()} == {"SYN000": "ok", "SYN001": "ok", "SYN002": "failed",
                                                            "SYN003": "ok", "SYN004": "ok"}


@FAULT_PATH
@pytest.mark.parametrize("extra", [[], ["--gpu-defaults"], ["--device", "auto"]])  # checkpoints written behind the
def test_a_cohort_that_fails_as_a_whole_sends_its_members_alone_and_the_worker_one_at_a_time(tmp_path, monkeypatch,
                                                                                               extra):  # loop; on
    # the fake accelerator (in this process: CUDA's placement rules for the members' tries alone)
    """An error of the stack's own (here its third training step raises; not a member's, not out of memory)
    ended the worker with a traceback, and torchrun's restarts put it back into the same cohort until the job
    died. Now the members are each tried alone on a first try of their own (resuming what the cohort
    checkpointed) and end as in the one-at-a-time job; the worker takes one symbol at a time from then on."""
    import trainers.lstm.cohort as cohort_mod

    real, calls = cohort_mod.stacked_step, []

    def failing_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise ValueError("the stacked step broke")
        return real(*args, **kwargs)

    on_device = FakeAccelerator() if "auto" in extra else contextlib.nullcontext()
    with on_device:
        assert train(tmp_path / "alone", "--dropout", "0", "--cohort", "1", *extra) == 0
        monkeypatch.setattr(cohort_mod, "stacked_step", failing_third)
        assert train(tmp_path / "failed", "--dropout", "0", "--cohort", "2", *extra) == 0
    alone, failed = symbol_results(tmp_path / "alone"), symbol_results(tmp_path / "failed")
    assert sorted(alone) == sorted(failed) and len(failed) == 5
    for s in alone:
        assert_same_training(alone[s], failed[s])
        assert failed[s]["training"]["try"] == 1 and "cohort" not in failed[s]["training"], s
    log = (tmp_path / "failed" / "training.log").read_text()
    assert log.count("a cohort of 2 symbols failed (ValueError: the stacked step broke); each is tried alone, and "
                     "this worker trains one symbol at a time from now on") == 1, log
    assert log.count("in a cohort of 2") == 2 and "try 1 failed" not in log and len(calls) == 3
    assert "Traceback" in log and "the stacked step broke" in log.split("Traceback", 1)[1]  # what to report
    job = json.loads((tmp_path / "failed" / "results.json").read_text())
    assert job["training"]["trained_alone_after_a_failed_cohort"] == ["SYN000", "SYN001"]
    assert {row["device"] for row in job["symbols"].values()} == {"cpu:0" if "auto" in extra else "cpu"}
    assert job["symbols"]["SYN000"]["cohort_failed"] == "ValueError: the stacked step broke"
    assert "## Trained alone after their cohort failed" in (tmp_path / "failed" / "results.md").read_text()


@FAULT_PATH
def test_a_cohort_failing_while_the_job_stops_leaves_its_members_for_the_next_run(tmp_path, monkeypatch,
                                                                                   restore_sigterm):
    """The stack's error comes with the job's SIGTERM (a closed pipe, a dying device): not counted, not tried
    alone; the next run resumes each member."""
    import trainers.lstm.cohort as cohort_mod

    real, calls = cohort_mod.stacked_step, []

    def failing_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)
            raise ValueError("the stacked step broke")
        return real(*args, **kwargs)

    monkeypatch.setattr(cohort_mod, "stacked_step", failing_third)
    assert train(tmp_path / "job", "--cohort", "5") == 0
    job = json.loads((tmp_path / "job" / "results.json").read_text())
    assert job["training"]["symbols"]["ok"] == job["training"]["symbols"]["failed"] == 0, job["training"]
    log = (tmp_path / "job" / "training.log").read_text()
    assert "while the job was stopping; not counted as a failure" in log and "tried alone" not in log
    monkeypatch.setattr(cohort_mod, "stacked_step", real)
    assert train(tmp_path / "job", "--cohort", "5") == 0
    assert all(r["training"]["try"] == 1 for r in symbol_results(tmp_path / "job").values())


@FAULT_PATH
def test_a_suspect_of_a_broken_context_is_trained_after_every_other_symbol_of_its_claim(tmp_path):
    """SYN001 broke a context before (its count); claimed in a pair with SYN000, whose shape group has no other
    member (trained alone too): SYN000 goes first, and finishes, before SYN001 breaks the context again."""
    folder = tmp_path / "job" / "symbols" / "SYN001"
    folder.mkdir(parents=True)
    (folder / "device_lost.json").write_text(json.dumps({"count": 1}))
    lost = {"TRAINERS_FAULT_RAISE": "SYN001@step2:lost"}
    assert train(tmp_path / "job", "--symbols", "SYN001,SYN000", "--cohort", "2", env=lost) == 1
    rows = json.loads((tmp_path / "job" / "results.json").read_text())["symbols"]
    assert {s: row["status"] for s, row in rows.items()} == {"SYN001": "failed", "SYN000": "ok"}


def test_a_members_checkpoint_comes_to_the_host_in_one_copy_a_state_and_holds_no_pinned_buffer(tmp_path, monkeypatch):
    """A member's checkpoint took a clone per tensor of its model and its AdamW state on the device, a page-locked
    host buffer per tensor for the copy behind the loop, every member its own (a cudaHostAlloc apiece: the
    caching allocator cannot reuse a buffer still held), and a `.item()` for its step count; on the H200 the
    clones (6,656) and the buffers (2,733 `host_buffer` calls) were among the largest times cProfile gave the
    64-symbol cohort job (its times add across threads: bench/results/gpu_h200/profile_lstm_cohort_gpu.runs.json).
    On the fake accelerator, where the saves are written behind the loop as on CUDA: a member's model and its
    optimizer state come to the host in one copy each, whatever the number of tensors, and the copy behind the
    loop holds no page-locked buffer of its own."""
    from trainers.runtime.checkpointer import Checkpointer

    saves, holds = [], []  # each save takes a copy, whether written or held (--ckpt-at-eval held: a new best)

    def counted(real, calls):
        def call(self, *args, **kwargs):
            calls.append(1)
            return real(self, *args, **kwargs)
        return call

    monkeypatch.setattr(Checkpointer, "save", counted(Checkpointer.save, saves))
    monkeypatch.setattr(Checkpointer, "hold", counted(Checkpointer.hold, holds))
    with FakeAccelerator() as acc:
        assert train(tmp_path / "job", "--dropout", "0", "--cohort", "5", "--device", "auto", "--gpu-defaults") == 0
    results = symbol_results(tmp_path / "job")
    assert len(results) == 5 and all("cohort" in r["training"] for r in results.values())
    assert len(saves) >= 10 and holds  # every member saved, most more than once
    held = [where for where in acc.pins if "(host_buffer)" in where]  # (a transient pin reuses a cached block)
    assert held == [], Counter(held)
    stacked = [s for s in acc.syncs if s.where.startswith("trainers/lstm/stacked.py")]
    copies = [s for s in stacked if "(host_rows)" in s.where]
    assert {s.kind for s in copies} == {"device->host"} and len(copies) == 2 * len(saves)
    assert not [s for s in stacked if s.kind == "item"]  # the step count rides with the optimizer's copy


def test_a_symbols_run_logs_its_info_lines_to_its_own_file_not_the_console(tmp_path, capfd):
    """On the console the job's log speaks for the workers; each symbol's run keeps its INFO lines to its own
    training.log. The console handler became runtime.logs.BarAwareHandler, a subclass the quieting did not match,
    and every symbol's run lines reached the console again."""
    assert train(tmp_path / "job", "--cohort", "1", "--synthetic-tickers", "2", "--epochs", "1") == 0
    err = capfd.readouterr().err
    log = (tmp_path / "job" / "symbols" / "SYN000" / "training.log").read_text().splitlines()
    infos = [line.split(" INFO ", 1)[1] for line in log if " INFO " in line]
    assert infos and "SYN000: claimed" in err
    assert [line for line in infos if line in err] == []
