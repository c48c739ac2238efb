"""Per-epoch shuffling and sharding where every sample is seen exactly once per epoch, and the
cursor a training loop walks it with.

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
from trainers.runtime.device import to_device


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


def steps_left(steps_per_epoch: int, epochs: int, start: dict) -> int:
    """A loop's steps from a cursor's start (`EpochCursor.start`'s keywords) to the end of `epochs` (Run.resume).
    A resume on another world size starts rank 0's epoch again at this world's steps an epoch: the loops counted
    `epochs x steps an epoch` from the saved step, and a run resumed on more ranks ended an epoch early, "completed"
    (on fewer, it trained part of an epoch more)."""
    return (epochs - start.get("epoch", 0)) * steps_per_epoch - start.get("step_in_epoch", 0)


class EpochCursor:
    """Where this rank stands in the epoch-by-epoch walk over a dataset, as a value the loop
    advances explicitly (no hidden rollover) and the checkpoint saves.

        cursor = EpochCursor(n, world, rank, batch, seed, **start.position)
        positions, global_count = cursor.batch()
        cursor.advance()        # to the next step; rolls into the next epoch after the last one
    """

    def __init__(self, n_samples: int, world_size: int, rank: int, batch_per_rank: int, seed: int,
                 epoch: int = 0, step_in_epoch: int = 0, device: torch.device | str = "cpu"):
        self._args = (n_samples, world_size, rank, batch_per_rank, seed)
        self.device = torch.device(device)
        self.epoch = epoch
        self.step_in_epoch = step_in_epoch
        self._new_plan()
        self.steps_per_epoch = self.plan.steps

    def _new_plan(self) -> None:
        self.plan = EpochPlan(*self._args, self.epoch)
        # This rank's whole share of the epoch goes to the device once, without a wait: a step's batch is
        # then a slice there, with no host-to-device copy per step.
        self._share = to_device(self.plan._share, self.device)

    def batch(self) -> tuple[torch.Tensor, int]:
        """This rank's sample positions for the current step (on the cursor's device), and how many
        all ranks hold."""
        s = self.step_in_epoch
        return self._share[self.plan._offsets[s]: self.plan._offsets[s + 1]], self.plan.global_count(s)

    def advance(self) -> bool:
        """Move past the current step; True when that step ended an epoch."""
        self.step_in_epoch += 1
        if self.step_in_epoch < self.plan.steps:
            return False
        self.epoch, self.step_in_epoch = self.epoch + 1, 0
        self._new_plan()
        return True

    def position(self) -> dict:
        return {"epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "consumed_in_epoch": self.plan.consumed_before(self.step_in_epoch)}

    @staticmethod
    def start(position: dict | None, position_rank0: dict | None = None) -> dict:
        """Keyword arguments for a cursor from this rank's saved position (None: the beginning). When
        the world size changed, ranks' positions cannot be mapped: restart rank 0's epoch instead."""
        if position:
            return {"epoch": position["epoch"], "step_in_epoch": position["step_in_epoch"]}
        if position_rank0:
            return {"epoch": position_rank0["epoch"], "step_in_epoch": 0}
        return {}
