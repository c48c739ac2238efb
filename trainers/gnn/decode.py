"""From the model's colours to the fewest valid colours we can find, and the classical heuristics
it is measured against. NumPy and networkx only (`trainers gnn color` runs without torch).

    raw        argmax of the model's logits with the greedy bound's colours offered (may conflict)
    repaired   `repair` of that: always valid
    scheduled  the model asked again with fewer colours offered (down to the clique lower bound);
               the repaired result with the fewest colours
    searched   TabuCol from there (trainers.gnn.search), the model's argmax at each offered count
               as hints: never more colours than it started with
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from trainers.gnn.features import colors_offered, offered_schedule
from trainers.gnn.graphs import Graph, adjacency, conflicts
from trainers.gnn.search import clique_lower_bound, reduce_colors


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


def _colors(c: np.ndarray) -> int:
    return int(len(np.unique(c)))


def model_schedule(g: Graph, max_colors: int) -> tuple[int, int, list[int]]:
    """The clique lower bound, the greedy bound offered first, and every colour count the model is
    asked with (most first): what `color_with_model` will ask `logits_for` for, known before it runs."""
    lower = clique_lower_bound(g)
    bound = colors_offered(g, max_colors)
    return lower, bound, offered_schedule(bound, lower)


def color_with_model(g: Graph, logits_for: Callable[[int], np.ndarray], max_colors: int, search_iters: int,
                     search_seconds: float, seed: int = 0,
                     schedule_of: tuple[int, int, list[int]] | None = None) -> tuple[np.ndarray, dict]:
    """Every decoding stage (module docstring) for one graph. `logits_for(k)` runs the model with k
    colours offered and returns [n, max_colors] logits. Returns the best valid colouring and the
    report of each stage (colours, conflicts, seconds). `schedule_of`: `model_schedule(g, max_colors)`
    where the caller already has it."""
    t0 = time.perf_counter()
    lower, bound, offered = schedule_of or model_schedule(g, max_colors)
    seconds = {"model": 0.0, "repair": 0.0, "search": 0.0}
    schedule, raws, fixeds = [], [], []
    for k in offered:
        t = time.perf_counter()
        raw = np.asarray(logits_for(k)).argmax(-1)
        seconds["model"] += time.perf_counter() - t
        t = time.perf_counter()
        fixed = repair(g, raw)
        seconds["repair"] += time.perf_counter() - t
        schedule.append({"offered": k, "raw_colors": _colors(raw), "raw_conflicts": conflicts(g.edges, raw),
                         "repaired_colors": _colors(fixed)})
        raws.append(raw)
        fixeds.append(fixed)
    pick = min(range(len(schedule)), key=lambda i: (schedule[i]["repaired_colors"], schedule[i]["raw_conflicts"]))
    best = fixeds[pick]
    report = {"nodes": g.n, "edges": g.n_edges, "lower_bound": lower, "offered": bound,
              "raw": {"colors": schedule[0]["raw_colors"], "conflicts": schedule[0]["raw_conflicts"]},
              "repaired": {"colors": schedule[0]["repaired_colors"]},
              "scheduled": {"colors": schedule[pick]["repaired_colors"], "offered": schedule[pick]["offered"]},
              "schedule": schedule}
    if search_iters > 0 and search_seconds > 0:
        found = reduce_colors(g, best, search_iters, search_seconds, seed, lower, hints=raws)
        seconds["search"] = found.seconds
        best = found.coloring
        report["searched"] = {"colors": found.colors, "iterations": found.iterations, "stopped": found.stopped,
                              "levels": found.levels}
    seconds["total"] = time.perf_counter() - t0
    report.update(colors=_colors(best) if g.n else 0, conflicts=conflicts(g.edges, best),
                  seconds={k: round(v, 4) for k, v in seconds.items()})
    return best, report
