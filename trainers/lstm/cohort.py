"""The LSTM's one training loop: a cohort of symbols at once, K symbols' models stacked into one
(trainers.lstm.stacked, Cohort), each symbol still its own run; a symbol alone is a cohort of one, its own
DirectionLSTM with nn.LSTM's fused kernel (Fused).

Why: one symbol's tiny LSTM cannot fill a GPU; trained one after another, a job is launch-bound (on the
H200, 8,499 samples/s where a bare step of the same shape ran 87-93k). Stacked, one step trains every
symbol of the cohort with the kernels one symbol's step launches.

What does not change: each symbol keeps its own run (trainers.runtime.run.Run: its folder, lock, log,
checkpoints, resume, early stop, evaluation, results, ONNX), its own windows (a cohort step gathers each
symbol's batch from its own data, padded to the batch size with rows that weigh nothing: never a row of
another symbol), its own AdamW state and step count, its own seed. A symbol's checkpoint holds exactly
what a symbol trained alone saves (its DirectionLSTM state dict and its AdamW state), so it resumes alone
or in another cohort. A symbol that stops (early, budget, signal, its last step) leaves the cohort: the
stacked models shrink once fewer than half are still training. A symbol whose bookkeeping raises leaves
with its error (the worker tries it again alone); the others go on. A stacked pass that runs out of device
memory (--cohort auto sizes a cohort from an estimate; a user may force a larger one) is made again in passes
of half as many models, equal to rounding (Cohort.rows_per_pass); out of memory anywhere else in the cohort, or
with one model a pass, the members leave, each tried alone, and the worker's next cohorts are half as large.

Equal to training alone (tests/lstm/test_lstm_cohort.py): with --dropout 0, the same weights, metrics and
early-stop step within 1e-4; with dropout, each symbol's masks come from its own (seed, step) stream, so its
training does not depend on the other members (nn.LSTM's own masks, drawn from the global stream, differ).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from trainers.errors import first_line
from trainers.lstm.build import build_model
from trainers.lstm.config import LstmConfig
from trainers.lstm.evaluate import (
    evaluate_logits,
    evaluation_anchors,
    log_symbol_summary,
    symbol_logits,
    validation_loss,
)
from trainers.lstm.features import SymbolData
from trainers.lstm.job import planned_steps, symbol_config
from trainers.lstm.model import count_parameters, direction_loss
from trainers.lstm.stacked import StackedAdamW, StackedLSTM, adamw_param_groups, clip_per_model
from trainers.lstm.worker import STOPPED_UNFINISHED, SymbolOutcome, Worker
from trainers.runtime import device as device_mod
from trainers.runtime import faults
from trainers.runtime.budget import StopReason
from trainers.runtime.logs import close_handlers
from trainers.runtime.run import Run, RunSpec
from trainers.runtime.rundir import single_process_context
from trainers.runtime.sampling import EpochCursor

STEP, EVALUATION = "training step", "evaluation"  # the two kinds of stacked pass, each with its own memory
# The parts of a cohort's loop, timed on the host (the job's packing.sum_phase_seconds): opening the members' runs,
# starting them (resume, the untrained evaluation), the stacked steps, each member's bookkeeping after a step, the
# validation passes, step_done (the agreements, checkpoints, heartbeats), the finishes (final evaluation, results).
# On a GPU a part's time includes the device work it waits for (CUDA_LAUNCH_BLOCKING=1 gives each its own).
PHASES = ("enter", "start", "steps", "after_step", "evaluation", "step_done", "finish")


@dataclass(eq=False)  # members are told apart by identity (two runs of one symbol never share a cohort)
class Member:
    cfg: LstmConfig  # the symbol's own config (its folder, seed)
    data: SymbolData
    total_steps: int
    run: Run | None = None
    exit: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    cursor: EpochCursor | None = None
    step: int = 0
    ended: bool = False  # resumed where it had stopped early: it finishes without training (Start.ended)
    window_loss: torch.Tensor | None = None
    window_count: int = 0
    loss: torch.Tensor | None = None  # this step's, on the device
    count: int = 0  # this step's real rows
    step_seconds: float = 0.0  # its share of the stacked steps' host time (each step's split among its trainers)
    rows_per_pass: int | None = None  # the fewest models a pass of its training steps held, if ever fewer than all
    final_save_seconds: float = 0.0  # its last step_done (the final checkpoint): part of its end (Worker.wind_down)
    end_of_epoch: bool = False
    outcome: SymbolOutcome | None = None
    error: BaseException | None = None

    @property
    def symbol(self) -> str:
        return self.data.symbol

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.error is not None


class Rows:
    """Which member sits in which row of a kernel's models. A kernel (Cohort,
    Fused) adds its model and optimizer: `states(m)`, the member's model and optimizer as its run saves them;
    `step(cfg, generator)`, one optimizer step of every member still training, their losses [K] (detached);
    `member_model(m)`, the member's DirectionLSTM for an evaluation alone."""

    stacked_evaluation = False  # (Cohort: on an accelerator its evaluations run the members' models together)

    def __init__(self, members: list[Member], rows_per_pass: dict[str, int | None] | None, log):
        self.members = list(members)  # in row order
        self.size = len(members)  # (the members left after a shrink are fewer: the summary names the cohort's size)
        # At most this many models in one stacked pass (None: all of them), for training steps (gradients,
        # --batch-size) and evaluations (none, --eval-batch-size) apart. --cohort auto sizes a cohort from an
        # estimate of its memory, and a user may force a larger one: a pass that runs out of device memory is
        # made again in passes of half as many models (equal to rounding: each model's loss and gradients are
        # its own), and the worker's next cohorts start from the halved sizes (Worker.rows_per_pass).
        self.rows_per_pass: dict[str, int | None] = {STEP: None, EVALUATION: None, **(rows_per_pass or {})}
        self.log = log
        self.out_of_memory: RuntimeError | None = None  # why its members left, if out of device memory
        self._rows = {id(m): k for k, m in enumerate(self.members)}

    def row(self, member: Member) -> int:
        return self._rows[id(member)]


