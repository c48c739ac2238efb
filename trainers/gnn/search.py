"""Local search that takes colours away from a valid colouring: TabuCol (Hertz & de Werra 1987, as
in the `gcol` library), vectorised with NumPy. No torch: `trainers gnn color` uses it without.

    result = reduce_colors(g, start, iters=200_000, seconds=5.0, seed=0)

From a proper colouring with k colours, one colour class is removed (the one whose nodes fit back
with the fewest conflicts; each node moves to the remaining colour with fewest neighbours in it),
and TabuCol looks for a proper (k-1)-colouring from there: each iteration moves one conflicting
node to the colour that lowers the number of conflicting edges most, with the move back made tabu
for 0.6 x (conflicting nodes) + U{0..9} iterations unless it beats the best seen (aspiration).
When it reaches zero conflicts, the next colour is removed; it stops at the first level it cannot
solve within the budget, or at the clique lower bound, where no fewer colours exist.

What it promises, and the tests check: the result is always a proper colouring, never uses more
colours than `start`, and is the same for the same seed when the iteration budget (not the clock)
ends the search.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from trainers.gnn.graphs import Graph, conflicts

NOT_A_MOVE = np.iinfo(np.int32).max // 4  # the "move" to a node's own colour, and forbidden moves


@dataclass
class SearchResult:
    coloring: np.ndarray  # proper, colours 0..colors-1
    colors: int
    start_colors: int
    iterations: int
    seconds: float
    stopped: str  # lower_bound | budget_iters | budget_seconds | no_colors_to_remove
    levels: list[dict] = field(default_factory=list)  # per k tried: {"k", "solved", "iterations", "seconds"}


def csr(n: int, edges: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(indptr [n+1], neighbours [2E]) of an undirected edge list."""
    both = np.concatenate([edges, edges[:, ::-1]]) if len(edges) else np.zeros((0, 2), np.int64)
    order = np.argsort(both[:, 0], kind="stable")
    indptr = np.searchsorted(both[order, 0], np.arange(n + 1)).astype(np.int64)
    return indptr, both[order, 1].astype(np.int64)


def clique_lower_bound(g: Graph, starts: int = 32) -> int:
    """The size of a clique found greedily (from the highest-degree nodes, each time adding the
    candidate with most neighbours among the remaining candidates): no colouring has fewer colours."""
    if g.n == 0:
        return 0
    if g.n_edges == 0:
        return 1
    indptr, nbr = csr(g.n, g.edges)
    degree = np.diff(indptr)
    best = 1
    in_cand = np.zeros(g.n, dtype=bool)
    for s in np.argsort(-degree, kind="stable")[:starts]:
        if degree[s] + 1 <= best:
            break  # sorted by degree: no later start can beat it
        cand = nbr[indptr[s]:indptr[s + 1]]
        size = 1
        while len(cand) and size + len(cand) > best:
            in_cand[cand] = True
            within = np.array([in_cand[nbr[indptr[u]:indptr[u + 1]]].sum() for u in cand])
            in_cand[cand] = False
            u = cand[int(np.argmax(within))]
            size += 1
            cand = np.intersect1d(cand, nbr[indptr[u]:indptr[u + 1]], assume_unique=True)
        best = max(best, size)
    return int(best)


def _neighbour_counts(indptr: np.ndarray, nbr: np.ndarray, color: np.ndarray, k: int) -> np.ndarray:
    """gamma[v, c]: how many neighbours of v have colour c."""
    n = len(indptr) - 1
    src = np.repeat(np.arange(n), np.diff(indptr))
    return np.bincount(src * k + color[nbr], minlength=n * k).reshape(n, k).astype(np.int32)


