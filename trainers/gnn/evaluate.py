"""Evaluation of the colouring GNN: the benchmark graphs and the validation split through every
decoding stage (raw, repaired, scheduled, searched; trainers.gnn.decode) beside networkx's greedy
strategies and DSATUR, sharded over ranks; the validation loss training watches; and
`trainers gnn evaluate`, which runs the final evaluation of a run later (after a SIGTERM)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from trainers.gnn.batch import DeviceGraphs, make_batch, potts_loss
from trainers.gnn.build import build_model
from trainers.gnn.config import GnnConfig
from trainers.gnn.decode import classical, color_with_model, model_schedule
from trainers.gnn.graphs import Graph, GraphSplit, benchmark_set
from trainers.gnn.size import CPU_NODES
from trainers.runtime.dist import DistContext, all_gather_object, all_reduce_sum, pick_device
from trainers.runtime.results import merge_results
from trainers.runtime.rundir import (
    check_data_unchanged,
    exclusive,
    load_checkpoint_states,
    load_run_config,
    single_process_context,
)
from trainers.runtime.written import write_result

EVAL_SEED = 10_000  # random node features at evaluation: fixed, so every evaluation is comparable


def graphs_in_passes(graphs: list[Graph], schedules: list[list[int]],
                     nodes_per_batch: int) -> Iterator[list[tuple[int, list[int]]]]:
    """The model passes of an evaluation, each a list of (graph index, colour counts): consecutive
    graphs with all their counts, about `nodes_per_batch` nodes of blocks in all; a graph whose
    counts alone hold more gets a pass per count (as many nodes as the graph, never more)."""
    run, nodes = [], 0
    for i, (g, offered) in enumerate(zip(graphs, schedules)):
        size = g.n * len(offered)
        if run and nodes + size > nodes_per_batch:
            yield run
            run, nodes = [], 0
        if size > nodes_per_batch and len(offered) > 1:
            yield from ([(i, [k])] for k in offered)
            continue
        run.append((i, list(offered)))
        nodes += size
    if run:
        yield run


@torch.no_grad()
def scheduled_logits(model, graphs: list[Graph], seeds: list[int], schedules: list[list[int]], max_colors: int,
                     random_dims: int, device) -> tuple[list[dict[int, np.ndarray]], list[float]]:
    """The model's logits for each graph at every colour count of its schedule, in one pass: each
    (graph, count) pair is one block of a block-diagonal batch, read to the host once. The model
    passes no message between blocks, so a block's logits are its graph's alone (on a GPU a pass per
    pair was its own launches and host wait). Also each graph's share of the pass's seconds, by nodes."""
    t0 = time.perf_counter()
    pairs = [(i, k) for i, offered in enumerate(schedules) for k in offered]
    b = make_batch([graphs[i] for i, _ in pairs], max_colors, random_dims, [seeds[i] for i, _ in pairs], device,
                   offered=[k for _, k in pairs])
    logits = model(b.x, b.edge_index, b.color_mask).cpu().numpy()
    elapsed = time.perf_counter() - t0
    tables: list[dict[int, np.ndarray]] = [{} for _ in graphs]
    start = 0
    for i, k in pairs:
        tables[i][k] = logits[start:start + graphs[i].n]
        start += graphs[i].n
    nodes = [g.n * len(offered) for g, offered in zip(graphs, schedules)]
    total = sum(nodes)
    return tables, [elapsed * n / total if total else elapsed / len(graphs) for n in nodes]


def evaluate(model, cfg: GnnConfig, val: GraphSplit | None, ctx: DistContext) -> dict | None:
    """Collective: benchmark set + validation split, sharded over ranks, gathered on rank 0. The
    model runs over this rank's graphs in passes of about --nodes-per-batch nodes, every colour
    count of each graph's schedule in its pass; then each graph goes through every decoding stage.
    A graph's seconds: its bounds and schedule, its share of its passes and its decoding stages."""
    model.eval()
    bench = benchmark_set()
    jobs = [("benchmark", i) for i in range(len(bench))] + ([("val", i) for i in range(len(val))] if val else [])
    mine = jobs[ctx.rank::ctx.world_size]
    graphs = [bench[i] if kind == "benchmark" else val[i] for kind, i in mine]
    schedules, schedule_s, model_s = [], [], [0.0] * len(graphs)
    for g in graphs:
        t = time.perf_counter()
        schedules.append(model_schedule(g, cfg.max_colors))
        schedule_s.append(time.perf_counter() - t)
    tables: dict[int, dict[int, np.ndarray]] = {}  # the graphs whose counts are not all computed yet
    rows = []
    for run in graphs_in_passes(graphs, [s[2] for s in schedules], cfg.nodes_per_batch or CPU_NODES):
        done, shares = scheduled_logits(model, [graphs[j] for j, _ in run], [EVAL_SEED + mine[j][1] for j, _ in run],
                                        [counts for _, counts in run], cfg.max_colors, cfg.random_features, ctx.device)
        for (j, _), table, share in zip(run, done, shares):
            tables.setdefault(j, {}).update(table)
            model_s[j] += share
            if len(tables[j]) < len(schedules[j][2]):
                continue
            (kind, i), g = mine[j], graphs[j]
            _, r = color_with_model(g, tables.pop(j).__getitem__, cfg.max_colors, cfg.search_iters,
                                    cfg.search_seconds, EVAL_SEED + i, schedule_of=schedules[j])
            r["seconds"].update(model=round(model_s[j], 4),
                                total=round(r["seconds"]["total"] + schedule_s[j] + model_s[j], 4))
            r.update(kind=kind, name=g.name, chromatic=g.chromatic, upper_k=g.upper_k, classical=classical(g))
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
        mean = lambda f: float(np.mean([f(r) for r in val_rows]))  # noqa: E731
        summary = {"graphs": len(val_rows), "mean_colors": mean(lambda r: r["colors"]),
                   "mean_repaired_colors": mean(lambda r: r["repaired"]["colors"]),
                   "mean_dsatur_colors": mean(lambda r: r["classical"]["dsatur"]["colors"]),
                   "mean_conflicts_before_repair": mean(lambda r: r["raw"]["conflicts"]),
                   "graphs_above_dsatur": sum(r["colors"] > r["classical"]["dsatur"]["colors"] for r in val_rows),
                   "all_valid": all(r["conflicts"] == 0 for r in val_rows)}
    return {"benchmark": bench_rows, "val": summary,
            "search": {"iters_per_graph": cfg.search_iters, "seconds_per_graph": cfg.search_seconds}}


