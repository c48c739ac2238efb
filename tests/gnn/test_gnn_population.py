"""The population search (trainers.gnn.population): batched TabuCol whose neighbour counts stay
exact, GPX's invariants, the partition distance, the search's guarantees (proper, never more
colours, deterministic for a seed under an iteration budget), DSATUR, the flat graphs, the dense
training data and training with fewer colours offered. Tiny graphs and iteration budgets only."""

import numpy as np
import pytest
import torch

from trainers.gnn.batch import DeviceGraphs
from trainers.gnn.dsatur import dsatur
from trainers.gnn.graphs import (
    Graph,
    GraphSplit,
    benchmark_set,
    conflicts,
    erdos_renyi,
    flat,
    greedy_coloring,
    mycielski,
    queen,
    random_graph,
    write_dataset,
)
from trainers.gnn.population import (
    DeviceGraph,
    Population,
    drop_one_color,
    gpx,
    heuristic_starts,
    model_starts,
    partition_distance,
    population_search,
    squeeze,
)

CPU = torch.device("cpu")


def n_colors(c):
    return len(np.unique(c))


def fresh(dg, col, k):
    """The state a population would have if built from scratch from these colours."""
    return Population(dg, col.clone(), k)


@pytest.mark.parametrize("make", [lambda r: erdos_renyi(60, 0.5, r), lambda r: flat(48, 6, 0.6, r),
                                  lambda r: erdos_renyi(80, 0.05, r), lambda r: mycielski(4)])
def test_batched_tabucol_keeps_its_counts_exact_along_the_moves(make, monkeypatch):
    """After hundreds of moves applied along the padded neighbour table, the neighbour counts,
    own-colour counts and costs kept incrementally equal those rebuilt from the colours (checked
    before the run hands each colouring its best assignment), and each colouring ends at the best
    cost it tracked, which is its true number of conflicting edges."""
    rng = np.random.default_rng(0)
    g = make(rng)
    dg = DeviceGraph.of(g, CPU)
    k = max(2, n_colors(dsatur(g)) - 2)
    gen = torch.Generator().manual_seed(1)
    pop = Population(dg, torch.randint(0, k, (6, g.n), generator=gen), k)
    before = pop.cost.clone()
    settle, checked = Population.settle, []

    def check_then_settle(self, col):
        ref = Population(dg, self.colorings.clone(), k)
        real = self.score.view(6, g.n + 1, k)[:, :g.n]  # the dummy rows absorb padding: not counts
        assert torch.equal(real, ref.score.view(6, g.n + 1, k)[:, :g.n]) and torch.equal(self.own, ref.own)
        assert self.cost.tolist() == [conflicts(g.edges, c) for c in self.colorings.numpy()]
        checked.append(True)
        settle(self, col)

    monkeypatch.setattr(Population, "settle", check_then_settle)
    with torch.inference_mode():
        ran = pop.tabu(300, float("inf"), gen, stop_at_zero=False)
    assert checked and (ran["iterations"] == 300 or (ran["stopped"] == "solved" and min(ran["best"]) == 0))
    assert ran["best"] == pop.cost.tolist() == [conflicts(g.edges, c) for c in pop.colorings.numpy()]
    assert (pop.cost <= before).all() and pop.colorings.min() >= 0 and pop.colorings.max() < k


def test_gpx_children_are_built_from_their_parents_classes():
    rng = np.random.default_rng(4)
    g = erdos_renyi(90, 0.3, rng)
    parents = np.stack([dsatur(g, np.random.default_rng(s)) for s in range(6)])
    k = int(parents.max()) + 1
    first, second = torch.as_tensor(parents[:3]), torch.as_tensor(parents[3:])
    child, left = gpx(first, second, k, torch.Generator().manual_seed(0))
    assert child.shape == first.shape and child.min() >= 0 and child.max() < k
    for c, lo, a, b in zip(child.numpy(), left.numpy(), first.numpy(), second.numpy()):
        # colour t (not left over) is one class of the first parent (t even) or the second (t odd), minus
        # the nodes earlier colours took
        for t in np.unique(c[~lo]):
            nodes = np.flatnonzero((c == t) & ~lo)
            src = a if t % 2 == 0 else b
            assert len(np.unique(src[nodes])) == 1
        # both parents are proper: conflicts of the child only touch nodes left over
        bad = g.edges[c[g.edges[:, 0]] == c[g.edges[:, 1]]]
        assert lo[bad].any(axis=1).all() if len(bad) else True
    # a child of two copies of one colouring (renamed) is that colouring, nothing left over
    renamed = torch.as_tensor(np.random.default_rng(1).permutation(k))[first]
    same, left = gpx(first, renamed, k, torch.Generator().manual_seed(5))
    assert not left.any() and (partition_distance(same, first, k).diagonal() == 0).all()


