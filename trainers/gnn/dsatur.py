"""DSATUR (Brélaz 1979) in NumPy, deterministic or with random tie-breaking: the start of the
population search's heuristic population and its upper bound. No torch, no networkx (networkx's
`saturation_largest_first` is the reference the tests compare with: the same colour counts).

Each step colours the uncoloured node with the most distinct colours among its neighbours
(saturation), ties by degree, with the smallest colour none of its neighbours has. With `rng`,
ties in (saturation, degree) are broken at random, so repeated calls give different colourings of
about the same quality (DSATUR's own order breaks them by node number). With `k`, at most k
colours: a node whose neighbours have them all takes the one fewest of them have (a conflict, the
fewest possible at that step), as the hybrid evolutionary algorithm builds its first population."""

from __future__ import annotations

import numpy as np

from trainers.gnn.graphs import Graph
from trainers.gnn.search import csr


def dsatur(g: Graph, rng: np.random.Generator | None = None, k: int | None = None) -> np.ndarray:
    """A proper colouring (colours 0..k-1) by DSATUR, or with `k` an assignment of at most k
    colours with as few conflicts as DSATUR's order allows; O(n^2) vectorised steps."""
    n = g.n
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    indptr, nbr = csr(n, g.edges)
    degree = np.diff(indptr)
    # priority = saturation, then degree, then a random tie-break (or none: the lowest node first)
    tie = rng.permutation(n) if rng is not None else np.zeros(n, dtype=np.int64)
    scale = n + 1
    base = degree.astype(np.int64) * scale + (scale - 1 - tie if rng is not None else 0)
    sat = np.zeros(n, dtype=np.int64)
    width_c = int(degree.max()) + 2 if k is None else k
    seen = np.zeros((n, width_c), dtype=np.int32)  # how many neighbours of each node have each colour
    color = np.full(n, -1, dtype=np.int64)
    priority = base.copy()
    width = scale * scale  # saturation dominates degree and tie
    for _ in range(n):
        v = int(np.argmax(priority))
        c = int(np.argmin(seen[v]))  # the smallest colour no neighbour has (else the fewest have)
        color[v] = c
        priority[v] = -1
        u = nbr[indptr[v]:indptr[v + 1]]
        fresh = u[seen[u, c] == 0]
        seen[u, c] += 1
        sat[fresh] += 1
        live = fresh[color[fresh] < 0]
        priority[live] = sat[live] * width + base[live]
    return color
