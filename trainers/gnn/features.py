"""Node features and the colours offered, in NumPy only: `trainers gnn color` uses them without torch.
`trainers gnn data` stores the degree features of every training graph, computed here, so training
and inference see the same numbers (`degree_features` lives with the graphs, which the dataset
generator stores them with)."""

from __future__ import annotations

import numpy as np

from trainers.gnn.graphs import Graph, degree_features, greedy_bound

SCHEDULE_LEVELS = 6  # decoding offers the greedy bound, then up to 5 fewer colours (not below the clique bound)


def random_features(n: int, random_dims: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, random_dims)).astype(np.float32)


def node_features(g: Graph, random_dims: int, seed: int) -> np.ndarray:
    """[n, 2 + random_dims]: the degree features and seeded random features (which break the
    symmetry between look-alike nodes)."""
    return np.concatenate([degree_features(g), random_features(g.n, random_dims, seed)], axis=1)


def colors_offered(g: Graph, max_colors: int) -> int:
    """The most colours offered to the model: the greedy (largest-first) count, capped."""
    return int(min(max_colors, max(greedy_bound(g), 1)))


def color_mask(n: int, offered: int, max_colors: int) -> np.ndarray:
    mask = np.zeros((n, max_colors), np.float32)
    mask[:, :offered] = 1.0
    return mask


def offered_schedule(bound: int, lower: int, levels: int = SCHEDULE_LEVELS) -> list[int]:
    """Colours offered to the model, most first: the greedy bound, then fewer, down to the clique
    lower bound (fewer than that cannot be proper) and at most `levels` in all."""
    floor = max(lower, 1, bound - levels + 1)
    return list(range(bound, floor - 1, -1)) or [bound]
