"""Per-epoch shuffling and sharding where every sample is seen exactly once per epoch.

torch's DistributedSampler pads the last shard by repeating samples; here nothing repeats and
nothing is dropped. Every rank draws the same permutation (seeded by seed and epoch), takes
every world_size-th element from its rank, and cuts its share into the same number of steps
as every other rank (shares differ by at most one sample, so step sizes differ by at most one).
Because the plan is a pure function of (n, world, seed, epoch), each rank also knows how many
samples all ranks hold in each step: the loss is normalised by that global count, which makes
the gradient exactly the mean over the global batch even when shards are uneven.
"""

from __future__ import annotations

import math

import torch

from trainers.errors import UsageError


def _split_sizes(length: int, parts: int) -> list[int]:
    base, extra = divmod(length, parts)
    return [base + 1 if i < extra else base for i in range(parts)]


class EpochPlan:
    def __init__(self, n_samples: int, world_size: int, rank: int, batch_per_rank: int, seed: int, epoch: int):
        if batch_per_rank < 1:
            raise UsageError(f"--batch-size {batch_per_rank} must be >= 1")
        self.n = n_samples
        self.world = world_size
        self.rank = rank
        shares = [len(range(r, n_samples, world_size)) for r in range(world_size)]
        self.steps = math.ceil(max(shares) / batch_per_rank)
        if min(shares) < self.steps or self.steps == 0:
            raise UsageError(f"{n_samples} training samples are too few for {world_size} ranks with batch "
                             f"{batch_per_rank}; use fewer ranks, a smaller --batch-size or more data")
        self._sizes = [_split_sizes(s, self.steps) for s in shares]  # [rank][step]
        g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        self._share = torch.randperm(n_samples, generator=g)[rank::world_size]
        self._offsets = [0]
        for size in self._sizes[rank]:
            self._offsets.append(self._offsets[-1] + size)

    def batch(self, step: int) -> torch.Tensor:
        """Positions (into the split's sample list) of this rank's samples at `step`."""
        return self._share[self._offsets[step]: self._offsets[step + 1]]

    def global_count(self, step: int) -> int:
        return sum(sizes[step] for sizes in self._sizes)

    def consumed_before(self, step: int) -> int:
        """How many of this rank's own samples precede `step` (its data position)."""
        return self._offsets[step]
