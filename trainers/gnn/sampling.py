"""Batches by a node budget, with every graph seen exactly once per epoch across ranks.

The runtime's EpochPlan cuts each rank's share into steps of a fixed *sample* count; graphs differ
in size (20 to 300 nodes by default), so a fixed graph count makes step cost, memory and the
number of nodes a GPU works on swing by 15x. Here a step holds about `nodes_per_batch` nodes per
rank instead:

1. Every rank draws the same permutation of the graphs (seeded by seed and epoch; the same one
   EpochPlan draws) and takes every world_size-th graph from its rank: the shares are disjoint and
   cover every graph once.
2. The number of steps in an epoch is the same on every rank and in every epoch:
   ceil(nodes in the split / (world_size x nodes_per_batch)), but never more than the smallest
   share has graphs (every rank needs a graph in every step, or DDP would wait for it).
3. Each rank cuts its share, in order, into that many contiguous runs of about equal node count
   (cut where the running node count crosses each multiple of share_nodes / steps). A step so holds
   about nodes_per_batch nodes, at most one graph more than its equal part; shares are random, so
   ranks hold about the same number of nodes in each step.

Because the plan is a pure function of (graph sizes, world, seed, epoch), every rank also knows how
many graphs all ranks hold in each step (the global count the loss is normalised by), and a resume
at (epoch, step) rebuilds exactly the same batches.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from trainers.errors import UsageError
from trainers.runtime.sampling import EpochCursor


def steps_per_epoch(nodes: np.ndarray, world_size: int, nodes_per_batch: int) -> int:
    return epoch_steps(len(nodes), int(nodes.sum()), world_size, nodes_per_batch)


def epoch_steps(graphs: int, nodes: int, world_size: int, nodes_per_batch: int) -> int:
    """An epoch's steps from the split's counts alone (what `trainers plan` knows of a dataset)."""
    if nodes_per_batch < 1:
        raise UsageError(f"--nodes-per-batch {nodes_per_batch} must be >= 1")
    smallest_share = graphs // world_size
    if smallest_share < 1:
        raise UsageError(f"{graphs} training graphs are too few for {world_size} ranks; use fewer ranks or "
                         f"more graphs")
    return max(1, min(math.ceil(nodes / (world_size * nodes_per_batch)), smallest_share))


def _cuts(weights: np.ndarray, parts: int) -> np.ndarray:
    """Boundaries 0 = b_0 < b_1 < ... < b_parts = len(weights): contiguous, non-empty, about equal sums."""
    total = np.cumsum(weights)
    bounds = np.searchsorted(total, total[-1] * np.arange(1, parts) / parts, side="right")
    out = [0]
    for t, b in enumerate(bounds, start=1):
        out.append(int(min(max(b, out[-1] + 1), len(weights) - (parts - t))))
    out.append(len(weights))
    return np.array(out)


class NodeBudgetPlan:
    """One epoch for one rank (see the module docstring)."""

    def __init__(self, nodes: np.ndarray, world_size: int, rank: int, nodes_per_batch: int, seed: int, epoch: int):
        self.steps = steps_per_epoch(nodes, world_size, nodes_per_batch)
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        perm = torch.randperm(len(nodes), generator=g).numpy()
        shares = [perm[r::world_size] for r in range(world_size)]
        bounds = [_cuts(nodes[s], self.steps) for s in shares]
        self._share, self._bounds = shares[rank], bounds[rank]
        self._global = np.sum([np.diff(b) for b in bounds], axis=0)  # graphs all ranks hold per step

    def batch(self, step: int) -> np.ndarray:
        """Positions (graph indices) of this rank's graphs at `step`."""
        return self._share[self._bounds[step]:self._bounds[step + 1]]

    def global_count(self, step: int) -> int:
        return int(self._global[step])

    def per_step(self, values: np.ndarray) -> np.ndarray:
        """Each of this rank's steps' sum of `values` (one per graph of the split), all steps at once."""
        return np.add.reduceat(values[self._share], self._bounds[:-1])

    def consumed_before(self, step: int) -> int:
        return int(self._bounds[step])


class NodeBudgetCursor:
    """Where this rank stands, epoch by epoch; the same interface and saved position as the
    runtime's EpochCursor (`batch`, `advance`, `position`, `start`)."""

    start = staticmethod(EpochCursor.start)

    def __init__(self, nodes: np.ndarray, world_size: int, rank: int, nodes_per_batch: int, seed: int,
                 epoch: int = 0, step_in_epoch: int = 0):
        self._args = (np.asarray(nodes, dtype=np.int64), world_size, rank, nodes_per_batch, seed)
        self.epoch = epoch
        self.step_in_epoch = step_in_epoch
        self.plan = NodeBudgetPlan(*self._args, epoch)
        self.steps_per_epoch = self.plan.steps

    def batch(self) -> tuple[np.ndarray, int]:
        return self.plan.batch(self.step_in_epoch), self.plan.global_count(self.step_in_epoch)

    def advance(self) -> bool:
        """Move past the current step; True when that step ended an epoch."""
        self.step_in_epoch += 1
        if self.step_in_epoch < self.plan.steps:
            return False
        self.epoch, self.step_in_epoch = self.epoch + 1, 0
        self.plan = NodeBudgetPlan(*self._args, self.epoch)
        return True

    def position(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "consumed_in_epoch": self.plan.consumed_before(self.step_in_epoch)}


def padded_capacity(nodes: np.ndarray, directed_edges: np.ndarray, world_size: int, rank: int, nodes_per_batch: int,
                    seed: int, epochs: int) -> tuple[int, int, int]:
    """One more than the most nodes, directed edges and graphs any of this rank's steps holds over `epochs`
    (the plans are pure functions of the epoch): the one shape a compiled step pads every batch to."""
    nodes, edges = np.asarray(nodes, dtype=np.int64), np.asarray(directed_edges, dtype=np.int64)
    most = np.zeros(3, dtype=np.int64)
    for epoch in range(epochs):  # (each epoch's steps summed at once: a long run's start once looped over them all)
        plan = NodeBudgetPlan(nodes, world_size, rank, nodes_per_batch, seed, epoch)
        graphs = plan.per_step(np.ones_like(nodes))
        most = np.maximum(most, [plan.per_step(nodes).max(), plan.per_step(edges).max(), graphs.max()])
    return int(most[0]) + 1, int(most[1]) + 1, int(most[2]) + 1
