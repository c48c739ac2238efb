"""The rollout's step as a pure function of tensors (ppo.rollout_step): the environments' state updated in
place at fixed addresses, the policy's normal draw made outside it, so `--compile-rollout` compiles it as one
graph (fullgraph: no host read, no Python branch on a value) that a CUDA graph can capture. Rehearsed here on
the CPU: the compiled step collects exactly what the eager one does, and compiles once for a whole run."""

import json

import numpy as np
import pytest
import torch

from trainers.cli import main
from trainers.ppo.env import DeviceMarket, EnvSpec, VecPortfolioEnv

TINY = ["ppo", "train", "--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "600", "--window", "8",
        "--episode-days", "20", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64", "--hidden", "16",
        "--total-steps", "640", "--eval-every", "2", "--random-runs", "2", "--device", "cpu", "--log-every", "1",
        "--no-baseline-mlp"]


def test_the_environments_state_stays_where_it_is():
    """Every state tensor keeps its storage through steps, resets and a restore: a captured step reads and
    writes them at the addresses it was recorded with (a rebound attribute would be a stale copy there)."""
    rng = np.random.default_rng(0)
    close = np.exp(np.cumsum(rng.normal(0, 0.01, (60, 3)), 0)) * 100
    market = DeviceMarket(close, rng.normal(size=(60, 3, 2)).astype(np.float32), torch.device("cpu"))
    env = VecPortfolioEnv(market, EnvSpec(window=4, episode_days=5), 6, (3, 59), seed=1)
    where = {name: getattr(env, name).data_ptr() for name in env._STATE}
    saved = env.state_dict()
    for _ in range(12):  # episodes of 5 days: every environment resets twice
        env.step(torch.rand(6, 3) * 2 - 1)
    assert {name: getattr(env, name).data_ptr() for name in env._STATE} == where
    env.load_state_dict(saved)
    assert {name: getattr(env, name).data_ptr() for name in env._STATE} == where
    assert all(torch.equal(getattr(env, name), saved[name]) for name in env._STATE)


def run(tmp_path, name: str, *extra: str) -> tuple[dict, int]:
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    assert main([*TINY, "--run-dir", str(tmp_path / name), *extra]) == 0
    return json.loads((tmp_path / name / "results.json").read_text()), counters["stats"]["unique_graphs"]


# Not in CI's narrowed-SIMD pass (marked slow, as that pass selects): under ATEN_CPU_CAPABILITY=default inductor's
# CPU code does not compile (at::vec undeclared), a torch limit; the other compiled steps' tests
# (tests/unit/test_gpu_paths.py) are outside that pass too.
@pytest.mark.slow
def test_the_compiled_rollout_step_trains_what_the_eager_one_does_and_compiles_once(tmp_path):
    eager, _ = run(tmp_path, "eager")
    compiled, graphs = run(tmp_path, "compiled", "--compile-rollout", "on")
    assert graphs == 1  # one graph for all 5 updates (fullgraph: a graph break would have raised)
    assert compiled["training"]["compiled"] is True and compiled["training"]["compile_error"] is None
    a, b = eager["training"], compiled["training"]
    assert a["steps"] == b["steps"] == 5
    # the same draws, the same environments: the same agent to float rounding (inductor fuses the sums)
    assert json.dumps(eager["evaluation"], sort_keys=True) != "{}"
    assert_close(eager["evaluation"], compiled["evaluation"])


@pytest.mark.slow  # its numbers are compared with a run of the same kernels (no SIMD pass needed)
def test_a_rollout_step_whose_compile_fails_runs_eager_and_says_so(tmp_path, monkeypatch):
    """`--compile-rollout` on a machine whose compiler is broken (here a backend that raises, as a missing
    triton would): the run trains the eager step from the first call on, exactly the eager run's agent, and the
    log and results.json say why; off records no compile at all."""
    eager, _ = run(tmp_path, "eager", "--seeds", "2")  # two agents, trained one after the other
    assert (eager["training"]["compiled"], eager["training"]["compile_error"]) == (False, None)

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no working compiler on this machine")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, backend=broken_backend,
                                                                        **{k: v for k, v in kw.items() if k != "mode"}))
    fallen, _ = run(tmp_path, "broken", "--seeds", "2", "--compile-rollout", "graphs")
    assert fallen["training"]["compiled"] is False and "no working compiler" in fallen["training"]["compile_error"]
    log = (tmp_path / "broken" / "training.log").read_text()
    assert log.count("torch.compile failed; training eager") == 1  # once for the run, not once per agent or update
    assert "--compile-rollout off skips the try" in log
    assert json.dumps(fallen["evaluation"], sort_keys=True) == json.dumps(eager["evaluation"], sort_keys=True)


def assert_close(a, b, path="evaluation"):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            assert_close(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_close(x, y, f"{path}[{i}]")
    elif isinstance(a, float):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6), path
    else:
        assert a == b, path
