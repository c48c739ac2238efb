"""The final evaluation runs the model over many graphs at once (issue 33: on a GPU each model pass
is its launches and a host wait; it was one pass per graph per colour count offered). Each graph's
logits, decoded stages and seeds must be what one graph alone at one colour count gives."""

import time

import numpy as np
import pytest
import torch

from trainers.gnn.batch import make_batch
from trainers.gnn.config import GnnConfig
from trainers.gnn.decode import classical, color_with_model, model_schedule
from trainers.gnn.evaluate import EVAL_SEED, evaluate, graphs_in_passes, scheduled_logits
from trainers.gnn.graphs import Graph, GraphSplit, benchmark_set, random_graph, write_dataset
from trainers.gnn.model import ColoringGNN
from trainers.runtime.rundir import single_process_context

MAX_COLORS, RANDOM = 8, 3


def model():
    torch.manual_seed(5)
    return ColoringGNN(2 + RANDOM, 16, 3, MAX_COLORS).eval()


def alone(m, g: Graph, seed: int, k: int) -> np.ndarray:
    """The reference: one graph, one colour count, its own pass."""
    b = make_batch([g], MAX_COLORS, RANDOM, [seed], torch.device("cpu"), offered=[k])
    with torch.no_grad():
        return m(b.x, b.edge_index, b.color_mask).numpy()


def test_each_graphs_logits_in_a_pass_are_its_own_at_each_colour_count():
    m = model()
    graphs = benchmark_set()[3:8] + [random_graph(i, 4, 5, 40) for i in range(5)]
    graphs.insert(4, Graph("edgeless", 6, np.zeros((0, 2), np.int64)))
    seeds = [EVAL_SEED + 7 * i for i in range(len(graphs))]
    schedules = [model_schedule(g, MAX_COLORS)[2] for g in graphs]
    assert sum(len(s) > 1 for s in schedules) >= 5  # several counts offered per graph: blocks of one graph repeat
    tables, shares = scheduled_logits(m, graphs, seeds, schedules, MAX_COLORS, RANDOM, torch.device("cpu"))
    for g, seed, offered, table in zip(graphs, seeds, schedules, tables):
        assert sorted(table) == sorted(offered), g.name
        for k in offered:
            np.testing.assert_allclose(table[k], alone(m, g, seed, k), rtol=0, atol=1e-5, err_msg=f"{g.name} k={k}")
            assert np.array_equal(table[k].argmax(-1), alone(m, g, seed, k).argmax(-1)), (g.name, k)
    assert len(shares) == len(graphs) and min(shares) >= 0 and shares[0] > 0


def test_passes_hold_about_the_node_budget_and_every_graph_once():
    graphs = [Graph(f"g{n}", n, np.zeros((0, 2), np.int64)) for n in (10, 30, 5, 50, 20, 100)]
    schedules = [[3, 2]] * 6  # each graph's blocks: twice its nodes
    passes = list(graphs_in_passes(graphs, schedules, 100))
    whole = [3, 2]
    assert passes == [[(0, whole), (1, whole), (2, whole)], [(3, whole)], [(4, whole)],  # 20+60+10; 100; 40
                      [(5, [3])], [(5, [2])]]  # 200 > 100: a pass per count, each of the graph's 100 nodes
    assert sorted((i, k) for p in passes for i, counts in p for k in counts) == [(i, k) for i in range(6) for k in (2, 3)]
    assert list(graphs_in_passes(graphs, schedules, 10**9)) == [[(i, whole) for i in range(6)]]


def test_a_graphs_seconds_count_its_bounds_and_its_share_of_each_pass_by_nodes(monkeypatch):
    """results.md sets a graph's total beside DSATUR's: it must hold the bounds and schedule (the clique
    search, the greedy bound) computed before its pass, and its own share of the pass, not an equal one."""
    import trainers.gnn.evaluate as evaluate_mod

    m = model()
    graphs = [random_graph(i, 4, 5, 40) for i in range(4)]
    schedules = [model_schedule(g, MAX_COLORS)[2] for g in graphs]
    _, shares = scheduled_logits(m, graphs, [0, 1, 2, 3], schedules, MAX_COLORS, RANDOM, torch.device("cpu"))
    blocks = [g.n * len(s) for g, s in zip(graphs, schedules)]
    assert len(set(blocks)) > 1 and shares == pytest.approx([sum(shares) * b / sum(blocks) for b in blocks])

    def slow_schedule(g, max_colors):
        time.sleep(0.03)
        return model_schedule(g, max_colors)
    monkeypatch.setattr(evaluate_mod, "model_schedule", slow_schedule)
    cfg = GnnConfig(max_colors=MAX_COLORS, random_features=RANDOM, search_iters=0, nodes_per_batch=10**6)
    rows = evaluate(m, cfg, None, single_process_context("cpu"))["benchmark"]
    assert all(r["seconds"]["total"] >= 0.03 + r["seconds"]["model"] for r in rows)


@pytest.mark.parametrize("nodes_per_batch", [1, 300, 10**6])  # a pass a graph, several graphs a pass, one pass
def test_the_final_evaluation_equals_each_graph_decoded_alone(tmp_path, nodes_per_batch, monkeypatch):
    write_dataset(tmp_path / "d", 4, 9, seed=6, min_nodes=8, max_nodes=40, workers=1, progress=False)
    val = GraphSplit(tmp_path / "d", "val")
    cfg = GnnConfig(data_dir=str(tmp_path / "d"), max_colors=MAX_COLORS, random_features=RANDOM, search_iters=0,
                    nodes_per_batch=nodes_per_batch)
    m = model()
    passes = []
    forward = m.forward
    monkeypatch.setattr(m, "forward", lambda *a: passes.append(a[0].shape[0]) or forward(*a))
    got = evaluate(m, cfg, val, single_process_context("cpu"))

    bench = benchmark_set()
    schedules = [model_schedule(g, MAX_COLORS)[2] for g in bench + [val[i] for i in range(len(val))]]
    expected_passes = list(graphs_in_passes(bench + [val[i] for i in range(len(val))], schedules, nodes_per_batch))
    assert len(passes) == len(expected_passes)
    if nodes_per_batch == 10**6:
        assert len(passes) == 1
    reference = []
    for kind, i, g in [("benchmark", i, g) for i, g in enumerate(bench)] + [("val", i, val[i]) for i in range(len(val))]:
        _, r = color_with_model(g, lambda k, g=g, i=i: alone(m, g, EVAL_SEED + i, k), MAX_COLORS, 0, 1.0,
                                EVAL_SEED + i)
        r.update(kind=kind, name=g.name, chromatic=g.chromatic, upper_k=g.upper_k, classical=classical(g))
        reference.append(r)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "classical")}  # noqa: E731
    ref_bench = sorted((r for r in reference if r["kind"] == "benchmark"), key=lambda r: r["name"])
    assert [strip(r) for r in got["benchmark"]] == [strip(r) for r in ref_bench]
    ref_val = [r for r in reference if r["kind"] == "val"]
    assert got["val"]["mean_colors"] == pytest.approx(np.mean([r["colors"] for r in ref_val]))
    assert got["val"]["mean_conflicts_before_repair"] == pytest.approx(np.mean([r["raw"]["conflicts"] for r in ref_val]))
    assert all(r["seconds"]["model"] >= 0 and r["seconds"]["total"] >= r["seconds"]["model"] for r in got["benchmark"])