def test_partition_distance_counts_the_nodes_to_move():
    x = torch.tensor([[0, 0, 1, 1, 2, 2]])
    renamed = torch.tensor([[2, 2, 0, 0, 1, 1]])
    one_moved = torch.tensor([[0, 0, 1, 1, 2, 1]])
    other = torch.tensor([[0, 1, 2, 0, 1, 2]])
    d = partition_distance(x, torch.cat([x, renamed, one_moved, other]), 3)
    assert d.tolist() == [[0, 0, 1, 3]]
    assert torch.equal(partition_distance(other, x, 3), d[:, 3:])  # symmetric


def test_drop_one_color_and_squeeze_give_fewer_colours():
    g = queen(6)
    dg = DeviceGraph.of(g, CPU)
    gen = torch.Generator().manual_seed(0)
    greedy = torch.as_tensor(np.stack([greedy_coloring(g.n, g.edges), dsatur(g, np.random.default_rng(2))]))
    k = int(greedy.max()) + 1
    fewer = drop_one_color(Population(dg, greedy, k), gen)
    assert fewer.max() < k - 1 and fewer.min() >= 0
    kept = greedy != greedy.gather(1, fewer.argmax(1, keepdim=True))  # most nodes keep their class
    assert kept.float().mean() > 0.5
    squeezed = squeeze(dg, greedy, 7, gen)
    assert squeezed.max() < 7 and torch.equal(squeezed[greedy < 7], greedy[greedy < 7])


SEARCH_GRAPHS = [queen(6), mycielski(4), erdos_renyi(70, 0.5, np.random.default_rng(5), "gnp70"),
                 flat(60, 6, 0.5, np.random.default_rng(6)), Graph("edgeless", 5, np.zeros((0, 2), np.int64)),
                 Graph("one edge", 2, np.array([[0, 1]]))]


@pytest.mark.parametrize("g", SEARCH_GRAPHS, ids=lambda g: g.name)
def test_population_search_returns_a_proper_colouring_never_above_its_start(g):
    start = greedy_coloring(g.n, g.edges)
    r = population_search(g, start, population=6, tabu_iters=200, iters=6 * 1200, seconds=60.0, seed=1, stall=0)
    assert conflicts(g.edges, r.coloring) == 0 and len(r.coloring) == g.n
    assert r.colors == n_colors(r.coloring) <= n_colors(start) == r.start_colors
    assert r.coloring.max() + 1 == r.colors and r.iterations <= 6 * 1200
    assert [lv["k"] for lv in r.levels] == list(range(n_colors(start) - 1, r.colors - 1, -1))
    assert all(lv["phase"] == "population" for lv in r.levels)  # stall=0: no descent, the population does it all


def test_population_search_is_deterministic_for_a_seed_and_reaches_the_planted_k():
    g = flat(100, 10, 0.5, np.random.default_rng(7))  # DSATUR: 17 colours; 10 takes a few crossovers
    start = dsatur(g)
    runs = [population_search(g, start, population=8, tabu_iters=300, iters=8 * 1500, seconds=600.0, seed=3, stall=0)
            for _ in range(2)]
    a, b = runs
    assert np.array_equal(a.coloring, b.coloring) and a.iterations == b.iterations
    assert [(lv["k"], lv["iterations"]) for lv in a.levels] == [(lv["k"], lv["iterations"]) for lv in b.levels]
    assert a.colors == 10 < n_colors(start) and a.stopped in ("budget_iters", "lower_bound")
    assert a.generations > 0 and a.levels[-1]["phase"] == "population"
    other = population_search(g, start, population=8, tabu_iters=300, iters=8 * 300, seconds=600.0, seed=4, stall=0)
    assert other.iterations <= 8 * 300


def test_the_descent_hands_the_first_hard_level_to_the_population():
    """The single TabuCol takes the levels it solves within `stall` iterations; the population starts
    at the first it does not, and the levels' times and iteration counts only grow."""
    g = erdos_renyi(120, 0.5, np.random.default_rng(11))
    start = dsatur(g)
    r = population_search(g, start, population=6, tabu_iters=300, iters=40_000, seconds=600.0, seed=2, stall=2000)
    phases = [lv["phase"] for lv in r.levels]
    assert phases == sorted(phases) and phases[0] == "descent" and r.generations > 0  # "descent" < "population"
    assert r.descent_colors < n_colors(start) and r.colors <= r.descent_colors
    assert conflicts(g.edges, r.coloring) == 0 and r.iterations <= 40_000
    times, counts = [lv["seconds"] for lv in r.levels], [lv["iterations"] for lv in r.levels]
    assert times == sorted(times) and counts == sorted(counts)


def test_population_search_refuses_an_improper_start_and_keeps_to_its_clock():
    import time

    g = erdos_renyi(150, 0.5, np.random.default_rng(8))
    start = dsatur(g)
    bad = start.copy()
    bad[g.edges[0, 1]] = bad[g.edges[0, 0]]
    with pytest.raises(ValueError, match="proper colouring"):
        population_search(g, bad)
    t0 = time.perf_counter()
    r = population_search(g, start, population=8, seconds=0.5)
    assert time.perf_counter() - t0 < 3.0 and r.stopped == "budget_seconds"
    assert conflicts(g.edges, r.coloring) == 0 and r.colors <= n_colors(start)


