"""Decoding that searches (tabu search, the colour schedule, per-instance fine-tuning) and the
GPU-shaped input pipeline (node-budget batches, batches gathered on the device)."""

import time

import numpy as np
import pytest
import torch

from trainers.gnn.batch import DeviceGraphs, make_batch, pad_batch, potts_loss
from trainers.gnn.decode import color_with_model, repair
from trainers.gnn.features import color_mask, offered_schedule
from trainers.gnn.finetune import finetune_stage
from trainers.gnn.graphs import (
    Graph,
    GraphSplit,
    benchmark_set,
    conflicts,
    erdos_renyi,
    greedy_coloring,
    mycielski,
    queen,
    random_graph,
    write_dataset,
)
from trainers.gnn.model import ColoringGNN
from trainers.gnn.sampling import NodeBudgetCursor, NodeBudgetPlan, padded_capacity
from trainers.gnn.search import clique_lower_bound, reduce_colors


def n_colors(c):
    return len(np.unique(c))


def graphs_with_starts():
    rng = np.random.default_rng(3)
    graphs = benchmark_set()[:7] + [random_graph(i, 9, 20, 80) for i in range(8)]
    graphs += [erdos_renyi(60, 0.5, rng, "dense"), Graph("edgeless", 5, np.zeros((0, 2), np.int64))]
    for g in graphs:
        yield g, greedy_coloring(g.n, g.edges)
        yield g, repair(g, rng.integers(0, 12, g.n))


def test_search_always_returns_a_proper_coloring_with_no_more_colors_than_its_start():
    rng = np.random.default_rng(0)
    for g, start in graphs_with_starts():
        garbage = [rng.integers(0, 3, g.n), rng.integers(0, 40, g.n)]  # hints may be anything
        r = reduce_colors(g, start, iters=400, seconds=5.0, seed=1, hints=garbage)
        assert conflicts(g.edges, r.coloring) == 0 and len(r.coloring) == g.n, g.name
        assert r.colors == n_colors(r.coloring) <= n_colors(start) and r.start_colors == n_colors(start)
        assert r.coloring.max() + 1 == r.colors  # numbered 0..colors-1
        assert r.iterations <= 400


def test_search_is_deterministic_for_a_seed_and_reaches_known_chromatic_numbers():
    g = queen(6)
    start = greedy_coloring(g.n, g.edges)
    a = reduce_colors(g, start, iters=3000, seconds=60.0, seed=5)
    b = reduce_colors(g, start, iters=3000, seconds=60.0, seed=5)
    steps = lambda r: [(lv["k"], lv["solved"], lv["iterations"]) for lv in r.levels]  # noqa: E731
    assert np.array_equal(a.coloring, b.coloring) and a.iterations == b.iterations and steps(a) == steps(b)
    assert n_colors(start) == 9 and a.colors == 7 == g.chromatic and a.stopped == "budget_iters"  # 6 is impossible
    q7 = queen(7)  # greedy needs 12; the clique bound (7) ends the search as soon as it gets there
    r = reduce_colors(q7, greedy_coloring(q7.n, q7.edges), iters=50_000, seconds=60.0, seed=0)
    assert r.colors == 7 and r.stopped == "lower_bound" and r.iterations < 50_000


def test_search_keeps_to_its_time_budget_and_refuses_an_improper_start():
    rng = np.random.default_rng(1)
    g = erdos_renyi(300, 0.5, rng)
    start = greedy_coloring(g.n, g.edges)
    t0 = time.perf_counter()
    r = reduce_colors(g, start, iters=10**9, seconds=0.3, seed=0)
    assert time.perf_counter() - t0 < 2.0 and r.stopped == "budget_seconds"
    assert conflicts(g.edges, r.coloring) == 0 and r.colors <= n_colors(start)
    bad = start.copy()
    bad[g.edges[0, 1]] = bad[g.edges[0, 0]]
    with pytest.raises(ValueError, match="proper colouring"):
        reduce_colors(g, bad)


def test_clique_lower_bound_is_a_clique_and_never_above_chi():
    assert [clique_lower_bound(queen(k)) for k in (5, 6, 7, 8)] == [5, 6, 7, 8]
    assert [clique_lower_bound(mycielski(k)) for k in (3, 4, 5, 6)] == [2, 2, 2, 2]  # triangle-free
    k6 = Graph("k6", 6, np.array([(i, j) for i in range(6) for j in range(i + 1, 6)]))
    assert clique_lower_bound(k6) == 6 and clique_lower_bound(Graph("e", 3, np.zeros((0, 2), np.int64))) == 1
    for g in benchmark_set():
        assert clique_lower_bound(g) <= (g.chromatic or g.upper_k)


def test_the_colour_schedule_offers_fewer_colours_down_to_the_clique_bound():
    assert offered_schedule(9, 5) == [9, 8, 7, 6, 5]
    assert offered_schedule(13, 2) == [13, 12, 11, 10, 9, 8]  # at most six levels
    assert offered_schedule(1, 1) == [1] and offered_schedule(3, 5) == [3]