def _drop_one_color(indptr, nbr, color: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """A (k-1)-colour assignment (with conflicts) from a proper k-colouring: remove the class whose
    nodes fit into the other classes with fewest conflicts."""
    gamma = _neighbour_counts(indptr, nbr, color, k).astype(np.int64)
    gamma[np.arange(len(color)), color] = NOT_A_MOVE
    fit = gamma.min(axis=1)  # conflicts a node causes in the best other class
    cost = np.bincount(color, weights=fit, minlength=k)
    size = np.bincount(color, minlength=k)
    drop = int(np.lexsort((size, cost))[0])  # fewest conflicts, then fewest nodes
    moved = color == drop
    options = gamma[moved] == fit[moved][:, None]
    # among equally good classes, a random one: the seeded rng keeps it reproducible
    pick = np.argmax(options * rng.random(options.shape), axis=1)
    color = color.copy()
    color[moved] = pick
    return np.where(color > drop, color - 1, color)


def tabucol(indptr: np.ndarray, nbr: np.ndarray, color: np.ndarray, k: int, rng: np.random.Generator,
            max_iters: int, deadline: float) -> tuple[np.ndarray | None, int, str]:
    """TabuCol with k colours from `color` (values < k, conflicts allowed). Returns (a proper
    colouring or None, iterations used, why it stopped).

    `score[v, c]` is the number of neighbours of v with colour c, plus NOT_A_MOVE at v's own
    colour, so `score[v] - own[v]` is the change in conflicting edges of every move of v, the
    non-moves already priced out; each iteration costs a fixed handful of NumPy calls over the
    conflicting nodes only."""
    n = len(color)
    color = color.astype(np.int64).copy()
    nodes = np.arange(n)
    score = _neighbour_counts(indptr, nbr, color, k).astype(np.int64)
    own = score[nodes, color].copy()  # neighbours sharing v's colour
    score[nodes, color] += NOT_A_MOVE
    cost = int(own.sum()) // 2
    best_cost = cost
    tabu = np.zeros((n, k), dtype=np.int64)  # move (v -> c) is tabu while iteration < tabu[v, c]
    it = 0
    while cost > 0:
        if it >= max_iters:
            return None, it, "budget_iters"
        if it & 63 == 0 and time.perf_counter() > deadline:
            return None, it, "budget_seconds"
        it += 1
        conf = own.nonzero()[0]
        delta = score[conf] - own[conf][:, None]
        low = int(delta.min())
        if cost + low >= best_cost:  # no move reaches a new best (aspiration): tabu moves are out
            delta[tabu[conf] > it] = NOT_A_MOVE
            low = int(delta.min())
        if low >= NOT_A_MOVE // 2:  # every move tabu: a random one
            v = int(conf[rng.integers(len(conf))])
            c = int((color[v] + 1 + rng.integers(k - 1)) % k)
            low = int(score[v, c]) - int(own[v])
        else:
            ties = (delta.ravel() == low).nonzero()[0]
            choice = int(ties[rng.integers(len(ties))]) if len(ties) > 1 else int(ties[0])
            v, c = int(conf[choice // k]), choice % k
        old = int(color[v])
        u = nbr[indptr[v]:indptr[v + 1]]
        score[u, old] -= 1
        score[u, c] += 1
        own[u] = score[u, color[u]] - NOT_A_MOVE
        score[v, old] -= NOT_A_MOVE
        score[v, c] += NOT_A_MOVE
        color[v] = c
        own[v] = score[v, c] - NOT_A_MOVE
        cost += low
        best_cost = min(best_cost, cost)
        tabu[v, old] = it + int(0.6 * len(conf)) + int(rng.integers(10))
    return color, it, "solved"


def _from_hint(hint: np.ndarray, k: int) -> np.ndarray | None:
    """A hint (any assignment, e.g. the model's argmax) renumbered 0.., when it uses at most k colours."""
    _, compact = np.unique(hint, return_inverse=True)
    return compact if compact.max() < k else None


def reduce_colors(g: Graph, start: np.ndarray, iters: int = 200_000, seconds: float = 5.0, seed: int = 0,
                  lower: int | None = None, hints: list[np.ndarray] = ()) -> SearchResult:
    """The fewest-colour proper colouring found from the proper colouring `start` (see the module
    docstring). `iters` and `seconds` bound the whole search; `lower` (default: a greedy clique) is
    where it stops early. `hints` are assignments with conflicts (the model's argmax at several
    colour counts): at each level the search starts from whichever of them (using at most that
    many colours) or the dropped-class colouring has the fewest conflicting edges."""
    t0 = time.perf_counter()
    deadline = t0 + seconds
    start = np.asarray(start, dtype=np.int64)
    if len(start) != g.n or (g.n and start.min() < 0) or conflicts(g.edges, start):
        raise ValueError("reduce_colors needs a proper colouring of every node to start from")
    _, best = np.unique(start, return_inverse=True)  # colours 0..k-1
    k = int(best.max()) + 1 if g.n else 0
    start_colors = k
    lower = clique_lower_bound(g) if lower is None else lower
    rng = np.random.default_rng(seed)
    indptr, nbr = csr(g.n, g.edges)
    used, levels, stopped = 0, [], "no_colors_to_remove"
    while True:
        if k <= max(lower, 1):
            stopped = "lower_bound"
            break
        if used >= iters:
            stopped = "budget_iters"
            break
        if time.perf_counter() > deadline:
            stopped = "budget_seconds"
            break
        level_t0 = time.perf_counter()
        trials = [_drop_one_color(indptr, nbr, best, k, rng)]
        trials += [t for t in (_from_hint(h, k - 1) for h in hints if g.n) if t is not None]
        trial = min(trials, key=lambda t: conflicts(g.edges, t))  # the first (dropped class) on ties
        found, n_iters, why = tabucol(indptr, nbr, trial, k - 1, rng, iters - used, deadline)
        used += n_iters
        levels.append({"k": k - 1, "solved": found is not None, "iterations": n_iters,
                       "seconds": round(time.perf_counter() - level_t0, 4)})
        if found is None:
            stopped = why
            break
        best, k = found, k - 1
    assert conflicts(g.edges, best) == 0 and (not g.n or best.max() + 1 <= start_colors)
    return SearchResult(best, k, start_colors, used, time.perf_counter() - t0, stopped, levels)