def _known(r: dict) -> str:
    return str(r["chromatic"]) if r["chromatic"] is not None else (f"<= {r['upper_k']}" if r["upper_k"] else "?")


def markdown_table(evaluation: dict) -> str:
    s = evaluation.get("search", {})
    lines = [f"GNN stages: raw argmax (colours / conflicting edges) with the greedy bound offered, repaired, best "
             f"of the colour schedule, then tabu search ({s.get('iters_per_graph')} iterations or "
             f"{s.get('seconds_per_graph')} s per graph at most). Times in seconds.", "",
             "| graph | nodes | edges | chi (known) | clique bound | GNN raw | repaired | scheduled | searched | "
             "greedy LF | greedy SL | DSATUR | GNN total s | DSATUR s |", "|" + " --- |" * 14]
    for r in evaluation["benchmark"]:
        c = r["classical"]
        searched = r.get("searched", {}).get("colors", "-")
        lines.append(f"| {r['name']} | {r['nodes']} | {r['edges']} | {_known(r)} | {r['lower_bound']} | "
                     f"{r['raw']['colors']} / {r['raw']['conflicts']} | {r['repaired']['colors']} | "
                     f"{r['scheduled']['colors']} | {searched} | {c['greedy_largest_first']['colors']} | "
                     f"{c['greedy_smallest_last']['colors']} | {c['dsatur']['colors']} | {r['seconds']['total']:.3f} | "
                     f"{c['dsatur']['seconds']:.3f} |")
    v = evaluation.get("val") or {}
    if v:
        lines.append("")
        lines.append(f"Validation ({v['graphs']} graphs): mean colours {v['mean_colors']:.2f} after search, "
                     f"{v['mean_repaired_colors']:.2f} after repair (DSATUR {v['mean_dsatur_colors']:.2f}); "
                     f"{v['graphs_above_dsatur']} graphs with more colours than DSATUR; mean conflicts before repair "
                     f"{v['mean_conflicts_before_repair']:.1f}; all valid: {v['all_valid']}")
    return "\n".join(lines) + "\n"


@torch.no_grad()
def validation_loss(model, val: DeviceGraphs, cfg: GnnConfig, ctx: DistContext) -> float:
    """Mean expected conflicting-edge fraction over the validation graphs (fixed features; each
    rank takes every world_size-th graph, in runs of about --nodes-per-batch nodes)."""
    model.eval()
    mine = np.arange(ctx.rank, len(val.nodes), ctx.world_size)
    total = torch.zeros((), dtype=torch.float64, device=ctx.device)
    chunk, nodes = [], 0
    for i in mine:
        chunk.append(i)
        nodes += int(val.nodes[i])
        if nodes >= cfg.nodes_per_batch or i == mine[-1]:
            total += potts_loss(model, val.batch(np.array(chunk)), 1.0)[1]
            chunk, nodes = [], 0
    s, n = all_reduce_sum(ctx, [float(total), float(len(mine))])
    model.train()
    return s / n


def evaluate_run(run_dir: str, checkpoint: str = "best", device: str = "cpu") -> dict:
    """`trainers gnn evaluate`: the final evaluation of a run's checkpoint, written into its results."""
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, GnnConfig)
    dev = pick_device(0, device)
    with exclusive(run_dir):
        check_data_unchanged(run_dir, GraphSplit(Path(cfg.data_dir), "train").fingerprint, instead=(
            f"{cfg.data_dir} was regenerated since; its evaluation needs the dataset it trained on there"))
        step, states = load_checkpoint_states(run_dir, checkpoint, str(dev))
        model = build_model(cfg).to(dev)
        model.load_state_dict(states["model"])
        ctx = single_process_context(str(dev))
        evaluation = evaluate(model, cfg, GraphSplit(Path(cfg.data_dir), "val"), ctx)
        evaluation["checkpoint_step"] = step
        write_result(run_dir / "results.md", lambda f: f.write(markdown_table(evaluation)), mode="w")
        merge_results(run_dir, {"evaluation": evaluation})
    return evaluation