def test_decoding_stages_with_a_model_that_knows_a_planted_coloring():
    """A stand-in model whose logits favour a hidden proper colouring among the colours offered:
    each stage is reported, the search never adds colours, the result is valid."""
    g = benchmark_set()[8]  # planted_200_k5
    assert g.name == "planted_200_k5"
    rng = np.random.default_rng(0)
    calls = []

    def logits_for(k):
        calls.append(k)
        logits = rng.standard_normal((g.n, 16)).astype(np.float32)
        logits[np.arange(g.n), g.hidden % k] += 2.0  # a noisy hint of the planted colours
        logits[:, k:] = -1e4
        return logits

    best, report = color_with_model(g, logits_for, 16, search_iters=3000, search_seconds=30.0, seed=0)
    assert calls == offered_schedule(report["offered"], report["lower_bound"])
    assert conflicts(g.edges, best) == 0 and report["conflicts"] == 0
    assert report["raw"]["conflicts"] > 0 and report["scheduled"]["colors"] <= report["repaired"]["colors"]
    assert report["searched"]["colors"] <= report["scheduled"]["colors"] and report["colors"] == n_colors(best)
    assert report["colors"] == 5  # the planted k: found by the search from the model's hints
    _, no_search = color_with_model(g, logits_for, 16, search_iters=0, search_seconds=1.0)
    assert "searched" not in no_search and no_search["colors"] == no_search["scheduled"]["colors"]


def test_per_instance_finetuning_never_adds_colours_and_is_deterministic():
    torch.manual_seed(0)
    model = ColoringGNN(2 + 4, 16, 2, 8).eval()
    g = mycielski(4)  # chi 5, clique bound 2: there is always "one fewer" to try
    start = greedy_coloring(g.n, g.edges)
    runs = [finetune_stage(model, g, 8, 4, start, lower=2, steps=15, restarts=2, search_iters=300,
                           search_seconds=30.0, seed=4) for _ in range(2)]
    (color, report), (color2, report2) = runs
    assert np.array_equal(color, color2)
    assert [r["conflicts"] for r in report["restarts"]] == [r["conflicts"] for r in report2["restarts"]]
    assert conflicts(g.edges, color) == 0 and n_colors(color) <= n_colors(start) and report["colors"] == n_colors(color)
    assert report["target"] == n_colors(start) - 1 and len(report["restarts"]) == 2
    assert report["searched"]["colors"] == report["colors"] >= g.chromatic
    q = queen(5)  # already at its clique bound: nothing to gain, so nothing is tuned
    proper = greedy_coloring(q.n, q.edges)
    proper = reduce_colors(q, proper, iters=1000, seconds=30.0).coloring
    same, skipped = finetune_stage(model, q, 8, 4, proper, 5, 10, 1, 100, 1.0)
    assert "skipped" in skipped and np.array_equal(same, proper)
    q8 = queen(8)  # greedy: 13 colours; one fewer is more than this model can offer (8)
    greedy = greedy_coloring(q8.n, q8.edges)
    same, skipped = finetune_stage(model, q8, 8, 4, greedy, 8, 10, 1, 100, 1.0)
    assert "offers at most 8" in skipped["skipped"] and np.array_equal(same, greedy)


def test_device_batches_match_host_batches(tmp_path):
    write_dataset(tmp_path / "d", 10, 6, seed=2, min_nodes=5, max_nodes=30, workers=1, progress=False)
    val = GraphSplit(tmp_path / "d", "val")
    data = DeviceGraphs(val, 8, 3, torch.device("cpu"), fixed_random_seed=100)
    pick = np.array([4, 1, 5])
    b = data.batch(pick)
    graphs = [val[i] for i in pick]
    ref = make_batch(graphs, 8, 3, [100 + i for i in pick], torch.device("cpu"),
                     offered=[min(int(val.color_bound[i]), 8) for i in pick])
    for name in ("x", "edge_index", "color_mask", "edge_graph", "edges_per_graph"):
        torch.testing.assert_close(getattr(b, name), getattr(ref, name), rtol=0, atol=0, msg=name)
    train = DeviceGraphs(GraphSplit(tmp_path / "d", "train"), 8, 3, torch.device("cpu"))
    draw = lambda seed: train.batch(np.array([0, 7]), torch.Generator().manual_seed(seed)).x  # noqa: E731
    assert torch.equal(draw(1), draw(1)) and not torch.equal(draw(1), draw(2))


