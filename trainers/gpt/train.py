"""Train the char-level GPT (seed 004): build, resume, a flat loop, finish.

Each optimizer step reads this rank's windows of the endless stream (its own, never read twice in
a pass), gathers them from the token array on the device, runs `grad_accum` micro-steps under
autocast and steps AdamW with the learning rate of the schedule. The model is DDP-replicated or
FSDP2-sharded per block, by the memory estimate (trainers/gpt/size.py) or by `--parallel`. Stops
(steps, tokens, wall clock, money, signals, patience), checkpoints and results go through the run
boundary (trainers.runtime.run); the final evaluation restores the best checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.errors import UsageError
from trainers.gpt import size
from trainers.gpt.build import build_model, shape_of
from trainers.gpt.config import GptConfig
from trainers.gpt.data import (
    Corpus,
    WindowStream,
    check_vocab,
    default_prompt,
    device_tokens,
    load_corpus,
    markov_source,
    windows,
)
from trainers.gpt.evaluate import baselines, sample_text, summarise, validation_loss
from trainers.gpt.model import GPT, count_parameters, flops_per_token
from trainers.runtime import config as cfgmod
from trainers.runtime.device import gpu_like, total_memory
from trainers.runtime.dist import DistContext, all_reduce_max, all_reduce_sum, barrier, distributed, wrap_ddp
from trainers.runtime.files import atomic_write_json
from trainers.runtime.precision import (
    CompiledOrEager,
    Precision,
    autocast,
    build_adamw,
    compile_facts,
    enable_tf32,
    make_grad_scaler,
    precision_for,
)
from trainers.runtime.remote_pull import restore_from_remote
from trainers.runtime.run import Run, RunSpec
from trainers.runtime.stops import StopReason

VOCAB_FILE = "vocab.json"
SAMPLE_SEED = 1234  # the same sample prompt and seed at every evaluation: comparable lines


class Schedule:
    """The learning-rate multiplier: linear warmup over `warmup` steps, then a function of progress
    in [0, 1], the furthest of steps / max steps and the budget spent (agreed by all ranks at log
    points). wsd: stable at 1, then linear to `floor` over the last `cooldown` of progress; cosine:
    from 1 to `floor`. Checkpointed, so a resumed run continues the same curve."""

    def __init__(self, kind: str, warmup: int, total_steps: int | None, cooldown: float, floor: float):
        self.kind, self.warmup, self.total_steps, self.cooldown, self.floor = kind, warmup, total_steps, cooldown, floor
        self.budget_progress = 0.0

    def progress(self, step: int) -> float:
        by_steps = 0.0
        if self.total_steps:
            by_steps = (step - self.warmup) / max(1, self.total_steps - self.warmup)
        return min(1.0, max(0.0, by_steps, self.budget_progress))

    def factor(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        p = self.progress(step)
        if self.kind == "cosine":
            return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * p))
        if p <= 1.0 - self.cooldown:
            return 1.0
        return self.floor + (1.0 - self.floor) * (1.0 - p) / self.cooldown

    def state_dict(self) -> dict:
        return {"budget_progress": self.budget_progress}

    def load_state_dict(self, state: dict) -> None:
        self.budget_progress = float(state["budget_progress"])


class VocabState:
    """The vocabulary in every checkpoint; a resume that reads characters differently is refused."""

    def __init__(self, chars: list[str], run_dir: Path):
        self.chars, self.run_dir = chars, run_dir

    def state_dict(self) -> dict:
        return {"chars": list(self.chars)}

    def load_state_dict(self, state: dict) -> None:
        check_vocab(list(state["chars"]), self.chars, self.run_dir)


def total_steps_of(cfg: GptConfig) -> int | None:
    limits = [cfg.max_steps] if cfg.max_steps else []
    if cfg.max_tokens:
        limits.append(math.ceil(cfg.max_tokens / cfg.batch_tokens))
    return min(limits) if limits else None


def plan_layout(cfg: GptConfig, shape: size.Shape, ctx: DistContext, act_bytes: int) -> tuple[str, bool, list[dict]]:
    """(ddp | fsdp, activation checkpointing, the estimate's rows). `auto` takes the first layout the
    memory estimate fits on this GPU; on a CPU (no memory to fit) plain DDP without recomputation."""
    if cfg.parallel == "fsdp" and not ctx.distributed:
        raise UsageError("--parallel fsdp needs a process group: run under torchrun (even --nproc_per_node=1)")
    if cfg.parallel == "fsdp" and cfg.tie_embeddings:
        raise UsageError("--tie-embeddings works with --parallel ddp only (a tied matrix across FSDP units is not "
                         "supported here); leave it out or use ddp")
    gpu_bytes = total_memory(ctx.device)
    rows = size.table(shape, ctx.world_size, cfg.device_batch_size, gpu_bytes, act_bytes)
    options = size.layout_options(cfg.parallel, cfg.activation_checkpointing, cfg.tie_embeddings, ctx.world_size,
                                  ctx.distributed)
    fitting = options
    if gpu_bytes is not None:
        fitting = [o for o in options if size.memory_per_gpu(shape, o, ctx.world_size, cfg.device_batch_size,
                                                             act_bytes).total <= gpu_bytes]
        if not fitting:
            all_rows = size.table(shape, ctx.world_size, cfg.device_batch_size, gpu_bytes, act_bytes)
            raise UsageError(f"depth {cfg.depth} ({shape.parameters() / 1e9:.2f}B parameters) does not fit "
                             f"{gpu_bytes / size.GIB:.0f} GiB per GPU with {', '.join(options)} at "
                             f"--device-batch-size {cfg.device_batch_size} on {ctx.world_size} GPU(s) (estimate: "
                             f"{size.describe(all_rows)}); use a smaller --device-batch-size, more GPUs, "
                             f"--parallel auto or a smaller --depth")
    layout = fitting[0]
    return layout.split("+")[0], layout.endswith("+ac"), rows


def wrap(model: GPT, parallel: str, checkpointing: bool, compile_blocks: bool, ctx: DistContext, precision):
    """Recomputation, compilation and sharding, in torchtitan's order (on the meta device, before
    the weights exist): activation checkpointing per block, torch.compile per block (one graph
    serves every layer), then FSDP2 per block and at the root."""
    model.checkpoint_blocks = checkpointing
    if compile_blocks:
        for block in model.blocks:
            block.compile()
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mp = MixedPrecisionPolicy(param_dtype=precision.autocast_dtype, reduce_dtype=torch.float32) \
            if precision.autocast_dtype is not None else MixedPrecisionPolicy()
        for block in model.blocks:
            fully_shard(block, mp_policy=mp)
        fully_shard(model, mp_policy=mp)
    return model


def eager_when_compile_fails(model: GPT, log) -> CompiledOrEager:
    """The compiled blocks' fallback: the model's forward (whose blocks compile at their first call, the backward
    with them) under CompiledOrEager. A compile that fails in any block, at the first evaluation, the first
    training step or a later recompile, runs that forward again eager, and every call after it: torch.compiler's
    force_eager stance, set for the rest of the process, so activation checkpointing's recomputation in the
    backward runs eager too. FSDP2's hook had unsharded the failed block's weights before its compile; the eager
    call finds them unsharded and reshards them after, as any forward does (tested on two ranks)."""
    forward = model.forward

    def eager(*args, **kwargs):
        torch.compiler.set_stance("force_eager")
        return forward(*args, **kwargs)
    model.forward = CompiledOrEager(forward, eager, log, off_flag="--compile off")
    return model.forward


def every_rank_compiles(ctx: DistContext, failures: tuple) -> str | None:
    """FSDP2's ranks cannot run a block some compiled and some eager (their collectives differ: two ranks
    crashed on gloo's size check when one fell back in the training graph), so before the first forward each
    rank compiles a tiny function's forward and backward with inductor on its device, and the ranks agree.
    None when every rank can; else why not, with the first rank that cannot (no C compiler or triton there)."""
    from trainers.runtime.dist import all_gather_object

    error = None
    try:
        x = torch.ones(4, device=ctx.device, requires_grad=True)
        torch.compile(lambda t: (t * 2.0).sin().sum())(x).backward()
    except failures as exc:
        error = str(exc)  # (CompiledOrEager.fall_back trims it for the log and results.json)
    every = all_gather_object(ctx, error)
    failed = [rank for rank, e in enumerate(every) if e]
    return f"rank {failed[0]} cannot compile, so no rank does (FSDP2): {every[failed[0]]}" if failed else None


COMPILED_FSDP_RECOMPUTE_FROM = (2, 13)  # the oldest torch seen to recompute a compiled FSDP2 block as its forward did


def recompute_refused(checkpointing: bool) -> str | None:
    """Why a compiled FSDP2 block with activation checkpointing must train eager on this torch, or None. torch 2.7's
    recomputation in the backward met other tensors than the compiled forward saved (CheckpointError: "Recomputed
    values ... have different metadata"; the floor pass's gpt-fsdp contract); 2.13's does not, and the versions
    between are untested, so they are taken as 2.7 is. The same on every rank (the same torch)."""
    from trainers.versions import release

    if not checkpointing or release(torch.__version__)[:2] >= COMPILED_FSDP_RECOMPUTE_FROM:
        return None
    return (f"torch {torch.__version__} recomputes a compiled FSDP2 block with other tensors than its forward saved "
            f"(CheckpointError), so this run trains eager; torch>={'.'.join(map(str, COMPILED_FSDP_RECOMPUTE_FROM))} "
            f"compiles it, and so does --activation-checkpointing off")


def materialise(model: GPT, parallel: str, seed: int, ctx: DistContext) -> None:
    """Allocate the weights on the device and draw them. DDP: the same draw on every rank. FSDP:
    each rank draws its own shards (a stream per rank), so no rank ever holds the full model."""
    model.to_empty(device=ctx.device)
    model.tie_weights()
    model.reset_buffers()
    g = torch.Generator(ctx.device).manual_seed(seed if parallel == "ddp" else seed * 1_000 + ctx.rank + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            local = p.to_local() if hasattr(p, "to_local") else p
            local.normal_(0.0, model.init_std(name), generator=g)


def resolve(cfg: GptConfig, run_dir: Path) -> GptConfig:
    """The run's options, settled once at its entry: the saved run's checked against them (a different config is
    refused; nothing is pinned: the GPT's sizes are the user's or the defaults); a read-only copy from here."""
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    return cfg.replaced().settled()


def train(cfg: GptConfig, started_at: float | None = None) -> dict | None:
    """`started_at`: when the process began (the budget counts from there)."""
    started_at = time.time() if started_at is None else started_at
    cfg.validate()
    cfg.check_end()
    # (the stance a compile fallback sets ends with the run: a process that runs another job compiles again)
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx, torch.compiler.set_stance("default"):
        return _train(cfg, ctx, started_at)


def _train(cfg: GptConfig, ctx: DistContext, started_at: float) -> dict | None:
    # Every check that can refuse the input runs before the first write into the run folder.
    run_dir = Path(cfg.run_dir)
    restore_from_remote(cfg.remote, run_dir, ctx, cfg)  # a fresh machine: the remote's run first
    cfg = resolve(cfg, run_dir)
    precision = precision_for(ctx.device, cfg.precision, cfg.gpu_defaults)
    if precision.needs_grad_scaler and cfg.parallel == "fsdp":
        raise UsageError("--parallel fsdp needs bf16 (an Ampere or newer GPU); fp16 with a grad scaler is DDP only")
    corpus, train_np, val_np = load_splits(cfg, run_dir, ctx)
    layout = layout_for(cfg, len(corpus.vocab), ctx, precision)
    total_steps = total_steps_of(cfg)
    states: dict = {}  # filled once the run folder is ours (a check-only start never builds the model)
    sharded: dict = {}

    with Run(cfg, ctx, RunSpec("gpt", states, total_steps, unit="tokens", metric_name="loss",
                               eval_every=cfg.eval_every, flops_per_item=layout.shape.flops_per_token(),
                               started_at=started_at, data_fingerprint=corpus.fingerprint, sharded_states=sharded,
                               budget_includes_startup=True)) as run:
        log = run.log
        if ctx.is_main and not (run_dir / VOCAB_FILE).exists():
            atomic_write_json(run_dir / VOCAB_FILE, {"chars": corpus.vocab, "fingerprint": corpus.fingerprint})
        model, compiled = built(cfg, len(corpus.vocab), layout, ctx, log)
        optimizer = build_adamw(model, cfg.lr, cfg.weight_decay, (0.9, cfg.beta2), ctx.device, cfg.gpu_defaults)
        steps = Steps(model, optimizer, make_grad_scaler(ctx.device, precision), precision, layout.accum,
                      cfg.device_batch_size, cfg.seq_len, cfg.grad_clip, ctx.device)
        schedule = Schedule(cfg.schedule, cfg.warmup_steps, total_steps, cfg.cooldown_frac, cfg.min_lr_ratio)
        states.update(schedule=schedule, vocab=VocabState(corpus.vocab, run_dir), scaler=steps.scaler)
        if layout.parallel == "fsdp":
            from trainers.runtime.sharded import ShardedModel, ShardedOptimizer

            sharded.update(model=ShardedModel(model), optimizer=ShardedOptimizer(model, optimizer))
        else:
            states.update(model=model, optimizer=optimizer)
        log.info("gpt: %s", layout.text(cfg, count_parameters(model), total_steps, ctx))
        log.info("%s", corpus_text(corpus, len(train_np), len(val_np)))
        log.info("batch: %s", layout.batch_text(cfg, ctx))

        # count models on the same windows, computed once (their cost belongs to the startup, not the end)
        base = baselines(train_np, val_np, len(corpus.vocab), cfg.seq_len, cfg.eval_tokens) if ctx.is_main else None
        if ctx.is_main:
            log.info("baselines on the validation windows (nats/char): %s",
                     {k: round(v, 4) for k, v in base.items() if v is not None})
        start = run.resume()
        stream = WindowStream(len(train_np), cfg.seq_len, ctx.world_size, ctx.rank, cfg.device_batch_size *
                              layout.accum, cfg.seed, ctx.device, **WindowStream.start(start.position,
                                                                                       start.position_rank0))
        tokens = device_tokens(train_np, ctx.device)
        check = Validation(model, device_tokens(val_np, ctx.device), torch.from_numpy(corpus.utf8_bytes).to(ctx.device),
                           cfg.seq_len, cfg.eval_tokens, cfg.device_batch_size, ctx, precision, corpus.vocab,
                           cfg.sample_chars)

        def evaluate_now(step: int, initial: bool = False) -> float:
            result = check.loss()
            extra = check.reported(result, corpus.floor)
            run.metrics.log(step, "eval", extra)
            if "sample" in extra:
                log.info("step %d sample: %r", step, extra["sample"][:120])
            run.evaluated(step, result["loss"], initial=initial)
            return result["loss"]

        if not start.resumed:
            with run.timing("evaluation"):
                evaluate_now(0, initial=True)
        steps.for_training(layout.parallel, ctx)

        step = start.step
        window_loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
        window_micro = 0
        model.train()
        while (total_steps is None or step < total_steps) and not start.ended:
            lr = cfg.lr * schedule.factor(step)
            steps.step(tokens, stream.batch(), lr, window_loss)
            window_micro += layout.accum
            step += 1
            stream.advance()

            if run.should_log(step):
                loss_sum, micro_count = all_reduce_sum(ctx, [float(window_loss), float(window_micro)])
                # the schedule follows the budget too: every rank takes the furthest clock
                schedule.budget_progress = all_reduce_max(ctx, [run.stopper.budget_fraction()])[0]
                run.log_train(step, {"loss": loss_sum / micro_count, "lr": lr, "tokens_seen": step * cfg.batch_tokens,
                                     "pass": stream.pass_index})
                window_loss.zero_()
                window_micro = 0
            if run.should_eval(step):
                with run.timing("evaluation"):
                    evaluate_now(step)
            if run.step_done(step, stream.position(), cfg.batch_tokens, loss=window_loss) != StopReason.NONE:
                break

        if not run.reason.skips_evaluation:  # (after a signal or a failure no evaluation runs, as in run.finish)
            with run.timing("evaluation"):  # before the summary and results.json's training section are written
                score_the_last_checkpoint(run, ctx, lambda: check.loss()["loss"])
        summary = summary_of(cfg, corpus, layout.shape, len(train_np), len(val_np), model, run, stream,
                             layout.facts(compiled, ctx))
        return run.finish(summary, evaluate=lambda: final_evaluation(run, check, base, corpus.floor, ctx))


def load_splits(cfg: GptConfig, run_dir: Path, ctx: DistContext) -> tuple[Corpus, np.ndarray, np.ndarray]:
    """The corpus (its vocabulary checked against the run folder's), its training and validation splits; refused
    when the training split cannot fill one step."""
    saved_vocab = json.loads((run_dir / VOCAB_FILE).read_text())["chars"] if (run_dir / VOCAB_FILE).exists() else None
    corpus = load_corpus(cfg.data, cfg.cache_dir, cfg.seq_len, cfg.val_frac, markov_source(cfg), cfg.synthetic_chars,
                         log=print if ctx.is_main else (lambda _msg: None),
                         check_vocab_of=lambda vocab: saved_vocab is None or check_vocab(saved_vocab, vocab, run_dir))
    train_np, val_np = corpus.split(cfg.val_frac)
    per_rank = cfg.device_batch_size * cfg.grad_accum(ctx.world_size)
    if WindowStream.steps_in_pass(len(train_np), cfg.seq_len, ctx.world_size * per_rank, cfg.seq_len - 1) < 1:
        raise UsageError(f"the training split ({len(train_np):,} characters) cannot fill one step of --batch-tokens "
                         f"{cfg.batch_tokens}; use a smaller --batch-tokens or --seq-len, or more text")
    return corpus, train_np, val_np


def corpus_text(corpus: Corpus, n_train: int, n_val: int) -> str:
    return (f"data: {corpus.source['kind']}, {len(corpus.tokens):,} characters, vocabulary {len(corpus.vocab)}, "
            f"train/val {n_train:,}/{n_val:,} tokens" +
            (f"; entropy floor {corpus.floor['window_floor_nats']:.4f} nats/char" if corpus.floor else ""))


@dataclass(frozen=True)
class Layout:
    """How the steps run on these ranks: the model's shape, DDP or FSDP2 with or without recomputation (by the
    memory estimate, `memory`), compiled blocks or not, the precision and the accumulation."""
    shape: size.Shape
    parallel: str
    checkpointing: bool
    memory: list[dict]
    compile_blocks: bool
    precision: Precision
    tf32: bool
    accum: int

    def text(self, cfg: GptConfig, n_params: int, total_steps: int | None, ctx: DistContext) -> str:
        per_param = 0.0 if not total_steps else total_steps * cfg.batch_tokens / n_params
        return (f"depth {cfg.depth}, dim {self.shape.dim}, {self.shape.heads} heads of {cfg.head_dim}, {n_params:,} "
                f"parameters ({per_param:.2f} tokens/param at the end: {'by steps' if total_steps else 'by budget'}), "
                f"{self.shape.flops_per_token():.3g} FLOPs/token; {self.parallel}"
                f"{' + activation checkpointing' if self.checkpointing else ''} on {ctx.world_size} {ctx.device.type} "
                f"rank(s), precision {self.precision.name}{', TF32' if self.tf32 else ''}"
                f"{', compiled blocks' if self.compile_blocks else ''}")

    def batch_text(self, cfg: GptConfig, ctx: DistContext) -> str:
        return (f"{cfg.batch_tokens} tokens = {ctx.world_size} rank(s) x {cfg.device_batch_size} sequences x "
                f"{cfg.seq_len} tokens x {self.accum} accumulation steps; memory estimate per GPU: "
                f"{size.describe(self.memory)}")

    def facts(self, compiled: CompiledOrEager | None, ctx: DistContext) -> dict:
        """results.json's record of the layout (collective: whether every rank's blocks compiled)."""
        return {"parallel": self.parallel, "activation_checkpointing": self.checkpointing,
                **compile_facts(compiled, ctx), "precision": self.precision.name, "grad_accum": self.accum,
                "memory_estimate": self.memory}


def layout_for(cfg: GptConfig, vocab_size: int, ctx: DistContext, precision: Precision) -> Layout:
    shape = shape_of(cfg, vocab_size)
    act_bytes = 2 if precision.autocast_dtype is not None else 4
    parallel, checkpointing, memory = plan_layout(cfg, shape, ctx, act_bytes)
    compile_blocks = cfg.compile == "on" or (cfg.compile == "auto" and gpu_like(ctx.device, cfg.gpu_defaults))
    return Layout(shape, parallel, checkpointing, memory, compile_blocks, precision, enable_tf32(ctx.device),
                  cfg.grad_accum(ctx.world_size))


def built(cfg: GptConfig, vocab_size: int, layout: Layout, ctx: DistContext, log) -> tuple[GPT,
                                                                                            CompiledOrEager | None]:
    """The model built on the meta device, wrapped (recomputation, compiled blocks, FSDP2), its weights drawn on the
    device; with compiled blocks, the fallback that runs them eager (on every rank alike under FSDP2)."""
    with torch.device("meta"):
        model = build_model(cfg, vocab_size)
    wrap(model, layout.parallel, layout.checkpointing, layout.compile_blocks, ctx, layout.precision)
    materialise(model, layout.parallel, cfg.seed, ctx)
    compiled = eager_when_compile_fails(model, log) if layout.compile_blocks else None
    if compiled is not None and layout.parallel == "fsdp" and ctx.distributed:
        refused = every_rank_compiles(ctx, compiled.failures) or recompute_refused(layout.checkpointing)
        if refused:
            compiled.fall_back(refused)
    return model, compiled


@dataclass
class Steps:
    """One optimizer step: `accum` micro-steps on this rank's windows under autocast, the gradients (all-reduced on
    the last micro-step under DDP) clipped, AdamW stepped through the grad scaler."""
    model: GPT
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    precision: Precision
    accum: int
    batch_size: int
    seq_len: int
    grad_clip: float
    device: torch.device
    train_model: torch.nn.Module | None = None  # the model or its DDP wrapper (for_training)

    def for_training(self, parallel: str, ctx: DistContext) -> None:
        if ctx.distributed and parallel == "ddp":
            # not a static graph: the step's graph is the same, but compiled blocks were never tried with one
            self.train_model = wrap_ddp(self.model, ctx, accumulates=self.accum > 1, static_graph=False)
        else:
            self.train_model = self.model

    def step(self, tokens: torch.Tensor, starts: torch.Tensor, lr: float, losses: torch.Tensor) -> None:
        """`losses` (on the device: read at the log's cadence only) gains each micro-step's loss, detached."""
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        for micro in range(self.accum):
            x, y = windows(tokens, starts[micro * self.batch_size:(micro + 1) * self.batch_size], self.seq_len)
            with gradient_sync(self.train_model, micro == self.accum - 1):
                with autocast(self.device, self.precision):
                    loss = self.train_model(x, y)
                self.scaler.scale(loss / self.accum).backward()
            losses += loss.detach()
        if self.grad_clip > 0:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Validation:
    """The held-out split on the device, and what an evaluation reports beside its loss."""
    model: GPT
    val: torch.Tensor
    utf8: torch.Tensor
    seq_len: int
    eval_tokens: int
    batch_size: int
    ctx: DistContext
    precision: Precision
    vocab: list[str]
    sample_chars: int

    def loss(self) -> dict:
        """Collective: {loss (nats/char), bpc, bpb, tokens}."""
        return validation_loss(self.model, self.val, self.seq_len, self.eval_tokens, self.batch_size, self.ctx,
                               self.precision, self.utf8)

    def sample(self) -> str:
        prompt = default_prompt(self.vocab)
        return prompt + sample_text(self.model, self.vocab, prompt, self.sample_chars, SAMPLE_SEED)

    def reported(self, result: dict, floor: dict | None) -> dict:
        extra = {"bpc": result["bpc"], "bpb": result["bpb"], "tokens": result["tokens"]}
        if floor:
            extra["gap_to_floor_nats"] = result["loss"] - floor["window_floor_nats"]
        if self.sample_chars and math.isfinite(result["loss"]):  # a diverged model has no distribution to sample
            extra["sample"] = self.sample()
        return extra


def final_evaluation(run: Run, check: Validation, base: dict | None, floor: dict | None, ctx: DistContext
                     ) -> dict | None:
    """Collective: the best checkpoint restored and scored beside the baselines (rank 0's record)."""
    best = run.restore_best()
    result = check.loss()
    samples = [check.sample()] if check.sample_chars else []
    evaluation = None
    if ctx.is_main:
        evaluation = summarise(result, base, floor, best)
        evaluation["samples"] = samples
        run.log.info("final: val %.4f nats/char (%.4f bpc) at step %s; baselines %s%s", result["loss"], result["bpc"],
                     best, {k: round(v, 4) for k, v in evaluation["baselines_nats"].items() if v},
                     f"; entropy floor {floor['window_floor_nats']:.4f}" if floor else "")
    barrier(ctx)
    return evaluation


def score_the_last_checkpoint(run: Run, ctx: DistContext, measure) -> None:
    """The newest checkpoint (the stop's) is unscored unless the evaluation cadence hit its step (a budget's end,
    where the steps are not known); at the end of a wsd cooldown it is often the best. Collective: `measure()` (the
    validation loss) goes into the run's validation record (results.json's best and last) and into its meta (what
    `best` picks from). It went into the meta alone, so a run's best_val said step 1400 while the step 1594 it
    loaded scored lower."""
    newest = run.ckpt.manager.complete_steps()[:1]
    if not newest or (run.ckpt.manager.meta(newest[0]) or {}).get("metric") is not None:
        return
    loss = measure()
    run.val.update(newest[0], loss, run.metric_name, run.log, run.metrics)
    if ctx.is_main:
        run.ckpt.manager.record_metric(newest[0], loss)
    barrier(ctx)


def gradient_sync(train_model, sync: bool):
    """DDP all-reduces gradients only on the last micro-step of an optimizer step. FSDP2
    reduce-scatters every micro-step: skipping it would keep unsharded gradients of the whole
    model, the memory sharding exists to save."""
    if sync or not isinstance(train_model, DDP):
        return contextlib.nullcontext()
    return train_model.no_sync()


def summary_of(cfg, corpus: Corpus, shape: size.Shape, n_train: int, n_val: int, model, run, stream: WindowStream,
               layout: dict) -> dict:
    """results.json's data, model and training records; `layout`: how the steps ran (parallelism, activation
    checkpointing, compile, precision, accumulation, the memory estimate)."""
    data = {**corpus.source, "fingerprint": corpus.fingerprint, "vocab_size": len(corpus.vocab),
            "train_tokens": n_train, "val_tokens": n_val, "val_frac": cfg.val_frac,
            "skipped_empty_files": corpus.skipped}
    if corpus.floor:
        data["entropy_floor"] = corpus.floor
    tokens_seen = run.step * cfg.batch_tokens
    return {"data": data,
            "model": {"parameters": count_parameters(model), "nominal_12_L_d2": shape.nominal_parameters(),
                      "flops_per_token": flops_per_token(model, cfg.seq_len), "depth": cfg.depth, "dim": shape.dim,
                      "heads": shape.heads, "head_dim": cfg.head_dim, "seq_len": cfg.seq_len,
                      "positions": cfg.positions, "tie_embeddings": cfg.tie_embeddings,
                      "vocab_size": len(corpus.vocab)},
            "training": {"tokens_seen": tokens_seen, "tokens_per_parameter": tokens_seen / count_parameters(model),
                         "best_val_bpc": run.val.best / math.log(2) if run.val.best is not None else None,
                         "best_val_step": run.val.best_step,
                         "entropy_floor_nats": corpus.floor["window_floor_nats"] if corpus.floor else None,
                         **layout, "batch_tokens": cfg.batch_tokens, "device_batch_size": cfg.device_batch_size,
                         "stream": stream.position(), "schedule": cfg.schedule}}
