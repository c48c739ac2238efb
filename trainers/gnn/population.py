"""A population search for graph colouring on the device: the hybrid evolutionary algorithm of
Galinier & Hao (1999) -- greedy partition crossover (GPX) + TabuCol -- with P colourings held as
tensors and improved all at once. The same code runs on a GPU and on the CPU (torch only).

    result = population_search(g, start, population=32, seconds=60, device="cpu", seed=0)

How it is laid out, and why:

- **Batched TabuCol** (`Population.tabu`). P assignments with k colours (conflicts allowed) live in
  one tensor; `score[p, v, c]` counts v's neighbours of colour c in colouring p, plus a large offset at v's own
  colour (so `score - own` is the change in conflicting edges of every move, the non-moves priced
  out, as in trainers.gnn.search). Each iteration moves one conflicting node in every colouring at
  once: the conflicting (colouring, node) pairs are gathered (on a CPU, where they are few, this is
  what keeps an iteration cheap), every move of theirs gets an int32 key -- change in conflicts,
  then a random rotation of the colour for ties -- tabu moves are priced out unless they reach a
  new best (aspiration), and one `amin` per row plus one `scatter_reduce` per colouring picks the
  move. The move is applied along the moved node's edges only (a padded neighbour table, one
  `index_add_` per colour). Tenure: 0.6 x (conflicting nodes) + U{0..9}, as TabuCol.
- **GPX** (`gpx`): the child takes, alternately from each parent, the colour class with the most
  nodes not yet placed, k times; nodes left over take a random colour. All P children at once.
- **Diversity**: the distance between two colourings is the partition distance (nodes that must
  change colour to turn one into the other, classes matched greedily by overlap). A child replaces
  its parent only when it is no worse and not a near copy (distance < `min_distance` x n) of a
  better member; a member with a near copy that is better is replaced by a fresh start. So the
  population does not collapse onto one colouring.
- **Levels**: the search starts one colour below a proper colouring. When a colouring of the
  population reaches zero conflicts it is the new best; every member then drops the colour class
  whose nodes fit elsewhere with the fewest conflicts, and the search goes on at one colour fewer.
  It stops at the clique lower bound, the time budget or the iteration budget.

Guarantees (tested): the result is a proper colouring with no more colours than the start; the
same seed and an iteration budget give the same result; GPX children are assignments of every
node with colours < k, and a child of two identical parents is the parent (up to renaming).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from trainers.gnn.graphs import Graph, conflicts

DENSE_NODES = 2048  # up to here the adjacency is held as a matrix (16 MB of float32 at most)


@dataclass
class DeviceGraph:
    """A graph on a device: a neighbour table [n + 1, D] padded with the dummy node n (row n is all
    dummy), both directions of every edge, and for graphs of up to DENSE_NODES nodes the adjacency
    matrix (building the neighbour counts of a whole population is then one matrix product, about
    ten times faster than adding along every edge of every colouring)."""

    n: int
    nbr: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    adjacency: torch.Tensor | None = None  # [n, n] float32 0/1

    @staticmethod
    def of(g: Graph, device: torch.device) -> "DeviceGraph":
        both = np.concatenate([g.edges, g.edges[:, ::-1]]) if g.n_edges else np.zeros((0, 2), np.int64)
        both = both[np.lexsort((both[:, 1], both[:, 0]))]
        degree = np.bincount(both[:, 0], minlength=g.n)
        table = np.full((g.n + 1, max(int(degree.max()) if g.n else 0, 1)), g.n, dtype=np.int64)
        first = np.searchsorted(both[:, 0], np.arange(g.n))
        table[both[:, 0], np.arange(len(both)) - first[both[:, 0]]] = both[:, 1]
        t = lambda a: torch.as_tensor(np.ascontiguousarray(a), device=device)  # noqa: E731
        dense = None
        if g.n <= DENSE_NODES:
            dense = torch.zeros(g.n, g.n, dtype=torch.float32, device=device)
            dense[t(both[:, 0]), t(both[:, 1])] = 1.0
        return DeviceGraph(g.n, t(table), t(both[:, 0]), t(both[:, 1]), dense)


class Population:
    """P assignments of k colours to the n nodes of one graph, with the neighbour counts TabuCol
    needs, on one device. Rows are (colouring, node) pairs, p * (n + 1) + v; row p * (n + 1) + n of
    each colouring is a dummy that absorbs the padding of the neighbour table."""

    def __init__(self, dg: DeviceGraph, col: torch.Tensor, k: int):
        self.dg, self.k = dg, k
        self.P, n = col.shape
        self.device = dg.nbr.device
        self.col = torch.zeros(self.P, n + 1, dtype=torch.int64, device=self.device)
        self.col[:, :n] = col
        self.rebuild()

    @property
    def colorings(self) -> torch.Tensor:
        return self.col[:, :self.dg.n]

    def rebuild(self) -> None:
        """Neighbour counts, own-colour counts and conflicts from the colours alone."""
        P, n, k, dev = self.P, self.dg.n, self.k, self.device
        self.cbits = max(1, (k - 1).bit_length())  # a move's colour, in the low bits of its key
        self.big = 1 << (30 - self.cbits)  # own-colour offset: (d + big) << cbits stays below 2**31
        if self.cbits > 10 or self.dg.nbr.shape[1] >= self.big // 4:
            raise ValueError(f"{k} colours or degree {self.dg.nbr.shape[1]}: more than the int32 move keys hold")
        self.base = torch.arange(P, device=dev) * (n + 1)  # first row of each colouring
        rows = P * (n + 1)
        if self.dg.adjacency is not None:  # counts of every colour among every node's neighbours: A @ one-hot
            onehot = torch.nn.functional.one_hot(self.col[:, :n].T, k).to(torch.float32).reshape(n, P * k)
            counts = (self.dg.adjacency @ onehot).view(n, P, k).permute(1, 0, 2)
            score = torch.zeros(P, n + 1, k, dtype=torch.int32, device=dev)
            score[:, :n] = counts.round().to(torch.int32)
            score = score.view(-1)
        else:
            score = torch.zeros(rows * k, dtype=torch.int32, device=dev)
            if len(self.dg.src):
                idx = (self.base[:, None] + self.dg.src[None]) * k + self.col[:, self.dg.dst]
                score.index_add_(0, idx.reshape(-1), torch.ones(idx.numel(), dtype=torch.int32, device=dev))
        own_at = torch.arange(rows, device=dev) * k + self.col.reshape(-1)
        self.own = score[own_at].clone()
        self.own[self.base + n] = 0
        score[own_at] += self.big
        self.score = score
        self.cost = self.own.view(P, n + 1).sum(1).long() // 2

    def tabu(self, iters: int, deadline: float, gen: torch.Generator, stop_at_zero: bool = True) -> dict:
        """Up to `iters` TabuCol iterations on every colouring at once (module docstring). Each
        colouring ends at the best assignment it saw. Stops early when one reaches zero conflicts
        (checked every 16 iterations; a colouring with none stays put) or at `deadline`."""
        P, n, k, dev, big, cbits = self.P, self.dg.n, self.k, self.device, self.big, self.cbits
        score, own, col, base = self.score, self.own, self.col.view(-1), self.base
        score2 = score.view(-1, k)
        # the moved node's own row rides with its neighbours' (last column): -1/+1 for them, -big/+big for it
        nbr = torch.cat([self.dg.nbr, torch.arange(n + 1, device=dev)[:, None]], 1)
        step = torch.ones(P, nbr.shape[1], dtype=torch.int32, device=dev)
        step[:, -1] = big
        step, unstep = step.view(-1), -step.view(-1)
        tabu = torch.zeros(P * (n + 1), k, dtype=torch.int32, device=dev)
        taboo = big // 2  # a tabu move without aspiration: after every real move, before a non-move
        dummy = base + n
        row_p = torch.arange(P, device=dev).repeat_interleave(n + 1)
        cost = self.cost.clone()
        best = cost.clone()
        best_col = self.col.clone()
        none = torch.full((P,), torch.iinfo(torch.int64).max, dtype=torch.int64, device=dev)
        it, stopped, block, cmask = 0, "budget_iters", 64, (1 << cbits) - 1
        while it < iters:
            if it % block == 0:
                if stop_at_zero and bool((best == 0).any()):
                    stopped = "solved"
                    break
                if time.perf_counter() > deadline:
                    stopped = "budget_seconds"
                    break
                # random numbers for the next block of iterations: tenure noise U{0..9}, the order in
                # which equal moves are preferred (a permutation of the colours, a rotation of the rows)
                noise = torch.randint(0, 10, (block, P), generator=gen, device=dev)
                perms = torch.rand(block, k, generator=gen, device=dev).argsort(1)
                codes = perms.argsort(1).int()  # colour c's tie-breaking code in each iteration
                shifts = torch.randint(0, 1 << 30, (block,), generator=gen, device=dev)  # (a09b8e2 drew
                # these without device=: CUDA refused its generator for a host tensor)
            j = it % block
            it += 1
            rows = (own > 0).nonzero().squeeze(1)  # conflicting (colouring, node) rows
            T = len(rows)
            if T == 0:
                stopped = "solved"
                break
            p_of = row_p.index_select(0, rows)
            o = own.index_select(0, rows)
            # each row's neighbour counts per colour: a move's change in conflicting edges is
            # s - o (the own colour, offset by big, never wins); tabu moves are priced out unless they
            # reach a new best for their colouring (aspiration: s - o < best - cost)
            s = score2.index_select(0, rows)
            threshold = ((best - cost).index_select(0, p_of) + o).int()
            s.masked_fill_((tabu.index_select(0, rows) > it) & (s >= threshold[:, None]), taboo)
            row_min = ((s << cbits) | codes[j]).amin(1)
            # one move per colouring: the lowest change, then the colour's code, then the rotated row
            d = (row_min >> cbits) - o
            order = (torch.arange(T, device=dev) + shifts[j]) % T
            pick_key = (d.long() << (cbits + 32)) | ((row_min & cmask).long() << 32) | order
            pick = none.clone().scatter_reduce_(0, p_of, pick_key, "amin")
            active = pick != none[0]
            chosen = torch.where(active, ((pick & 0xFFFFFFFF) - shifts[j]) % T, 0)
            r = torch.where(active, rows[chosen], dummy)
            a = col[r]
            c = torch.where(active, perms[j][torch.where(active, (pick >> 32) & cmask, 0)], a)
            # the move, along the node's edges: its neighbours lose one neighbour of colour a and
            # gain one of c; its own row moves the big offset from a to c
            nb = base[:, None] + nbr[r - base]
            nbk = nb * k
            score.index_add_(0, (nbk + a[:, None]).view(-1), unstep)
            score.index_add_(0, (nbk + c[:, None]).view(-1), step)
            col[r] = c
            own[nb] = score[nbk + col[nb]] - big
            own[dummy] = 0
            tenure = torch.bincount(p_of, minlength=P) * 6 // 10 + noise[j]
            tabu.view(-1)[r * k + a] = (tenure + it).int()
            cost = own.view(P, n + 1).sum(1) // 2
            better = cost < best  # kept on the device: no host wait per iteration
            best = torch.where(better, cost, best)
            best_col = torch.where(better[:, None], self.col, best_col)
        self.cost = cost
        self.settle(best_col)
        return {"iterations": it, "stopped": stopped, "best": best.tolist()}

    def settle(self, col: torch.Tensor) -> None:
        """Each colouring takes the best assignment its run saw (counts rebuilt for it)."""
        self.col.copy_(col)
        self.rebuild()


def gpx(first: torch.Tensor, second: torch.Tensor, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy partition crossover (Galinier & Hao 1999) of C pairs at once: the child takes, for
    t = 0..k-1, the colour class with the most nodes not yet placed from `first` (t even) or
    `second` (t odd), as its colour t; nodes no class took get a random colour. Returns the children
    [C, n] and which nodes were left over [C, n] (bool). Classes are picked by size, ties at random."""
    C, n = first.shape
    dev = first.device
    child = torch.zeros_like(first)
    free = torch.ones(C, n, dtype=torch.bool, device=dev)
    for t in range(k):
        src = first if t % 2 == 0 else second
        counts = torch.zeros(C, k, dtype=torch.int64, device=dev).scatter_add_(1, src, free.long())
        noise = torch.randint(0, 1 << 16, (C, k), generator=gen, device=dev)
        pick = (counts * (1 << 16) + noise).argmax(1)
        take = free & (src == pick[:, None])
        child.masked_fill_(take, t)
        free &= ~take
    child = torch.where(free, torch.randint(0, k, (C, n), generator=gen, device=dev), child)
    return child, free