class Fused(Rows):
    """A cohort of one: the symbol's DirectionLSTM (nn.LSTM's fused kernel, 3-6x faster on a CPU than the stacked
    cell: Cohort.stacked_evaluation), torch's AdamW and clip_grad_norm_, its batch unpadded. What `--cohort 1`
    trains, and a symbol tried alone after its cohort failed; the loop is the cohort's."""

    def __init__(self, member: Member, cfg: LstmConfig, device: torch.device,
                 rows_per_pass: dict[str, int | None] | None = None, log=None):
        super().__init__([member], rows_per_pass, log)
        torch.manual_seed(member.cfg.seed)  # (nn.LSTM's dropout masks then come from this stream, as they always did)
        self.model = build_model(member.cfg, member.data.n_features).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.parameters = count_parameters(self.model)
        self.pos_weight = torch.tensor(member.data.pos_weight, device=device)

    def states(self, member: Member) -> dict:
        return {"model": self.model, "optimizer": self.optimizer}

    def member_model(self, member: Member) -> torch.nn.Module:
        return self.model

    def step(self, cfg: LstmConfig, generator: torch.Generator) -> torch.Tensor:
        m = self.members[0]
        positions, m.count = m.cursor.batch()
        x, y = m.data.gather(m.data.ids["train"][positions])  # positions on the device already: no copy per step
        loss = direction_loss(self.model(x), y, self.pos_weight)  # BCE on the logit: the model has no sigmoid
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if cfg.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.optimizer.step()
        return loss.detach().reshape(1)


