"""The GNN's population search on the device (fake accelerator: CUDA's placement rules on the CPU).

It was built "on the device" and had never run there: at a09b8e2 its TabuCol drew a block's row rotations
with `torch.randint(..., generator=gen)`, no `device=`, from a CUDA generator, and `gnn color --search
population --device cuda` died at its first draw. Here it runs with its tensors and its generator on the
fake device, the same search (seed, colours, iterations) as on the host.
"""

from __future__ import annotations

import numpy as np
import pytest

from fake_accelerator import FakeAccelerator
from trainers.gnn.dsatur import dsatur
from trainers.gnn.graphs import conflicts, flat
from trainers.gnn.population import population_search


def search(device: str):
    g = flat(100, 10, 0.5, np.random.default_rng(7))  # DSATUR: 17 colours; TabuCol has work to do
    return g, population_search(g, dsatur(g), population=8, tabu_iters=300, iters=8 * 600, seconds=60.0, seed=3,
                                stall=0, device=device)


def test_the_population_search_runs_on_the_device_as_on_the_host():
    _g, on_host = search("cpu")
    with FakeAccelerator() as acc:
        try:
            g, on_device = search(str(acc.device))
        except RuntimeError as exc:  # what CUDA would have raised: the test's failure, with CUDA's words
            pytest.fail(f"the population search failed on the device: {exc}")
        # the search's generator and draws live on the device: the same stream as the host's CPU generator
        assert np.array_equal(on_device.coloring, on_host.coloring)
        assert on_device.iterations == on_host.iterations > 0 and on_device.colors == on_host.colors
        assert conflicts(g.edges, on_device.coloring) == 0
