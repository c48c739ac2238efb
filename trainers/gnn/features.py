"""Node features and the color bound, in NumPy only: `trainers gnn color` uses them without torch."""

from __future__ import annotations

import numpy as np

from trainers.gnn.graphs import Graph, greedy_coloring


def node_features(g: Graph, random_dims: int, seed: int) -> np.ndarray:
    """[n, 2 + random_dims]: log degree, degree / max degree, and seeded random features."""
    deg = np.bincount(g.edges.ravel(), minlength=g.n).astype(np.float32) if g.n_edges else np.zeros(g.n, np.float32)
    rnd = np.random.default_rng(seed).standard_normal((g.n, random_dims)).astype(np.float32)
    return np.concatenate([np.log1p(deg)[:, None], (deg / max(deg.max(), 1.0))[:, None], rnd], axis=1)


def colors_offered(g: Graph, max_colors: int) -> int:
    """The bound on colors offered to the model: the greedy (largest-first) count, capped."""
    if g.n_edges == 0:
        return 1
    return int(min(max_colors, greedy_coloring(g.n, g.edges).max() + 1))