def test_starts_from_the_model_and_from_randomised_dsatur():
    g = queen(5)
    calls = []

    def logits_for(k, feature_seed):
        calls.append((k, feature_seed))
        z = np.random.default_rng(feature_seed).standard_normal((g.n, 8))
        z[:, k:] = -1e4
        return z

    make = model_starts(logits_for, 8, temperature=0.5, per_pass=2, seed=1)
    a = make(6, 5)
    assert a.shape == (5, 25) and a.min() >= 0 and a.max() < 6 and len(calls) == 3  # ceil(5 / 2) passes
    assert np.array_equal(a, make(6, 5)) and len({tuple(row) for row in a}) > 1
    with pytest.raises(ValueError, match="at most 8"):
        make(9, 2)
    h = heuristic_starts(g, seed=2)(5, 4)
    assert h.shape == (4, 25) and all(conflicts(g.edges, c) == 0 for c in h)
    # a level above the model's colours (a dense graph's first hard level) falls back, never raises
    calls.clear()
    backed = model_starts(logits_for, 8, temperature=0.5, per_pass=2, seed=1, fallback=heuristic_starts(g, seed=2))
    assert np.array_equal(backed(9, 4), heuristic_starts(g, seed=2)(9, 4)) and calls == []
    assert np.array_equal(backed(6, 5), a)


def test_dsatur_matches_networkx_and_its_random_ties_stay_proper():
    import networkx as nx

    rng = np.random.default_rng(9)
    for g in benchmark_set() + [erdos_renyi(120, 0.5, rng), flat(80, 8, 0.5, rng)]:
        G = nx.Graph()
        G.add_nodes_from(range(g.n))
        G.add_edges_from(g.edges.tolist())
        ref = nx.greedy_color(G, strategy="saturation_largest_first")
        c = dsatur(g)
        assert conflicts(g.edges, c) == 0 and c.max() + 1 == max(ref.values()) + 1, g.name
        varied = [dsatur(g, np.random.default_rng(s)) for s in range(3)]
        assert all(conflicts(g.edges, v) == 0 for v in varied)


def test_flat_graphs_hide_a_proper_k_colouring_in_equal_classes_with_even_degrees():
    g = flat(300, 28, 0.5, np.random.default_rng(1))
    sizes = np.bincount(g.hidden)
    degree = np.bincount(g.edges.ravel(), minlength=g.n)
    assert conflicts(g.edges, g.hidden) == 0 and g.upper_k == 28 and sizes.max() - sizes.min() <= 1
    assert abs(g.n_edges - 0.5 * (g.n * g.n - (sizes ** 2).sum()) / 2) < 28 * 27 / 2  # the share, up to rounding
    ref = np.bincount(erdos_renyi(300, 0.48, np.random.default_rng(1)).edges.ravel(), minlength=300)
    assert degree.std() < 0.6 * ref.std()  # flatter than a random graph of the same density


def test_dense_training_data_leaves_the_sparse_graphs_as_they_were(tmp_path):
    same = [random_graph(i, 3, 20, 60, dense=0.5) for i in range(16)]
    before = [random_graph(i, 3, 20, 60) for i in range(16)]
    dense = [g for g in same if g.name.startswith(("gnp_", "flat_"))]
    assert 3 <= len(dense) <= 13
    for g, b in zip(same, before):
        if not g.name.startswith(("gnp_", "flat_")):
            assert g.name == b.name and np.array_equal(g.edges, b.edges)
    assert max(g.n_edges / (g.n * (g.n - 1) / 2) for g in dense) > 0.3
    meta = write_dataset(tmp_path / "d", 8, 2, seed=3, min_nodes=20, max_nodes=40, workers=1, progress=False,
                         dense=0.5)
    assert meta["dense"] == 0.5 and len(GraphSplit(tmp_path / "d", "train")) == 8


def test_training_can_offer_fewer_colours_than_the_bound(tmp_path):
    write_dataset(tmp_path / "d", 12, 2, seed=1, min_nodes=20, max_nodes=60, workers=1, progress=False, dense=0.5)
    split = GraphSplit(tmp_path / "d", "train")
    plain = DeviceGraphs(split, 16, 3, CPU)
    fewer = DeviceGraphs(split, 16, 3, CPU, fewer_colors=0.4)
    idx = np.arange(12)
    bound = np.minimum(split.color_bound, 16)
    a = plain.batch(idx, torch.Generator().manual_seed(1))
    b = fewer.batch(idx, torch.Generator().manual_seed(1))
    assert torch.equal(a.x, b.x)  # the same features: the cut is drawn after them
    offered = lambda batch: np.array([int(batch.color_mask[s].sum()) for s in np.cumsum([0, *split.nodes[:-1]])])  # noqa: E731
    assert np.array_equal(offered(a), bound)
    got = offered(b)
    assert (got <= bound).all() and (got >= np.maximum(2, np.floor(bound * 0.6))).all() and (got < bound).any()
    c = fewer.batch(idx, torch.Generator().manual_seed(1))
    assert torch.equal(b.color_mask, c.color_mask)  # a pure function of the generator: resumes redraw it