def partition_distance(x: torch.Tensor, y: torch.Tensor, k: int) -> torch.Tensor:
    """[A, B]: for each pair, a lower bound on the partition distance (the fewest nodes that must
    change colour to turn one colouring into the other, up to renaming colours): n minus the overlap
    of each class with its best match in the other colouring, the larger of the two directions.
    Exact when the two are close (every class's best match is a different class), which is what the
    diversity rule needs to see: near copies."""
    A, n = x.shape
    B = y.shape[0]
    out = torch.empty(A, B, dtype=torch.int64, device=x.device)
    bins = torch.arange(B, device=x.device)[:, None] * (k * k)
    for a in range(A):
        overlap = torch.bincount((bins + x[a][None] * k + y).reshape(-1), minlength=B * k * k).view(B, k, k)
        matched = torch.maximum(overlap.amax(2).sum(1), overlap.amax(1).sum(1))
        out[a] = n - matched
    return out


def drop_one_color(pop: Population, gen: torch.Generator) -> torch.Tensor:
    """Each colouring with one colour fewer: the class whose nodes fit into the others with the
    fewest conflicts is emptied, each of its nodes moving to the colour with fewest neighbours in it
    (ties at random); colours above it are renumbered down. [P, n], colours < k - 1."""
    P, n, k = pop.P, pop.dg.n, pop.k
    s = pop.score.view(P, n + 1, k)[:, :n].long()  # big at the own colour: never the best other class
    noisy = s * 64 + torch.randint(0, 64, s.shape, generator=gen, device=s.device)
    target = noisy.argmin(2)
    fit = s.gather(2, target[:, :, None])[:, :, 0]
    col = pop.colorings
    cost = torch.zeros(P, k, dtype=torch.int64, device=s.device).scatter_add_(1, col, fit)
    size = torch.zeros(P, k, dtype=torch.int64, device=s.device).scatter_add_(1, col, torch.ones_like(col))
    drop = (cost * (n + 1) + size).argmin(1)[:, None]  # fewest conflicts, then fewest nodes
    out = torch.where(col == drop, target, col)
    return torch.where(out > drop, out - 1, out)


