"""Evaluation of the coloring GNN: the benchmark graphs and the validation split beside networkx's
greedy strategies and DSATUR, sharded over ranks; and the validation loss training watches."""

from __future__ import annotations

import time

import numpy as np
import torch

from trainers.gnn.batch import batch_loss, make_batch
from trainers.gnn.config import GnnConfig
from trainers.gnn.decode import classical, repair
from trainers.gnn.graphs import Graph, GraphSplit, benchmark_set, conflicts
from trainers.runtime.dist import DistContext, all_gather_object, all_reduce_sum

EVAL_SEED = 10_000  # random node features at evaluation: fixed, so every evaluation is comparable


@torch.no_grad()
def color_graph(model, g: Graph, cfg: GnnConfig, seed: int, device) -> dict:
    t0 = time.perf_counter()
    b = make_batch([g], cfg.max_colors, cfg.random_features, [seed], device)
    raw = model(b.x, b.edge_index, b.color_mask).argmax(-1).cpu().numpy()
    model_s = time.perf_counter() - t0
    fixed = repair(g, raw)
    total_s = time.perf_counter() - t0
    return {"offered": b.offered[0], "colors_before": int(len(np.unique(raw))), "conflicts_before": conflicts(g.edges, raw),
            "colors": int(fixed.max() + 1) if g.n else 0, "conflicts": conflicts(g.edges, fixed),
            "model_s": model_s, "total_s": total_s, "coloring": fixed}


def evaluate(model, cfg: GnnConfig, val: GraphSplit | None, ctx: DistContext) -> dict | None:
    """Collective: benchmark set + validation split, sharded over ranks, gathered on rank 0."""
    model.eval()
    bench = benchmark_set()
    jobs = [("benchmark", i) for i in range(len(bench))] + ([("val", i) for i in range(len(val))] if val else [])
    rows = []
    for kind, i in jobs[ctx.rank::ctx.world_size]:
        g = bench[i] if kind == "benchmark" else val[i]
        r = color_graph(model, g, cfg, seed=EVAL_SEED + i, device=ctx.device)
        r.pop("coloring")
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
                   "mean_colors": float(np.mean([r["colors"] for r in val_rows])),
                   "mean_dsatur_colors": float(np.mean([r["classical"]["dsatur"]["colors"] for r in val_rows])),
                   "mean_conflicts_before_repair": float(np.mean([r["conflicts_before"] for r in val_rows])),
                   "all_valid": all(r["conflicts"] == 0 for r in val_rows)}
    return {"benchmark": bench_rows, "val": summary}


def markdown_table(evaluation: dict) -> str:
    lines = ["| graph | nodes | edges | chi (known) | GNN raw colors / conflicts | GNN + repair | greedy LF | "
             "greedy SL | DSATUR | GNN s | DSATUR s |", "|" + " --- |" * 11]
    for r in evaluation["benchmark"]:
        chi = r["chromatic"] if r["chromatic"] is not None else (f"<= {r['upper_k']}" if r["upper_k"] else "?")
        c = r["classical"]
        lines.append(f"| {r['name']} | {r['nodes']} | {r['edges']} | {chi} | {r['colors_before']} / "
                     f"{r['conflicts_before']} | {r['colors']} | {c['greedy_largest_first']['colors']} | "
                     f"{c['greedy_smallest_last']['colors']} | {c['dsatur']['colors']} | {r['total_s']:.3f} | "
                     f"{c['dsatur']['seconds']:.3f} |")
    v = evaluation.get("val") or {}
    if v:
        lines.append("")
        lines.append(f"Validation ({v['graphs']} graphs): mean colors {v['mean_colors']:.2f} (DSATUR "
                     f"{v['mean_dsatur_colors']:.2f}), mean conflicts before repair "
                     f"{v['mean_conflicts_before_repair']:.1f}, all valid after repair: {v['all_valid']}")
    return "\n".join(lines) + "\n"


@torch.no_grad()
def validation_loss(model, val: GraphSplit, cfg: GnnConfig, ctx: DistContext) -> float:
    """Mean expected conflicting-edge fraction over the validation graphs (fixed features)."""
    model.eval()
    idx = list(range(ctx.rank, len(val), ctx.world_size))
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    for start in range(0, len(idx), cfg.graphs_per_batch):
        chunk = idx[start:start + cfg.graphs_per_batch]
        _, frac = batch_loss(model, [val[i] for i in chunk], cfg.max_colors, cfg.random_features,
                             [EVAL_SEED + i for i in chunk], ctx.device, 1.0)
        total += frac
    s, n = all_reduce_sum(ctx, [float(total), float(len(idx))])
    model.train()
    return s / n
