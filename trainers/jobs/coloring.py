"""Graph colouring GNN (seed 002, done right): Potts loss, DDP over graphs, repair, baselines.

The loop mirrors the forecaster's: every rank takes its share of the graphs each epoch (each graph
once per epoch across ranks), the loss is the expected fraction of conflicting edges per graph
averaged over the global batch, stops are agreed by all ranks, checkpoints go through the manager.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from trainers.coloring import N_DEGREE_FEATURES, classical, make_batch, repair
from trainers.data.graphs import Graph, GraphSplit, benchmark_set, conflicts
from trainers.data.sharding import EpochPlan
from trainers.errors import UsageError
from trainers.models.gnn import ColoringGNN, potts_conflicts
from trainers.runtime import config as cfgmod
from trainers.runtime.checkpoint import CheckpointManager, atomic_write_json
from trainers.runtime.config import option
from trainers.runtime.dist import DistContext, all_gather_object, all_reduce_sum, barrier, distributed
from trainers.runtime.faults import maybe_inject
from trainers.runfiles import open_run_dir
from trainers.runtime.info import git_commit, run_facts, versions
from trainers.runtime.logs import progress
from trainers.runtime.options import RunOptions
from trainers.runtime.stops import EarlyStopping, StopAgreement, StopReason


@dataclass
class ColoringConfig(RunOptions):
    run_dir: str = option("runs/gnn", "run folder (resumed if it holds a run)")
    data_dir: str = option("data/graphs", "graph dataset written by `trainers gnn-data`", resume_safe=True)
    hidden: int = option(64, "hidden width")
    layers: int = option(4, "message-passing layers")
    max_colors: int = option(16, "most colours the model can offer (per graph: the greedy bound, capped)")
    random_features: int = option(8, "random node features that break symmetry")
    dropout: float = option(0.0, "dropout on the residual branches")
    epochs: int = option(20, "passes over the training graphs")
    graphs_per_batch: int = option(16, "graphs per rank per step (one block-diagonal batch)")
    lr: float = option(3e-3, "AdamW learning rate")
    weight_decay: float = option(0.0, "AdamW weight decay")
    grad_clip: float = option(1.0, "clip the gradient norm (0: off)")
    seed: int = option(0, "seed of init, shuffling and random features")
    patience: int = option(5, "early stop after this many epochs without validation improvement (0: off)",
                           resume_safe=True)

    def validate(self) -> None:
        self.validate_run_options()
        for name in ("hidden", "layers", "epochs", "graphs_per_batch"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.max_colors < 2:
            raise UsageError(f"--max-colors {self.max_colors} must be >= 2")
        if self.random_features < 0 or self.lr <= 0 or not 0 <= self.dropout < 1:
            raise UsageError("--random-features must be >= 0, --lr > 0 and --dropout in [0, 1)")

    @property
    def in_dim(self) -> int:
        return N_DEGREE_FEATURES + self.random_features


def build_gnn(cfg: ColoringConfig) -> ColoringGNN:
    return ColoringGNN(cfg.in_dim, cfg.hidden, cfg.layers, cfg.max_colors, cfg.dropout)


def graph_seed(cfg: ColoringConfig, epoch: int, index: int) -> int:
    """Random features: fresh each epoch in training (an augmentation), fixed by the seed."""
    return cfg.seed * 1_000_003 + epoch * 100_003 + index


def batch_loss(model, graphs: list[Graph], cfg, seeds, device, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sum over graphs of (expected conflicting edges / edges), times `scale`; and that sum unscaled."""
    b = make_batch(graphs, cfg.max_colors, cfg.random_features, seeds, device)
    probs = torch.softmax(model(b.x, b.edge_index, b.colour_mask), dim=-1)
    per_edge = potts_conflicts(probs, b.edge_index)  # each undirected edge appears twice
    per_graph = torch.zeros(len(graphs), device=device).index_add(0, b.edge_graph, per_edge) / 2.0
    frac = per_graph / b.edges_per_graph.clamp(min=1.0)
    return frac.sum() * scale, frac.detach().sum()


@torch.no_grad()
def colour_graph(model, g: Graph, cfg: ColoringConfig, seed: int, device) -> dict:
    t0 = time.perf_counter()
    b = make_batch([g], cfg.max_colors, cfg.random_features, [seed], device)
    raw = model(b.x, b.edge_index, b.colour_mask).argmax(-1).cpu().numpy()
    model_s = time.perf_counter() - t0
    fixed = repair(g, raw)
    total_s = time.perf_counter() - t0
    return {"offered": b.offered[0], "colours_before": int(len(np.unique(raw))), "conflicts_before": conflicts(g.edges, raw),
            "colours": int(fixed.max() + 1) if g.n else 0, "conflicts": conflicts(g.edges, fixed),
            "model_s": model_s, "total_s": total_s, "colouring": fixed}