def squeeze(dg: DeviceGraph, col: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """Assignments with colours >= k (e.g. greedy colourings with more colours) brought to k colours:
    each node above takes, at once, the colour < k with fewest neighbours among the nodes already
    below k (ties at random). Conflicts may remain; the tabu search takes them from there."""
    over = col >= k
    if not bool(over.any()):
        return col
    P, n = col.shape
    counted = Population(dg, torch.where(over, k, col), k + 1)  # colour k: "not yet placed"
    s = counted.score.view(P, n + 1, k + 1)[:, :n, :k].long()  # the own colour (k) is not among them
    noisy = s * 64 + torch.randint(0, 64, s.shape, generator=gen, device=col.device)
    return torch.where(over, noisy.argmin(2), col)


@dataclass
class PopulationResult:
    coloring: np.ndarray  # proper, colours 0..colors-1
    colors: int
    start_colors: int
    iterations: int  # TabuCol moves summed over the population
    generations: int
    seconds: float
    stopped: str  # lower_bound | budget_iters | budget_seconds | no_colors_to_remove
    levels: list[dict] = field(default_factory=list)  # per k solved: {"k", "seconds", "iterations", "generation"}
    population: int = 0
    device: str = "cpu"
    start_seconds: float = 0.0  # spent making the first population (its source's cost: model passes, DSATURs)
    descent_colors: int = 0  # where the single TabuCol stalled and the population took over


Starts = Callable[[int, int], np.ndarray]  # (k, P) -> [P, n] assignments, colours >= 0 (>= k: squeezed)


@dataclass(frozen=True)
class Evolution:
    """How the population phase runs (population_search's options, as it hands them on)."""

    population: int
    tabu_iters: int  # each generation's TabuCol depth
    iters: int  # moves, summed over the population, of the whole search
    deadline: float  # time.perf_counter() at which the search stops
    device: str
    seed: int
    lower: int  # the clique lower bound: no colouring has fewer colours
    dmin: int  # the partition distance under which two members count as copies
    t0: float  # when the search began (the levels' seconds count from it)
    scheme: str = "pairs"
    cycle: int = 10  # pairs: generations per elite cycle


def heuristic_starts(g: Graph, seed: int = 0) -> Starts:
    """The population's first members from randomised DSATUR with at most k colours (ties at random;
    a node with every colour among its neighbours takes the least used one), as the hybrid
    evolutionary algorithm builds its first population."""
    from trainers.gnn.dsatur import dsatur

    def make(k: int, P: int) -> np.ndarray:
        rng = np.random.default_rng([seed, k])
        return np.stack([dsatur(g, rng, k) for _ in range(P)])

    return make


def model_starts(logits_for: Callable[[int, int], np.ndarray], max_colors: int, temperature: float = 1.0,
                 per_pass: int = 4, seed: int = 0, fallback: Starts | None = None) -> Starts:
    """The population's first members sampled from the GNN: `logits_for(k, feature_seed)` runs the
    model with k colours offered and those random node features ([n, max_colors] logits); each pass
    gives `per_pass` colourings, each node's colour drawn from softmax(logits / temperature) over
    the k offered. Different features and draws make different members. Needs k <= max_colors:
    beyond, `fallback` makes them (e.g. heuristic_starts), or it raises ValueError."""

    def make(k: int, P: int) -> np.ndarray:
        if k > max_colors:
            if fallback is not None:
                return fallback(k, P)
            raise ValueError(f"the model offers at most {max_colors} colours; {k} asked")
        rng = np.random.default_rng([seed, k, 7])
        out = []
        for i in range(-(-P // per_pass)):
            z = np.asarray(logits_for(k, seed * 1009 + i), dtype=np.float64)[:, :k] / temperature
            prob = np.exp(z - z.max(1, keepdims=True))
            cdf = np.cumsum(prob / prob.sum(1, keepdims=True), 1)
            for _ in range(per_pass):
                out.append(np.minimum((cdf < rng.random((len(z), 1))).sum(1), k - 1))
        return np.stack(out[:P])

    return make


def select(pool: torch.Tensor, cost: torch.Tensor, k: int, keep: int, min_distance: int) -> torch.Tensor:
    """Indices of `keep` members of `pool` [M, n]: best cost first (earlier rows first on ties: the
    caller puts children first), skipping any within `min_distance` of one already kept; if too few
    are far enough apart, the nearest misses fill up, best first."""
    dist = partition_distance(pool, pool, k).cpu().numpy()
    order = np.lexsort((np.arange(len(pool)), cost.cpu().numpy()))
    kept, skipped = [], []
    for i in order:
        (kept if all(dist[i, j] >= min_distance for j in kept) else skipped).append(int(i))
        if len(kept) == keep:
            break
    kept += skipped[:keep - len(kept)]
    return torch.as_tensor(kept, device=pool.device)


# Thirteen parameters, all but two keywords with defaults: a search entry point as scipy's are (the bench, the tests
# and `gnn color` each set their own few); inside, the population phase takes one Evolution.
def population_search(g: Graph, start: np.ndarray, starts: Starts | None = None, population: int = 32,
                      tabu_iters: int = 2000, iters: int = 10**12, seconds: float = 60.0, device: str = "cpu",
                      seed: int = 0, lower: int | None = None, min_distance: float = 0.05,
                      stall: int | None = None, scheme: str = "pairs") -> PopulationResult:
    """The fewest-colour proper colouring found from the proper colouring `start` (module
    docstring). `starts(k, P)` makes the first population (default: randomised DSATUR);
    `tabu_iters` is each generation's TabuCol depth; `iters` (moves, summed over the population)
    and `seconds` bound the whole search; `min_distance` x n is the partition distance under which
    two members count as copies; `stall` (default 500 n) is how many iterations the single TabuCol
    of the descent may spend on a level before the population takes it over."""
    from trainers.gnn.search import clique_lower_bound, reduce_colors

    t0 = time.perf_counter()
    deadline = t0 + seconds
    start = np.asarray(start, dtype=np.int64)
    if len(start) != g.n or (g.n and start.min() < 0) or conflicts(g.edges, start):
        raise ValueError("population_search needs a proper colouring of every node to start from")
    _, best = np.unique(start, return_inverse=True)
    k = int(best.max()) + 1 if g.n else 0
    result = PopulationResult(best, k, k, 0, 0, 0.0, "no_colors_to_remove", [], population, str(device))
    lower = max(clique_lower_bound(g) if lower is None else lower, 1)
    stall = 500 * g.n if stall is None else stall

    # 1. the descent: one NumPy TabuCol (about 50k moves/s on one core, more than one colouring of a
    # batch gets) takes the easy levels; a level it cannot solve in `stall` iterations is hard
    while k > lower:
        budget = min(stall, iters - result.iterations)
        if budget <= 0 or time.perf_counter() > deadline:
            break
        elapsed = time.perf_counter() - t0
        r = reduce_colors(g, best, iters=budget, seconds=deadline - time.perf_counter(), seed=seed + len(result.levels),
                          lower=lower)
        for lv in r.levels:
            elapsed += lv["seconds"]
            result.iterations += lv["iterations"]
            if lv["solved"]:
                result.levels.append({"k": lv["k"], "seconds": round(elapsed, 3), "iterations": result.iterations,
                                      "generation": 0, "phase": "descent"})
        if r.colors >= k:
            break  # stalled: the population takes this level
        best, k = r.coloring, r.colors
    result.descent_colors = k
    if k <= lower:
        result.stopped = "lower_bound"
    elif result.iterations >= iters:
        result.stopped = "budget_iters"
    elif time.perf_counter() > deadline:
        result.stopped = "budget_seconds"
    else:  # 2. the population takes the first hard level
        plan = Evolution(population, tabu_iters, iters, deadline, device, seed, lower,
                         dmin=max(1, int(round(min_distance * g.n))), t0=t0, scheme=scheme)
        result.stopped = _evolve(g, best, k, result, starts, plan)
        best, k = result.coloring, result.colors
    _, best = np.unique(best, return_inverse=True)
    assert conflicts(g.edges, best) == 0 and (not g.n or best.max() + 1 <= result.start_colors)
    result.coloring, result.colors = best, int(best.max()) + 1 if g.n else 0
    result.seconds = time.perf_counter() - t0
    return result


def _evolve(g: Graph, best: np.ndarray, k: int, result: PopulationResult, starts: Starts | None,
            plan: Evolution) -> str:
    """The hybrid evolutionary algorithm from k - 1 colours down; `best` is a proper k-colouring.
    Writes the best colouring into `result` and returns why it stopped."""
    population, tabu_iters, iters, deadline, seed = plan.population, plan.tabu_iters, plan.iters, plan.deadline, plan.seed
    lower, dmin, t0, scheme, cycle, device = plan.lower, plan.dmin, plan.t0, plan.scheme, plan.cycle, plan.device
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    dg = DeviceGraph.of(g, dev)
    result.coloring, result.colors = best, k
    make = starts or heuristic_starts(g, seed)
    half = population // 2
    with torch.inference_mode():
        t = time.perf_counter()
        first = make(k - 1, population)
        first = squeeze(dg, torch.as_tensor(np.asarray(first, dtype=np.int64), device=dev), k - 1, gen)
        result.start_seconds = time.perf_counter() - t
        pop = Population(dg, first, k - 1)
        fresh = True  # the first population is improved by TabuCol before any crossover (as in HEA)
        partner = (torch.arange(population, device=dev) + half) % population  # pairs: i and i + P/2
        elite = [None, None]  # pairs: per pair, the best of this cycle and of the last (colourings, costs)
        while True:
            depth = min(tabu_iters, (iters - result.iterations) // population)
            if depth <= 0:
                return "budget_iters"
            if time.perf_counter() > deadline:
                return "budget_seconds"
            if fresh:
                children = pop
            else:
                if scheme == "pairs":  # each pair's two children: GPX(a, b) and GPX(b, a)
                    other = partner
                else:  # every member is a first parent once; its partner is another member, at random
                    other = (torch.arange(population, device=dev) + torch.randint(
                        1, max(population, 2), (population,), generator=gen, device=dev)) % population
                kids, _ = gpx(pop.colorings, pop.colorings[other], pop.k, gen)
                children = Population(dg, kids, pop.k)
            ran = children.tabu(depth, deadline, gen)
            result.iterations += ran["iterations"] * population
            result.generations += 0 if fresh else 1
            i = int(children.cost.argmin())
            if int(children.cost[i]) == 0:
                result.coloring, result.colors = children.colorings[i].cpu().numpy().copy(), pop.k
                result.levels.append({"k": pop.k, "seconds": round(time.perf_counter() - t0, 3),
                                      "iterations": result.iterations, "generation": result.generations,
                                      "phase": "population"})
                if pop.k <= lower:
                    return "lower_bound"
                pop = Population(dg, drop_one_color(children, gen), pop.k - 1)  # every member drops a colour
                fresh, elite = True, [None, None]
                continue
            if scheme == "pairs":
                pop = _pairs_replace(dg, children, elite, result.generations, cycle, dmin, half, make, gen)
            elif fresh:
                pop = children
            else:  # children first: on equal cost the newer colouring stays (the search keeps moving)
                pool = torch.cat([children.colorings, pop.colorings])
                cost = torch.cat([children.cost, pop.cost])
                pop = Population(dg, pool[select(pool, cost, pop.k, population, dmin)], pop.k)
            fresh = False


def _pairs_replace(dg: DeviceGraph, children: Population, elite: list, generation: int, cycle: int, dmin: int,
                   half: int, make: Starts, gen: torch.Generator) -> Population:
    """HEAD's rule (Moalic & Gondran 2018) for every pair at once: the children replace their
    parents; each pair keeps the best colouring of the current cycle of `cycle` generations, and at
    the end of a cycle the best of the previous one replaces the pair's first member (diversity from
    the past); a pair whose two members are within `dmin` of each other (the pair has collapsed)
    gets a fresh second member from the starts."""
    col, cost, k = children.colorings.clone(), children.cost.clone(), children.k
    both = torch.stack([cost[:half], cost[half:2 * half]], 1)
    pick = both.argmin(1)
    idx = torch.arange(half, device=col.device) + pick * half
    now = (col[idx].clone(), cost[idx].clone())
    if elite[0] is None:
        elite[0] = now
    else:
        better = now[1] < elite[0][1]
        elite[0] = (torch.where(better[:, None], now[0], elite[0][0]), torch.where(better, now[1], elite[0][1]))
    changed = False
    if generation % cycle == 0:
        if elite[1] is not None:
            col[:half], changed = elite[1][0], True
        elite[1], elite[0] = elite[0], None
    same = partition_distance(col[:half], col[half:2 * half], k).diagonal() < dmin
    if bool(same.any()):
        fresh = torch.as_tensor(np.asarray(make(k, int(same.sum())), dtype=np.int64), device=col.device)
        col[half + same.nonzero().squeeze(1)] = squeeze(dg, fresh, k, gen)
        changed = True
    return Population(dg, col, k) if changed else children
