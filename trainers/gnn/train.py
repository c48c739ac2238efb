"""Train the graph-coloring GNN (seed 002, done right) with DDP over graphs: build, resume, a flat
loop, finish.

Every rank takes its share of the graphs each epoch (each graph once per epoch across ranks); the
loss is the expected fraction of conflicting edges per graph (Potts), averaged over the global
batch. Stops, checkpoints and results go through the run boundary (trainers.runtime.run); the
final evaluation colors the benchmark and validation graphs with the best checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.gnn.batch import batch_loss
from trainers.gnn.config import GnnConfig
from trainers.gnn.evaluate import evaluate, markdown_table, validation_loss
from trainers.gnn.graphs import GraphSplit
from trainers.gnn.model import ColoringGNN
from trainers.runtime import config as cfgmod
from trainers.runtime.dist import DistContext, all_reduce_sum, distributed
from trainers.runtime.precision import build_adamw
from trainers.runtime.run import Run
from trainers.runtime.sampling import EpochCursor
from trainers.runtime.stops import StopReason


def build_model(cfg: GnnConfig) -> ColoringGNN:
    return ColoringGNN(cfg.in_dim, cfg.hidden, cfg.layers, cfg.max_colors, cfg.dropout)


def graph_seed(cfg: GnnConfig, epoch: int, index: int) -> int:
    """Random features: fresh each epoch in training (an augmentation), fixed by the seed."""
    return cfg.seed * 1_000_003 + epoch * 100_003 + index


def train(cfg: GnnConfig) -> dict | None:
    started_at = time.time()
    cfg.validate()
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx:
        return _train(cfg, ctx, started_at)


def _train(cfg: GnnConfig, ctx: DistContext, started_at: float) -> dict | None:
    run_dir = Path(cfg.run_dir)
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    train_set, val_set = GraphSplit(Path(cfg.data_dir), "train"), GraphSplit(Path(cfg.data_dir), "val")
    cursor = EpochCursor(len(train_set), ctx.world_size, ctx.rank, cfg.graphs_per_batch, cfg.seed)
    total_steps = cfg.epochs * cursor.steps_per_epoch

    torch.manual_seed(cfg.seed)  # identical init on every rank
    model = build_model(cfg).to(ctx.device)
    n_params = sum(p.numel() for p in model.parameters())
    # AdamW without decay on biases and norms (weight decay is 0 by default, so this matches plain AdamW)
    optimizer = build_adamw(model, cfg.lr, cfg.weight_decay, (0.9, 0.999), ctx.device)

    with Run(cfg, ctx, "gnn", {"model": model, "optimizer": optimizer}, total_steps, unit="graphs",
             metric_name="conflict_fraction", started_at=started_at, data_fingerprint=train_set.fingerprint) as run:
        run.log.info("gnn: %s parameters, %d rank(s) on %s; %d train / %d val graphs; %d steps per epoch",
                     f"{n_params:,}", ctx.world_size, ctx.device.type, len(train_set), len(val_set),
                     cursor.steps_per_epoch)
        start = run.resume()
        cursor = EpochCursor(len(train_set), ctx.world_size, ctx.rank, cfg.graphs_per_batch, cfg.seed,
                             **EpochCursor.start(start.position, start.position_rank0))
        train_model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None) \
            if ctx.distributed else model

        step = start.step
        window_frac = torch.zeros((), dtype=torch.float64, device=ctx.device)
        window_graphs = 0
        model.train()
        while step < total_steps:
            positions, global_count = cursor.batch()
            idx = positions.tolist()
            loss, frac = batch_loss(train_model, [train_set[i] for i in idx], cfg.max_colors, cfg.random_features,
                                    [graph_seed(cfg, cursor.epoch, i) for i in idx], ctx.device,
                                    ctx.world_size / global_count)
            loss.backward()
            if cfg.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            window_frac += frac
            window_graphs += len(idx)
            end_of_epoch = cursor.advance()

            if run.should_log(step):
                total, count = all_reduce_sum(ctx, [float(window_frac), float(window_graphs)])
                run.log_train(step, {"conflict_fraction": total / count, "epoch": cursor.epoch})
                window_frac.zero_()
                window_graphs = 0
            if run.should_eval(step, end_of_epoch):
                with run.timing("evaluation"):
                    run.evaluated(step, validation_loss(model, val_set, cfg, ctx))
            if run.step_done(step, cursor.position(), global_count) != StopReason.NONE:
                break

        def final_evaluation() -> dict | None:
            best = run.restore_best()
            evaluation = evaluate(model, cfg, val_set, ctx)
            if ctx.is_main:
                evaluation["checkpoint_step"] = best
                (run_dir / "results.md").write_text(markdown_table(evaluation))
            return evaluation

        summary = {"data": {"data_dir": str(Path(cfg.data_dir).resolve()), "train_graphs": len(train_set),
                            "val_graphs": len(val_set), "fingerprint": train_set.fingerprint},
                   "model": {"parameters": n_params, "hidden": cfg.hidden, "layers": cfg.layers,
                             "max_colors": cfg.max_colors},
                   "training": {"epoch": cursor.epoch, "steps_per_epoch": cursor.steps_per_epoch}}
        return run.finish(summary, evaluate=final_evaluation)