class Cohort(Rows):
    """The stacked models and their optimizer (trainers.lstm.stacked), and which member sits in which row."""

    def __init__(self, members: list[Member], cfg: LstmConfig, device: torch.device,
                 rows_per_pass: dict[str, int | None] | None = None, log=None):
        super().__init__(members, rows_per_pass, log)
        models = []
        for m in members:
            torch.manual_seed(m.cfg.seed)  # each symbol's own init, as when it trains alone
            models.append(build_model(m.cfg, m.data.n_features))
        self.parameters = count_parameters(models[0])
        self.param_groups = adamw_param_groups(models[0], cfg.lr, cfg.weight_decay)
        self.model = StackedLSTM.of(models).to(device)
        self.optimizer = StackedAdamW(list(self.model.parameters()), cfg.lr, cfg.weight_decay)
        # Evaluations run the members' models together on an accelerator (one launch-bound pass for all);
        # on a CPU each member's own nn.LSTM, whose fused cell ran them 3-6x faster than the stacked one
        # (16 symbols of the default model: 1.7 s against 10.7 s for the final evaluation's logits)
        self.stacked_evaluation = bool(device_mod.total_memory(device))
        self._membership: list[bool] | None = None  # the members' done flags the step's row tensors were made for

    def states(self, member: Member) -> dict:
        return {"model": SliceModel(self, member), "optimizer": SliceOptimizer(self, member)}

    def member_model(self, member: Member) -> torch.nn.Module:
        return self.model.model(self.row(member))

    def step(self, cfg: LstmConfig, generator: torch.Generator) -> torch.Tensor:
        """One stacked step: each member's own batch (a finished one's rows weigh nothing), its own dropout masks,
        its own clip and AdamW step; out of device memory, made again in passes of half as many models."""
        stack = self.members
        if self._membership != [m.done for m in stack]:  # copied to the device when a member leaves, not every step
            self._membership = [m.done for m in stack]
            device = self.model.weights[0].device
            self._training = torch.tensor([not done for done in self._membership], device=device)
            self._pos_weight = torch.tensor([m.data.pos_weight for m in stack], device=device)
        x, y, w = batch_of(stack, cfg.batch_size)
        seeds, steps, active = [m.cfg.seed for m in stack], [m.step for m in stack], [not m.done for m in stack]

        def masks_of(rows: slice) -> dict[str, torch.Tensor] | None:
            return self.model.dropout_masks(seeds[rows], steps[rows], cfg.batch_size, cfg.window, generator)
        # (out of memory with one model a pass, or outside the passes: train_cohort sends the members alone)
        losses = halving_on_out_of_memory(self, STEP, "training step", len(stack),
                                          lambda: stacked_step(self, x, y, w, masks_of, self._pos_weight, active))
        clip_per_model(list(self.model.parameters()), cfg.grad_clip, self._training)
        self.optimizer.step(self._training)
        return losses

    def shrink(self) -> None:
        """Only the members still training stay in the stack (most have finished): less work per step."""
        still = [m for m in self.members if not m.done]
        rows = torch.tensor([self.row(m) for m in still], device=self.model.weights[0].device)
        self.model.keep(rows)
        self.optimizer.keep(rows, list(self.model.parameters()))
        self.members = still
        self._rows = {id(m): k for k, m in enumerate(self.members)}


class SliceModel:
    """A member's model, as its run saves and restores it: a DirectionLSTM state dict."""

    def __init__(self, cohort: Cohort, member: Member):
        self.cohort, self.member = cohort, member

    def state_dict(self) -> dict:
        return self.cohort.model.model_state(self.cohort.row(self.member))

    def load_state_dict(self, state: dict) -> None:
        self.cohort.model.load_model_state(self.cohort.row(self.member), state)


class SliceOptimizer:
    """A member's AdamW state, in torch.optim.AdamW's own format for its DirectionLSTM."""

    def __init__(self, cohort: Cohort, member: Member):
        self.cohort, self.member = cohort, member

    def state_dict(self) -> dict:
        return self.cohort.optimizer.model_state(self.cohort.row(self.member), self.cohort.param_groups)

    def load_state_dict(self, state: dict) -> None:
        self.cohort.optimizer.load_model_state(self.cohort.row(self.member), state)


def padded(anchors: torch.Tensor, fill: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`anchors` padded to `size` with `fill` (an anchor of the same member), and the rows' weights (0 for
    the padding): every step has one shape, and only the member's own real rows count."""
    weight = torch.ones(size, device=fill.device)
    if len(anchors) < size:
        weight[len(anchors):] = 0.0
        anchors = torch.cat([anchors, fill[:1].expand(size - len(anchors))])
    return anchors, weight