def evaluate(model, cfg: ColoringConfig, val: GraphSplit | None, ctx: DistContext, device) -> dict | None:
    """Benchmark set + validation split, sharded over ranks, gathered on rank 0."""
    model.eval()
    bench = benchmark_set()
    jobs = [("benchmark", i) for i in range(len(bench))] + ([("val", i) for i in range(len(val))] if val else [])
    rows = []
    for kind, i in jobs[ctx.rank::ctx.world_size]:
        g = bench[i] if kind == "benchmark" else val[i]
        r = colour_graph(model, g, cfg, seed=10_000 + i, device=device)
        r.pop("colouring")
        r.update(kind=kind, name=g.name, nodes=g.n, edges=g.n_edges, chromatic=g.chromatic, upper_k=g.upper_k,
                 classical=classical(g))
        rows.append(r)
    gathered = all_gather_object(ctx, rows)
    model.train()
    if not ctx.is_main:
        return None
    rows = [r for part in gathered for r in part]
    bench_rows = sorted((r for r in rows if r["kind"] == "benchmark"), key=lambda r: r["name"])
    val_rows = [r for r in rows if r["kind"] == "val"]
    summary = {}
    if val_rows:
        summary = {"graphs": len(val_rows),
                   "mean_colours": float(np.mean([r["colours"] for r in val_rows])),
                   "mean_dsatur_colours": float(np.mean([r["classical"]["dsatur"]["colours"] for r in val_rows])),
                   "mean_conflicts_before_repair": float(np.mean([r["conflicts_before"] for r in val_rows])),
                   "all_valid": all(r["conflicts"] == 0 for r in val_rows)}
    return {"benchmark": bench_rows, "val": summary}


def markdown_table(evaluation: dict) -> str:
    lines = ["| graph | nodes | edges | chi (known) | GNN raw colours / conflicts | GNN + repair | greedy LF | "
             "greedy SL | DSATUR | GNN s | DSATUR s |", "|" + " --- |" * 11]
    for r in evaluation["benchmark"]:
        chi = r["chromatic"] if r["chromatic"] is not None else (f"<= {r['upper_k']}" if r["upper_k"] else "?")
        c = r["classical"]
        lines.append(f"| {r['name']} | {r['nodes']} | {r['edges']} | {chi} | {r['colours_before']} / "
                     f"{r['conflicts_before']} | {r['colours']} | {c['greedy_largest_first']['colours']} | "
                     f"{c['greedy_smallest_last']['colours']} | {c['dsatur']['colours']} | {r['total_s']:.3f} | "
                     f"{c['dsatur']['seconds']:.3f} |")
    v = evaluation.get("val") or {}
    if v:
        lines.append("")
        lines.append(f"Validation ({v['graphs']} graphs): mean colours {v['mean_colours']:.2f} (DSATUR "
                     f"{v['mean_dsatur_colours']:.2f}), mean conflicts before repair "
                     f"{v['mean_conflicts_before_repair']:.1f}, all valid after repair: {v['all_valid']}")
    return "\n".join(lines) + "\n"


def train(cfg: ColoringConfig) -> dict | None:
    cfg.validate()
    with distributed(cfg.device, cfg.collective_timeout_s) as ctx:
        return _train(cfg, ctx)


