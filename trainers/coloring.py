"""Graph batching, node features, decoding with repair, and the classical baselines."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

from trainers.data.graphs import Graph, adjacency, conflicts, greedy_colouring

N_DEGREE_FEATURES = 2


def node_features(g: Graph, random_dims: int, seed: int) -> np.ndarray:
    """[n, 2 + random_dims]: log degree, degree / max degree, and seeded random features."""
    deg = np.bincount(g.edges.ravel(), minlength=g.n).astype(np.float32) if g.n_edges else np.zeros(g.n, np.float32)
    rnd = np.random.default_rng(seed).standard_normal((g.n, random_dims)).astype(np.float32)
    return np.concatenate([np.log1p(deg)[:, None], (deg / max(deg.max(), 1.0))[:, None], rnd], axis=1)


def colours_offered(g: Graph, max_colors: int) -> int:
    """The bound on colours offered to the model: the greedy (largest-first) count, capped."""
    if g.n_edges == 0:
        return 1
    return int(min(max_colors, greedy_colouring(g.n, g.edges).max() + 1))


@dataclass
class GraphBatch:
    x: torch.Tensor  # [N, F]
    edge_index: torch.Tensor  # [2, 2E] both directions
    colour_mask: torch.Tensor  # [N, K]
    edge_graph: torch.Tensor  # [2E] graph id of each directed edge
    edges_per_graph: torch.Tensor  # [G] undirected edges
    node_offsets: list[int]
    offered: list[int]


def make_batch(graphs: list[Graph], max_colors: int, random_dims: int, seeds: list[int],
               device: torch.device) -> GraphBatch:
    xs, edges, edge_graph, offsets, offered = [], [], [], [0], []
    masks = []
    for gi, (g, seed) in enumerate(zip(graphs, seeds)):
        k = colours_offered(g, max_colors)
        offered.append(k)
        xs.append(node_features(g, random_dims, seed))
        m = np.zeros((g.n, max_colors), np.float32)
        m[:, :k] = 1.0
        masks.append(m)
        e = g.edges + offsets[-1]
        edges.append(np.concatenate([e, e[:, ::-1]]))
        edge_graph.append(np.full(2 * g.n_edges, gi))
        offsets.append(offsets[-1] + g.n)
    ei = np.concatenate(edges).T.copy() if edges else np.zeros((2, 0), np.int64)
    return GraphBatch(
        x=torch.from_numpy(np.concatenate(xs)).to(device),
        edge_index=torch.from_numpy(ei.astype(np.int64)).to(device),
        colour_mask=torch.from_numpy(np.concatenate(masks)).to(device),
        edge_graph=torch.from_numpy(np.concatenate(edge_graph).astype(np.int64)).to(device),
        edges_per_graph=torch.tensor([g.n_edges for g in graphs], dtype=torch.float32, device=device),
        node_offsets=offsets, offered=offered)


def repair(g: Graph, colour: np.ndarray) -> np.ndarray:
    """A valid colouring from any colouring, then try to drop colours.

    1. Every node with a same-coloured neighbour (highest degree first) takes the smallest colour
       none of its neighbours has; a recoloured node never creates a new conflict, so one pass
       leaves none.
    2. Colour classes, smallest first, are emptied when each of their nodes fits into another
       existing class; colours are then renumbered 0..k-1.
    """
    adj = adjacency(g.n, g.edges)
    colour = colour.astype(np.int64).copy()
    bad = np.zeros(g.n, dtype=bool)
    if g.n_edges:
        same = colour[g.edges[:, 0]] == colour[g.edges[:, 1]]
        bad[g.edges[same].ravel()] = True
    for v in sorted(np.flatnonzero(bad), key=lambda v: -len(adj[v])):
        nbr = set(colour[adj[v]].tolist())
        if colour[v] in nbr:
            c = 0
            while c in nbr:
                c += 1
            colour[v] = c
    changed = True
    while changed:
        changed = False
        classes = sorted(np.unique(colour), key=lambda c: (colour == c).sum())
        for c in classes:
            members = np.flatnonzero(colour == c)
            trial = colour.copy()
            ok = True
            for v in members:
                nbr = set(trial[adj[v]].tolist())
                options = [o for o in classes if o != c and o not in nbr]
                if not options:
                    ok = False
                    break
                trial[v] = options[0]
            if ok and len(classes) > 1:
                colour = trial
                changed = True
                break
    _, colour = np.unique(colour, return_inverse=True)
    assert conflicts(g.edges, colour) == 0
    return colour


def classical(g: Graph) -> dict:
    """networkx's greedy strategies and DSATUR: colours used and seconds."""
    import networkx as nx

    G = nx.Graph()
    G.add_nodes_from(range(g.n))
    G.add_edges_from(g.edges.tolist())
    out = {}
    for label, strategy in (("greedy_largest_first", "largest_first"), ("greedy_smallest_last", "smallest_last"),
                            ("dsatur", "saturation_largest_first")):
        t0 = time.perf_counter()
        col = nx.greedy_color(G, strategy=strategy)
        out[label] = {"colours": (max(col.values()) + 1) if col else 0, "seconds": time.perf_counter() - t0}
    return out