def batch_of(members: list[Member], size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each member's own windows [K, size, window, F], labels and row weights [K, size]: a member that has
    finished (still in the stack until it shrinks) gets rows that weigh nothing."""
    rows = []
    for m in members:
        ids = m.data.ids["train"]
        if m.done:
            anchors, weight = padded(ids[:0], ids, size)
            weight.zero_()
        else:
            positions, m.count = m.cursor.batch()
            anchors, weight = padded(ids[positions], ids, size)
        rows.append((m, anchors, weight))
    return stacked_windows(rows)


def stacked_windows(rows: list[tuple[Member, torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
    """Each (member, anchors, row weights)'s windows from the member's own data, stacked: x [K, B, window, F],
    labels and weights [K, B] (an unlabelled anchor's label 0: only padding, which weighs 0, has one)."""
    xs, ys = zip(*(m.data.gather(anchors) for m, anchors, _ in rows))
    return torch.stack(xs), torch.nan_to_num(torch.stack(ys)), torch.stack([weight for _, _, weight in rows])


def groups(items: list, size: int | None) -> list[list]:
    """`items` in consecutive groups of at most `size` (None: one group)."""
    size = size or len(items) or 1
    return [items[start:start + size] for start in range(0, len(items), size)]


def halving_on_out_of_memory(cohort: Cohort, kind: str, what: str, models: int, work):
    """`work()` over `models` of the stack, made again with half as many models per pass of its `kind`
    (cohort.rows_per_pass[kind]) each time the device runs out of memory; a single model that does not fit
    raises. `work` must only compute (the step zeroes its gradients again at its start): nothing it did before
    the error stands."""
    while True:
        try:
            return work()
        except RuntimeError as exc:  # (CUDA raises where the allocation failed: no wait involved)
            if not device_mod.out_of_memory(exc):
                raise
            rows = min(cohort.rows_per_pass[kind] or models, models)
            if rows <= 1:
                raise
            error = first_line(exc)
        # (outside the handler: the failed attempt's frames and their tensors are released before the retry)
        cohort.rows_per_pass[kind] = -(-rows // 2)
        device_mod.release_cached_memory(cohort.model.weights[0].device)
        if cohort.log is not None:
            half = cohort.rows_per_pass[kind]
            cohort.log.warning("the cohort's %s with %d models in one pass ran out of device memory (%s); making "
                               "it in passes of %d model%s (equal to rounding, more launches)", what, rows, error,
                               half, "" if half == 1 else "s")


def stacked_step(cohort: Cohort, x: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                 masks_of, pos_weight: torch.Tensor, active: list[bool]) -> torch.Tensor:
    """Each member's loss [K] (detached), its gradients in the stack's parameters: in one pass, or in passes of
    cohort.rows_per_pass[STEP] models, each pass's backward adding only its own rows' gradients (the models'
    parameters are disjoint; equal to the one pass to rounding: the kernels see another batch count). A pass
    of finished members only (`active` False: their rows weigh nothing) is skipped, their losses 0.
    `masks_of(rows)`: the dropout masks of the models at that slice of the stack (each model's its own stream's,
    so drawn per pass: their memory is a pass's too)."""
    cohort.optimizer.zero_grad()
    k = x.shape[0]
    size = cohort.rows_per_pass[STEP] or k
    if size >= k:
        faults.before_stacked_pass(k)
        losses = member_losses(cohort.model(x, masks_of(slice(0, k))), labels, weights, pos_weight)
        losses.sum().backward()  # each member's gradients are its own loss's: the parameters are disjoint
        return losses.detach()
    parts = []
    for start in range(0, k, size):
        part = slice(start, min(start + size, k))
        if not any(active[part]):
            parts.append(x.new_zeros(part.stop - part.start))
            continue
        rows = torch.arange(part.start, part.stop, device=x.device)
        faults.before_stacked_pass(part.stop - part.start)
        losses = member_losses(cohort.model(x[part], masks_of(part), rows=rows), labels[part], weights[part],
                               pos_weight[part])
        losses.sum().backward()
        parts.append(losses.detach())
    return torch.cat(parts)


def member_losses(logits: torch.Tensor, labels: torch.Tensor, weights: torch.Tensor,
                  pos_weight: torch.Tensor) -> torch.Tensor:
    """Each member's mean BCE over its real rows, its class weight on the up bars [K] (0 for a member with
    none: one that has finished)."""
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, pos_weight=pos_weight[:, None],
                                                                reduction="none")
    return (loss * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def stacked_passes(cohort: Cohort, members: list[Member], anchors: list[torch.Tensor], batch_size: int):
    """The members' models run together in eval mode, each on its own `anchors` (padded to the longest
    member's with repeats of its own, which weigh 0): per pass the logits, labels and row weights [K, B]."""
    was_training = cohort.model.training
    cohort.model.eval()
    rows = torch.tensor([cohort.row(m) for m in members], device=cohort.model.weights[0].device)
    longest = max(len(a) for a in anchors)
    passes = -(-longest // batch_size)
    batch_size = -(-longest // passes)  # as few passes, each as small as they allow: padding only to the longest
    try:
        for start in range(0, longest, batch_size):
            x, y, w = stacked_windows([(m, *padded(ids[start:start + batch_size], ids, batch_size))
                                       for m, ids in zip(members, anchors)])
            faults.before_stacked_pass(len(members))
            with torch.no_grad():
                logits = cohort.model(x, rows=rows)
            yield logits.float(), y, w
    finally:
        cohort.model.train(was_training)


def validation_losses(cohort: Rows, members: list[Member], batch_size: int) -> list[float]:
    """Each member's validation loss (the unweighted log loss over its labelled validation windows, as
    trainers.lstm.evaluate.validation_loss), the members' models run together on their own windows (on a
    CPU one after another: Cohort.stacked_evaluation)."""
    if not cohort.stacked_evaluation:
        return [validation_loss(cohort.member_model(m), m.data, batch_size) for m in members]
    return halving_on_out_of_memory(cohort, EVALUATION, "validation", len(members), lambda: [
        loss for group in groups(members, cohort.rows_per_pass[EVALUATION]) for loss in _stacked_validation_losses(
            cohort, group, batch_size)])


def _stacked_validation_losses(cohort: Cohort, members: list[Member], batch_size: int) -> list[float]:
    sums = torch.zeros(len(members), dtype=torch.float64, device=cohort.model.weights[0].device)
    for logits, labels, weights in stacked_passes(cohort, members, [m.data.ids["val"] for m in members], batch_size):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        sums += (loss * weights).sum(1).double()
    counts = torch.tensor([float(len(m.data.ids["val"])) for m in members], dtype=torch.float64)
    return (sums.cpu() / counts).tolist()  # one read for every member's value


def evaluation_logits(cohort: Cohort, members: list[Member], batch_size: int) -> list[list[np.ndarray]]:
    """Each member's logits on its `evaluation_anchors` (trainers.lstm.evaluate), the members' models run
    together (at most cohort.rows_per_pass[EVALUATION] at a time): a symbol's final evaluation costs the cohort's passes
    over the longest member's windows, not passes of its own (on a GPU, each a launch-bound model call), and
    one read to the host."""
    return [logits for group in groups(members, cohort.rows_per_pass[EVALUATION])
            for logits in _stacked_evaluation_logits(cohort, group, batch_size)]


def _stacked_evaluation_logits(cohort: Cohort, members: list[Member], batch_size: int) -> list[list[np.ndarray]]:
    sets = [evaluation_anchors(m.data) for m in members]
    anchors = [torch.cat(s) for s in sets]
    logits = torch.cat([out for out, _, _ in stacked_passes(cohort, members, anchors, batch_size)], dim=1).cpu()
    per_member = []
    for row, s in zip(logits.numpy(), sets):
        ends = np.cumsum([len(a) for a in s])
        per_member.append(np.split(row[:ends[-1]], ends[:-1]))
    return per_member


def train_cohort(cfg: LstmConfig, datas: list[SymbolData], worker: Worker, attempt: int
                 ) -> dict[str, SymbolOutcome | BaseException]:
    """Train the symbols of `datas` (one model shape) together; per symbol its outcome, or the error that
    took it out (the worker tries it again alone; without its traceback, whose frames hold the cohort's
    device memory). Out of device memory outside the halved passes (the members' data, the stack, a batch, the
    optimizer) or with one model a pass, the members still training leave with the error, and the worker's
    next cohorts take at most half as many symbols (Worker.max_cohort). On a broken CUDA context the members still
    training leave with its error as well (the worker then leaves: worker.DeviceLost); those that had finished
    keep their outcomes."""
    device = worker.device
    members = []
    worker.wind_down.handed_off()  # (its members that end trained are exported once it is over)
    try:
        for data in datas:
            scfg = symbol_config(cfg, data.symbol)
            data.to(device)
            members.append(Member(scfg, data, planned_steps(scfg, len(data.ids["train"]))))
        cohort = kernel_for(members, cfg, device, worker.rows_per_pass, worker.log)
        clock = dict.fromkeys(PHASES, 0.0)
    except RuntimeError as exc:
        if not device_mod.out_of_memory(exc) or len(datas) == 1:  # (alone: the symbol's own error, work_on's)
            raise
        worker.smaller_cohorts(len(datas), exc)
        return {data.symbol: exc.with_traceback(None) for data in datas}
    try:  # (a stop signal: each member's run hears it from the job's handler, runtime.stops.StopSignals)
        with timed(clock, "enter"):
            for m in members:
                _guarded(m, cohort, lambda m=m: _enter(m, cohort, cfg, worker))
        _train(cfg, members, cohort, worker, attempt, clock)
    except RuntimeError as exc:
        if not (device_mod.out_of_memory(exc) or device_mod.context_lost(exc, device)):
            raise
        _all_leave([m for m in members if not m.done], cohort, exc)
    finally:
        worker.rows_per_pass = dict(cohort.rows_per_pass)  # the worker's next cohorts start from the halved sizes
        for m in members:
            _close(m)
    if len(members) == 1:  # alone: its error with its traceback (work_on records it), no cohort's figures
        return {m.symbol: m.outcome if m.outcome is not None else m.error for m in members}
    if cohort.out_of_memory is not None:
        worker.smaller_cohorts(len(members), cohort.out_of_memory)
    for m in members:  # an equal share of each part: the parts are the cohort's, its members ran them together
        if m.outcome is not None:
            m.outcome.phase_seconds = {k: v / len(members) for k, v in clock.items()}
    return {m.symbol: m.outcome if m.outcome is not None else m.error.with_traceback(None) for m in members}


def kernel_for(members: list[Member], cfg: LstmConfig, device: torch.device, rows_per_pass: dict | None,
               log) -> Rows:
    """The models the loop steps: one symbol's own (Fused), else the members' stacked into one (Cohort)."""
    if len(members) == 1:
        return Fused(members[0], cfg, device, rows_per_pass, log)
    return Cohort(members, cfg, device, rows_per_pass, log)


def _enter(m: Member, cohort: Rows, cfg: LstmConfig, worker: Worker) -> None:
    m.run = m.exit.enter_context(Run(worker.once(m.cfg), single_process_context(str(worker.device)),
                                     RunSpec("lstm", cohort.states(m), m.total_steps, eval_every=cfg.eval_every)))
    worker.quiet_console(m.run.log)
    if cohort.size > 1 or worker.world_size > 1:  # one bar per symbol or per worker would fill the terminal
        m.run.quiet_progress()


@contextlib.contextmanager
def timed(clock: dict[str, float], part: str):
    """Host time inside, added to clock[part]. No device sync (Run.timing's clock waits for the device at both
    edges): these parts run every step, and a wait there would slow the loop it measures."""
    started = time.perf_counter()
    try:
        yield
    finally:
        clock[part] += time.perf_counter() - started


def _train(cfg: LstmConfig, members: list[Member], cohort: Rows, worker: Worker, attempt: int,
           clock: dict[str, float]) -> None:
    device = worker.device
    generator = torch.Generator(device=device)  # reseeded per member and step (stacked.stream_seed)
    fresh = []
    with timed(clock, "start"):
        for m in members:
            if not m.done:
                _guarded(m, cohort, lambda m=m: _start(m, cohort, worker, fresh))
        _evaluated(cohort, [m for m in fresh if not m.done], cfg.eval_batch_size, initial=True)
        _finish_together([m for m in members if not m.done and (m.step >= m.total_steps or m.ended)],  # resumed
                         cohort, cfg, worker, attempt)  # at or past its last step, or where it had stopped early
    worker.wind_down.started(time.perf_counter(), sum(not m.done for m in members))
    cohort.model.train()
    while any(not m.done for m in cohort.members):
        if sum(not m.done for m in cohort.members) <= len(cohort.members) // 2:
            cohort.shrink()  # (a Fused one never: its member's end ends the loop)
        stack = cohort.members
        stepping = time.perf_counter()
        losses = cohort.step(cfg, generator)
        stepped = [m for m in stack if not m.done]
        worker.wind_down.stepped(len(stepped), sum(m.step + 1 >= m.total_steps for m in stepped))
        spent = time.perf_counter() - stepping
        clock["steps"] += spent
        share = spent / len(stepped)
        passes = cohort.rows_per_pass[STEP]
        for m in stepped:
            m.step_seconds += share
            if passes is not None and passes < len(stack):
                m.rows_per_pass = min(m.rows_per_pass or passes, passes)
        due = []
        with timed(clock, "after_step"):
            for m in stepped:
                _guarded(m, cohort, lambda m=m: _after_step(m, losses[cohort.row(m)], worker, attempt, due))
        with timed(clock, "evaluation"):
            _evaluated(cohort, [m for m in due if not m.done], cfg.eval_batch_size)
        ending = []
        with timed(clock, "step_done"):
            for m in stepped:
                if not m.done:
                    _guarded(m, cohort, lambda m=m: _step_done(m, ending))
        with timed(clock, "finish"):
            _finish_together(ending, cohort, cfg, worker, attempt)


def _guarded(m: Member, cohort: Rows, work) -> None:
    """A member's own bookkeeping: an error there takes that member out, not the cohort."""
    try:
        work()
    except Exception as exc:  # noqa: BLE001 - one symbol's error must not stop the others (the worker retries it)
        m.error = exc
        _close(m)


def _all_leave(members: list[Member], cohort: Rows, exc: RuntimeError) -> None:
    """Out of device memory that halving the passes does not cure: every member still training leaves with the
    error, and the worker tries each alone (nn.LSTM's own kernels), where it trains or is recorded failed with
    the reason (train_cohort returns it without its traceback, unless the member was alone). A broken context: they leave with it too, for
    the worker to leave (no try in this process can succeed)."""
    if device_mod.out_of_memory(exc):
        cohort.out_of_memory = exc
    for m in members:
        m.error = exc
        _close(m)


def _close(m: Member) -> None:
    m.exit.close()
    if m.run is not None:
        close_handlers(m.run.log)  # its training.log closed: a worker opens hundreds of runs


def _start(m: Member, cohort: Rows, worker: Worker, fresh: list[Member]) -> None:
    m.run.log.info("lstm %s: %s parameters on %s%s; %s", m.symbol, f"{cohort.parameters:,}", worker.device,
                   f" in a cohort of {cohort.size}" if cohort.size > 1 else "",  # (lengths: no read from the device)
                   ", ".join(f"{split} {len(ids)}" for split, ids in m.data.ids.items()))
    start = m.run.resume()
    if start.resumed:
        worker.log.info("%s: resumed from checkpoint step %d", m.symbol, start.step)
    else:
        fresh.append(m)
    m.step, m.ended = start.step, start.ended
    m.cursor = EpochCursor(len(m.data.ids["train"]), 1, 0, m.cfg.batch_size, m.cfg.seed, device=worker.device,
                           **EpochCursor.start(start.position))
    m.window_loss = torch.zeros((), device=worker.device)


def _evaluated(cohort: Rows, members: list[Member], batch_size: int, initial: bool = False) -> None:
    if not members:
        return
    with contextlib.ExitStack() as timing:
        if not initial:  # left out of each run's step throughput (the untrained one comes before its clock starts)
            for m in members:
                timing.enter_context(m.run.timing("evaluation"))
        losses = validation_losses(cohort, members, batch_size)  # (out of memory: train_cohort)
    for m, loss in zip(members, losses):
        _guarded(m, cohort, lambda m=m, loss=loss: m.run.evaluated(0 if initial else m.step, loss, initial=initial))


def _after_step(m: Member, loss: torch.Tensor, worker: Worker, attempt: int, due: list[Member]) -> None:
    """What a symbol's loop does after its optimizer step (trainers.lstm.train), up to step_done."""
    m.step += 1
    m.loss = loss
    m.window_loss += loss * m.count
    m.window_count += m.count
    m.end_of_epoch = m.cursor.advance()
    if m.run.should_log(m.step):
        m.run.log_train(m.step, {"loss": float(m.window_loss) / m.window_count, "epoch": m.cursor.epoch})
        m.window_loss.zero_()
        m.window_count = 0
    if m.run.should_eval(m.step, m.end_of_epoch):
        due.append(m)  # evaluated with the others due at this step, in one pass
    worker.after_step(m.run, m.symbol, m.step, attempt)  # the job's stops and budget, the tests' raise hook


def _step_done(m: Member, ending: list[Member]) -> None:
    started = time.perf_counter()
    if m.run.step_done(m.step, m.cursor.position(), m.count, loss=m.loss) != StopReason.NONE:
        m.final_save_seconds = time.perf_counter() - started
        ending.append(m)


class FinalEvaluations:
    """The final evaluations of the members that end at one step, made together the first time one of
    them is asked for (inside that member's run.finish, after its training results are written, as a
    symbol trained alone): each member's best checkpoint restored into its row, their logits (on an
    accelerator the models run together, evaluation_logits; on a CPU each alone, symbol_logits), then each
    member's metrics on the host. Errors stay a member's own: a restore that fails, its data, its metrics;
    a stacked pass that fails (its memory, say) is made again member by member. A member whose run skips the
    evaluation (a signal, a divergence: StopReason.skips_evaluation) is left out."""

    def __init__(self, cohort: Rows, members: list[Member], batch_size: int, cost_bps: float, bins: int,
                 log=None):
        self.cohort, self.batch_size, self.cost_bps, self.bins, self.log = cohort, batch_size, cost_bps, bins, log
        self.members = [m for m in members if not m.run.reason.skips_evaluation]
        self.results: dict[int, dict | BaseException] | None = None

    def of(self, member: Member) -> dict:
        if self.results is None:
            self.results = self._evaluate()
        result = self.results[id(member)]
        if isinstance(result, BaseException):
            raise result
        return result

    def _evaluate(self) -> dict[int, dict | BaseException]:
        results: dict[int, dict | BaseException] = {}
        best = {}
        for m in [m for m in self.members if not m.done]:  # (one whose finish failed before is closed)
            try:
                best[id(m)] = m.run.restore_best()
            except Exception as exc:  # noqa: BLE001 - that member's error, raised in its own finish
                results[id(m)] = exc
        restored = [m for m in self.members if id(m) in best]
        together: dict[int, list[np.ndarray]] = {}
        if len(restored) > 1 and self.cohort.stacked_evaluation:
            try:
                together = dict(zip([id(m) for m in restored], halving_on_out_of_memory(
                    self.cohort, EVALUATION, "final evaluation", len(restored),
                    lambda: evaluation_logits(self.cohort, restored, self.batch_size))))
            except Exception as exc:  # noqa: BLE001 - made again member by member below, each error its own
                if self.log is not None:
                    self.log.warning("the final evaluation of %d cohort members together failed (%s: %s); evaluating "
                                     "them one by one", len(restored), type(exc).__name__, exc)
        for m in restored:
            try:
                logits = together[id(m)] if id(m) in together else \
                    symbol_logits(self.cohort.member_model(m), m.data, self.batch_size)  # alone
                evaluation = evaluate_logits(m.data, logits, self.cost_bps, self.bins)
                evaluation["checkpoint_step"] = best[id(m)]
                results[id(m)] = evaluation
            except Exception as exc:  # noqa: BLE001 - that member's error
                results[id(m)] = exc
        return results


def _finish_together(ending_now: list[Member], cohort: Rows, cfg: LstmConfig, worker: Worker, attempt: int) -> None:
    if not ending_now:
        return
    started = time.perf_counter()
    evaluations = FinalEvaluations(cohort, ending_now, cfg.eval_batch_size, cfg.cost_bps, cfg.calibration_bins,
                                   worker.log)
    for m in ending_now:
        _guarded(m, cohort, lambda m=m: _finish(m, cohort, cfg, worker, attempt, evaluations))
    worker.wind_down.ended(time.perf_counter() - started + sum(m.final_save_seconds for m in ending_now),
                           len(ending_now))
    if cfg.export:  # exported by the worker once the cohort is over (a symbol a stop ended is not)
        worker.wind_down.awaiting_export(sum(m.outcome is not None and m.outcome.reason not in STOPPED_UNFINISHED
                                             for m in ending_now))


def _finish(m: Member, cohort: Rows, cfg: LstmConfig, worker: Worker, attempt: int,
            evaluations: FinalEvaluations) -> None:
    """The member's end, as a symbol trained alone ends: its best checkpoint evaluated beside the baselines
    (with the others ending at this step), results written. It leaves the cohort (its row stays in the
    stack until the stack shrinks)."""
    run, data = m.run, m.data

    def evaluate() -> dict:
        evaluation = evaluations.of(m)
        log_symbol_summary(run.log, data.symbol, evaluation)
        return evaluation

    summary = {"data": data.info(), "preprocessing": data.preprocessing(),
               "model": {"n_features": data.n_features, "hidden": cfg.hidden, "layers": cfg.layers,
                         "parameters": cohort.parameters},
               "training": {"epoch": m.cursor.epoch, "steps_per_epoch": m.cursor.steps_per_epoch,
                            "pos_weight": data.pos_weight, "worker": worker.rank, "try": attempt,
                            **({"cohort": cohort.size} if cohort.size > 1 else {}),
                            **({"cohort_rows_per_pass": m.rows_per_pass} if m.rows_per_pass else {})}}
    results = run.finish(summary, evaluate=evaluate)
    m.outcome = SymbolOutcome(run.reason, run.signal_name, run.step, results, m.step_seconds)
    _close(m)