def _train(cfg: ColoringConfig, ctx: DistContext) -> dict | None:
    run_dir = Path(cfg.run_dir)
    cfgmod.check_run_dir_compatible(run_dir, cfg)
    train_set, val_set = GraphSplit(Path(cfg.data_dir), "train"), GraphSplit(Path(cfg.data_dir), "val")
    steps_per_epoch = EpochPlan(len(train_set), ctx.world_size, ctx.rank, cfg.graphs_per_batch, cfg.seed, 0).steps
    total_steps = cfg.epochs * steps_per_epoch
    log, metrics = open_run_dir(run_dir, cfg, ctx)
    try:
        torch.manual_seed(cfg.seed)
        model = build_gnn(cfg).to(ctx.device)
        n_params = sum(p.numel() for p in model.parameters())
        log.info("gnn: %s parameters, %d rank(s) on %s; %d train / %d val graphs; %d steps per epoch", f"{n_params:,}",
                 ctx.world_size, ctx.device.type, len(train_set), len(val_set), steps_per_epoch)
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        ckpt = CheckpointManager(run_dir / "checkpoints", ctx, cfg.keep_last, log)
        early = EarlyStopping(cfg.patience)
        step, epoch, start_in_epoch, elapsed_before = 0, 0, 0, 0.0
        resumed = ckpt.resume(ctx.device)
        if resumed is not None:
            model.load_state_dict(resumed.shared["model"])
            optimizer.load_state_dict(resumed.shared["optimizer"])
            step, elapsed_before = resumed.shared["step"], resumed.shared["elapsed_s"]
            early = EarlyStopping(cfg.patience, **resumed.shared["early_stopping"])
            state = resumed.rank_state or {"epoch": resumed.shared["epoch"], "step_in_epoch": 0}
            epoch, start_in_epoch = state["epoch"], state["step_in_epoch"]
            if "rng" in state:
                torch.set_rng_state(state["rng"])  # this rank's own dropout stream
            log.info("resumed from checkpoint step %d (epoch %d, step %d in epoch)", step, epoch, start_in_epoch)
        else:
            torch.manual_seed(cfg.seed + 1_000 * (ctx.rank + 1))  # per-rank dropout streams
        train_model = DDP(model, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None) \
            if ctx.distributed else model
        stopper = StopAgreement(ctx, cfg.budget(ctx.world_size), elapsed_before)
        stopper.install_signal_handlers()

        def save(at_epoch: int, in_epoch: int, metric: float | None) -> None:
            shared = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                      "epoch": at_epoch, "elapsed_s": stopper.elapsed_s(), "early_stopping": early.state_dict()}
            ckpt.save(step, shared, {"epoch": at_epoch, "step_in_epoch": in_epoch, "rng": torch.get_rng_state()},
                      {"metric": metric, "epoch": at_epoch, "config": cfgmod.to_dict(cfg)})

        reason, graphs_seen, train_time, last_loss, first_loss = StopReason.NONE, 0, 0.0, None, None
        bar = progress(total_steps, step, ctx.is_main, "gnn")
        try:
            while reason == StopReason.NONE and step < total_steps:
                plan = EpochPlan(len(train_set), ctx.world_size, ctx.rank, cfg.graphs_per_batch, cfg.seed, epoch)
                for s in range(start_in_epoch, plan.steps):
                    t0 = time.perf_counter()
                    idx = plan.batch(s).tolist()
                    graphs = [train_set[i] for i in idx]
                    loss, frac = batch_loss(train_model, graphs, cfg, [graph_seed(cfg, epoch, i) for i in idx],
                                            ctx.device, ctx.world_size / plan.global_count(s))
                    loss.backward()
                    if cfg.grad_clip > 0:
                        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    step += 1
                    dt = time.perf_counter() - t0
                    train_time += dt
                    graphs_seen += plan.global_count(s)
                    bar.update(1)
                    maybe_inject(ctx.rank, step, ctx.restart_count)
                    if step % cfg.log_every == 0 or step == total_steps:
                        total, count = all_reduce_sum(ctx, [float(frac), float(len(idx))])
                        last_loss = total / count
                        first_loss = last_loss if first_loss is None else first_loss
                        metrics.log(step, "train", {"conflict_fraction": last_loss, "graphs_per_s": plan.global_count(s) / dt,
                                                    "step_time_s": dt, "epoch": epoch})
                    end_of_epoch = s == plan.steps - 1
                    if end_of_epoch:
                        val_loss = validation_loss(model, val_set, cfg, ctx)
                        improved = early.update(val_loss)
                        metrics.log(step, "val", {"conflict_fraction": val_loss, "improved": improved})
                        log.info("epoch %d: val expected conflict fraction %.4f%s", epoch, val_loss,
                                 " (best)" if improved else "")
                        if early.should_stop:
                            stopper.request(StopReason.EARLY_STOP)
                        save(epoch + 1, 0, val_loss)
                    elif step % cfg.ckpt_every == 0:
                        save(epoch, s + 1, None)
                    reason = stopper.agree()
                    if reason == StopReason.NONE and step >= total_steps:
                        reason = StopReason.COMPLETED
                    if reason != StopReason.NONE:
                        if not end_of_epoch:
                            save(epoch, s + 1, None)
                        break
                else:
                    epoch, start_in_epoch = epoch + 1, 0
                    continue
                break
            if reason == StopReason.NONE:
                reason = StopReason.COMPLETED
        finally:
            bar.close()
            stopper.restore_signal_handlers()
        log.info("training stopped: %s at step %d", reason.name.lower(), step)
        best = ckpt.best_step()
        if best is not None:
            model.load_state_dict(ckpt.load_verified(best, ctx.device)["model"])
        evaluation = evaluate(model, cfg, val_set, ctx, ctx.device)
        elapsed = stopper.elapsed_s()
        gps = graphs_seen / train_time if train_time else None
        results = {"trainer": "gnn_coloring", "config": cfgmod.to_dict(cfg), "parameters": n_params,
                   "training": {"stop_reason": reason.name.lower(), "steps": step, "total_steps": total_steps,
                                "first_logged_conflict_fraction": first_loss, "last_logged_conflict_fraction": last_loss,
                                "best_val_conflict_fraction": early.best, "graphs_per_s_global": gps,
                                **run_facts(ctx, elapsed, cfg.budget(ctx.world_size).cost_usd(elapsed)),
                                "best_step": best},
                   "evaluation": evaluation, "git_commit": git_commit(), "versions": versions()}
        if ctx.is_main:
            (run_dir / "results.md").write_text(markdown_table(evaluation))
            atomic_write_json(run_dir / "results.json", results)
            log.info("results: %s and results.md", run_dir / "results.json")
        barrier(ctx)
        return results if ctx.is_main else None
    finally:
        metrics.close()