def test_a_padded_batch_has_the_loss_and_gradients_of_the_batch_itself(tmp_path):
    """The compiled step's batches (pad_batch): padding nodes, edges and graphs change neither the loss
    nor any gradient, the model's outputs at the real nodes neither (no message reaches them)."""
    write_dataset(tmp_path / "d", 10, 2, seed=4, min_nodes=5, max_nodes=30, workers=1, progress=False)
    data = DeviceGraphs(GraphSplit(tmp_path / "d", "train"), 8, 3, torch.device("cpu"))
    b = data.batch(np.array([3, 0, 8, 5]), torch.Generator().manual_seed(0))
    n, e, g = b.x.shape[0], b.edge_index.shape[1], b.n_graphs
    padded = pad_batch(b, (n + 13, e + 40, g + 3))
    assert padded.x.shape[0] == n + 13 and padded.edge_index.shape[1] == e + 40 and padded.n_graphs == g + 3

    def loss_and_grads(batch):
        torch.manual_seed(0)
        model = ColoringGNN(5, 16, 2, 8)
        loss, frac = potts_loss(model, batch, 0.25)
        loss.backward()
        return loss.detach(), frac, [p.grad for p in model.parameters()], model(batch.x, batch.edge_index,
                                                                                batch.color_mask)[:n].detach()

    want, got = loss_and_grads(b), loss_and_grads(padded)
    torch.testing.assert_close(got[0], want[0], rtol=1e-6, atol=0)
    torch.testing.assert_close(got[1], want[1], rtol=1e-6, atol=0)
    for a, w in zip(got[2], want[2]):
        torch.testing.assert_close(a, w, rtol=1e-5, atol=1e-8)
    torch.testing.assert_close(got[3], want[3], rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="does not fit"):
        pad_batch(b, (n, e + 1, g + 1))


def test_the_padded_capacity_holds_every_step_of_every_epoch_and_no_more():
    rng = np.random.default_rng(5)
    nodes = rng.integers(20, 301, 97)
    edges = 2 * (nodes * rng.uniform(1, 8, 97)).astype(np.int64)
    for rank in (0, 1):
        capacity = padded_capacity(nodes, edges, 2, rank, 1500, seed=3, epochs=4)
        most = np.zeros(3, dtype=np.int64)
        for epoch in range(4):
            plan = NodeBudgetPlan(nodes, 2, rank, 1500, seed=3, epoch=epoch)
            for s in range(plan.steps):
                graphs = plan.batch(s)
                most = np.maximum(most, [nodes[graphs].sum(), edges[graphs].sum(), len(graphs)])
        assert capacity == tuple(int(m) + 1 for m in most)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_node_budget_batches_see_every_graph_once_per_epoch(world):
    rng = np.random.default_rng(world)
    nodes = rng.integers(20, 301, 97)
    budget = 1500
    for epoch in (0, 1):
        plans = [NodeBudgetPlan(nodes, world, r, budget, seed=3, epoch=epoch) for r in range(world)]
        steps = plans[0].steps
        assert all(p.steps == steps for p in plans) and steps == -(-nodes.sum() // (world * budget))
        seen = np.concatenate([p.batch(s) for p in plans for s in range(steps)])
        assert sorted(seen.tolist()) == list(range(len(nodes)))  # each graph exactly once
        for s in range(steps):
            sizes = [len(p.batch(s)) for p in plans]
            assert min(sizes) >= 1 and plans[0].global_count(s) == sum(sizes)
            for p in plans:  # about the budget: at most one graph over this rank's equal part
                share = sum(nodes[p.batch(t)].sum() for t in range(steps))
                assert nodes[p.batch(s)].sum() <= share / steps + nodes.max()
    if world == 2:
        a = NodeBudgetPlan(nodes, 2, 0, budget, seed=3, epoch=0).batch(0)
        assert not np.array_equal(a, NodeBudgetPlan(nodes, 2, 0, budget, seed=3, epoch=1).batch(0))


def test_node_budget_cursor_resumes_where_it_stopped():
    nodes = np.random.default_rng(0).integers(10, 60, 40)
    walk = NodeBudgetCursor(nodes, 2, 1, 200, seed=1)
    batches = []
    for _ in range(2 * walk.steps_per_epoch + 1):
        batches.append((walk.epoch, walk.batch()[0].tolist()))
        walk.advance()
    cursor = NodeBudgetCursor(nodes, 2, 1, 200, seed=1)
    for _ in range(walk.steps_per_epoch + 1):
        cursor.advance()
    position = cursor.position()
    resumed = NodeBudgetCursor(nodes, 2, 1, 200, seed=1, **NodeBudgetCursor.start(position))
    assert (resumed.epoch, resumed.batch()[0].tolist()) == batches[walk.steps_per_epoch + 1]
    assert position["consumed_in_epoch"] == len(batches[walk.steps_per_epoch][1])  # epoch 1's first step
    tiny = NodeBudgetPlan(nodes, 2, 0, 1, seed=1, epoch=0)  # a budget below one graph: one graph a step
    assert tiny.steps == 20 and all(len(tiny.batch(s)) == 1 for s in range(20))


def test_the_mask_offers_the_first_k_colours():
    m = color_mask(3, 2, 5)
    assert m.shape == (3, 5) and (m[:, :2] == 1).all() and (m[:, 2:] == 0).all()
