"""DDP as the trainers build it (`runtime.dist.wrap_ddp`), under torchrun with 2 gloo workers."""

import re
import sys

import pytest

from conftest import ROOT, _env

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("micro_batches", [1, 2])
def test_gradients_with_and_without_accumulation_equal_the_whole_batch(micro_batches):
    """With a static graph, a step accumulated under no_sync crashed torch 2.13's reducer (and could
    silently stop all-reducing after the first step): the forecaster with --grad-accum 2, which the
    plan suggests for the 151m preset, could not train on more than one GPU."""
    import subprocess

    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(ROOT / "tests" / "ddp_accumulation.py"), str(micro_batches)],
                          capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diffs = [float(x) for x in re.findall(r"max_abs_diff (\S+)", proc.stdout)]
    assert len(diffs) == 3 and max(diffs) < 1e-6, proc.stdout
    # With the loop's reference cycles still uncollected when the group was destroyed, about one run in
    # five aborted at exit (SIGABRT after the last step, "terminate called without an active exception";
    # torch 2.13, gloo: 8 of 30 runs of this script, 0 of 40 with the collection): runtime.dist collects first.
    assert "unreachable_at_destroy 0" in proc.stdout, proc.stdout