@torch.no_grad()
def validation_loss(model, val: GraphSplit, cfg: ColoringConfig, ctx: DistContext) -> float:
    """Mean expected conflicting-edge fraction over the validation graphs (fixed features)."""
    model.eval()
    idx = list(range(ctx.rank, len(val), ctx.world_size))
    total = 0.0
    for start in range(0, len(idx), cfg.graphs_per_batch):
        chunk = idx[start:start + cfg.graphs_per_batch]
        _, frac = batch_loss(model, [val[i] for i in chunk], cfg, [10_000 + i for i in chunk], ctx.device, 1.0)
        total += float(frac)
    s, n = all_reduce_sum(ctx, [total, float(len(idx))])
    model.train()
    return s / n


def export_gnn_run(run_dir: Path, tolerance: float = 1e-4) -> dict:
    """ONNX with dynamic node and edge counts, checked by onnxruntime on graphs of other sizes."""
    import logging

    from trainers.data.graphs import mycielski, queen
    from trainers.export import export_program, onnx_session
    from trainers.runfiles import load_run_config, resolve_checkpoint, single_process_context

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, ColoringConfig)
    ckpt = CheckpointManager(run_dir / "checkpoints", single_process_context(), 1, logging.getLogger("export"))
    step = resolve_checkpoint(ckpt, "best")
    model = build_gnn(cfg)
    model.load_state_dict(ckpt.load_verified(step, "cpu")["model"])
    model.eval()
    example = make_batch([queen(5)], cfg.max_colors, cfg.random_features, [0], torch.device("cpu"))
    nodes, edges = torch.export.Dim("nodes", min=2, max=1 << 24), torch.export.Dim("edges", min=2, max=1 << 28)
    path = run_dir / "model.onnx"
    export_program(model, (example.x, example.edge_index, example.colour_mask), path,
                   input_names=["x", "edge_index", "colour_mask"], output_names=["logits"],
                   dynamic_shapes={"x": {0: nodes}, "edge_index": {1: edges}, "colour_mask": {0: nodes}})
    session = onnx_session(path)
    errors = {}
    for g in (mycielski(5), queen(8), mycielski(3)):  # 47, 64 and 11 nodes; the export saw 25
        b = make_batch([g], cfg.max_colors, cfg.random_features, [1], torch.device("cpu"))
        with torch.no_grad():
            expected = model(b.x, b.edge_index, b.colour_mask).numpy()
        got = session.run(None, {"x": b.x.numpy(), "edge_index": b.edge_index.numpy(),
                                 "colour_mask": b.colour_mask.numpy()})[0]
        # masked logits are a constant; compare offered colours and the decoded colours
        offered = b.colour_mask.numpy() > 0
        errors[g.name] = float(np.abs(got[offered] - expected[offered]).max())
        if not np.array_equal(got.argmax(-1), expected.argmax(-1)):
            errors[g.name] = max(errors[g.name], float("inf"))
    worst = max(errors.values())
    if worst > tolerance:
        path.unlink(missing_ok=True)
        from trainers.export import ExportMismatch

        raise ExportMismatch(f"GNN ONNX differs from PyTorch by {worst:.3e} > {tolerance:.1e}: {errors}")
    info = {"path": path.name, "checkpoint_step": step, "export_nodes": 25, "checked": errors, "max_abs_error": worst,
            "inputs": {"x": ["nodes", cfg.in_dim], "edge_index": [2, "edges (both directions)"],
                       "colour_mask": ["nodes", cfg.max_colors]}, "random_features": cfg.random_features}
    atomic_write_json(run_dir / "export.json", info)
    results = json.loads((run_dir / "results.json").read_text()) if (run_dir / "results.json").exists() else {}
    results["export"] = info
    atomic_write_json(run_dir / "results.json", results)
    return info
