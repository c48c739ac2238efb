import pytest
import torch

from trainers.errors import UsageError
from trainers.runtime.sampling import EpochPlan


@pytest.mark.parametrize("n,world,batch", [(1000, 2, 64), (1001, 2, 64), (999, 3, 50), (130, 2, 64), (7, 2, 4),
                                           (64 * 2 + 1, 2, 64)])
def test_every_sample_exactly_once_per_epoch_across_ranks(n, world, batch):
    for epoch in (0, 1):
        plans = [EpochPlan(n, world, r, batch, seed=5, epoch=epoch) for r in range(world)]
        assert len({p.steps for p in plans}) == 1, "all ranks must run the same number of steps"
        seen = torch.cat([p.batch(s) for p in plans for s in range(p.steps)])
        assert sorted(seen.tolist()) == list(range(n))
        for s in range(plans[0].steps):
            sizes = [len(p.batch(s)) for p in plans]
            assert max(sizes) <= batch and min(sizes) >= 1
            assert plans[0].global_count(s) == sum(sizes) == plans[1].global_count(s)


def test_epochs_shuffle_differently_and_deterministically():
    a0 = EpochPlan(500, 2, 0, 32, seed=1, epoch=0).batch(0)
    a1 = EpochPlan(500, 2, 0, 32, seed=1, epoch=1).batch(0)
    again = EpochPlan(500, 2, 0, 32, seed=1, epoch=0).batch(0)
    assert not torch.equal(a0, a1)
    assert torch.equal(a0, again)


def test_consumed_position_counts_own_samples():
    p = EpochPlan(1001, 2, 1, 100, seed=0, epoch=0)
    assert p.consumed_before(0) == 0
    assert p.consumed_before(p.steps) == 500
    assert p.consumed_before(2) == sum(len(p.batch(s)) for s in range(2))


def test_too_few_samples_for_the_ranks_is_a_usage_error():
    with pytest.raises(UsageError, match="too few"):
        EpochPlan(1, 2, 0, 8, seed=0, epoch=0)
