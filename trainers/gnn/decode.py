"""From the model's colors to a valid coloring (repair), and the classical heuristics it is
measured against. NumPy and networkx only."""

from __future__ import annotations

import time

import numpy as np

from trainers.gnn.graphs import Graph, adjacency, conflicts


def repair(g: Graph, color: np.ndarray) -> np.ndarray:
    """A valid coloring from any coloring, then try to drop colors.

    1. Every node with a same-colored neighbour (highest degree first) takes the smallest color
       none of its neighbours has; a recolored node never creates a new conflict, so one pass
       leaves none.
    2. Color classes, smallest first, are emptied when each of their nodes fits into another
       existing class; colors are then renumbered 0..k-1.
    """
    adj = adjacency(g.n, g.edges)
    color = color.astype(np.int64).copy()
    bad = np.zeros(g.n, dtype=bool)
    if g.n_edges:
        same = color[g.edges[:, 0]] == color[g.edges[:, 1]]
        bad[g.edges[same].ravel()] = True
    for v in sorted(np.flatnonzero(bad), key=lambda v: -len(adj[v])):
        nbr = set(color[adj[v]].tolist())
        if color[v] in nbr:
            c = 0
            while c in nbr:
                c += 1
            color[v] = c
    changed = True
    while changed:
        changed = False
        classes = sorted(np.unique(color), key=lambda c: (color == c).sum())
        for c in classes:
            members = np.flatnonzero(color == c)
            trial = color.copy()
            ok = True
            for v in members:
                nbr = set(trial[adj[v]].tolist())
                options = [o for o in classes if o != c and o not in nbr]
                if not options:
                    ok = False
                    break
                trial[v] = options[0]
            if ok and len(classes) > 1:
                color = trial
                changed = True
                break
    _, color = np.unique(color, return_inverse=True)
    assert conflicts(g.edges, color) == 0
    return color


def classical(g: Graph) -> dict:
    """networkx's greedy strategies and DSATUR: colors used and seconds."""
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(g.edges.tolist())
    out = {}
    for label, strategy in (("greedy_largest_first", "largest_first"), ("greedy_smallest_last", "smallest_last"),
                            ("dsatur", "saturation_largest_first")):
        t0 = time.perf_counter()
        col = nx.greedy_color(G, strategy=strategy)
        out[label] = {"colors": (max(col.values()) + 1) if col else 0, "seconds": time.perf_counter() - t0}
    return out
