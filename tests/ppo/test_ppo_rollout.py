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


class InPlaceWrites(torch.utils._python_dispatch.TorchDispatchMode):
    """The storages an op writes (an argument its schema marks written), less those made during the recording:
    what a step writes among the tensors that existed before it (a graph's inputs)."""

    def __init__(self):
        super().__init__()
        self.written, self.made = set(), set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        writes = False
        for arg, value in zip(func._schema.arguments, [*args, *[kwargs.get(a.name) for a in
                                                             func._schema.arguments[len(args):]]]):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.Tensor):
                self.written.add(value.untyped_storage().data_ptr())
                writes = True
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        if not writes and not aliases:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.made.add(t.untyped_storage().data_ptr())
        return out

    def before_the_step(self) -> set:
        return self.written - self.made


def test_graphs_mode_marks_every_tensor_the_step_writes_as_static(tmp_path, monkeypatch):
    """CUDA graph trees skip a graph that writes an input unless the input is static (a parameter, or marked):
    the H200 ran `--compile-rollout graphs` uncaptured for "mutated inputs (12 instances)". Each tensor one
    rollout step writes that existed before it (found by the ops' schemas, on the eager step) is one the phase
    marks static under `graphs`, and none is marked without it (a tensor left out of written_by_the_step turns
    this red)."""
    from trainers.ppo import ppo

    seen = []

    def detecting_stepper(mode, log=None):
        def step(*args):
            phase = args[8].__self__  # on_step: the phase's record
            marked = {t.untyped_storage().data_ptr() for t in phase.written_by_the_step()
                      if getattr(t, "_dynamo_static_input_type", None) == "unguarded"}
            with InPlaceWrites() as writes:
                out = ppo.rollout_step(*args)
            seen.append((mode, writes.before_the_step(), marked))
            return out
        return step

    monkeypatch.setattr(ppo, "rollout_stepper", detecting_stepper)
    assert main([*TINY, "--total-steps", "128", "--run-dir", str(tmp_path / "graphs"), "--compile-rollout", "graphs"]) == 0
    assert seen and all(mode == "graphs" for mode, _, _ in seen)
    for _mode, written, marked in seen:
        assert len(written) >= 10 and written <= marked  # the environments' state, the sums, the window
    seen.clear()
    assert main([*TINY, "--total-steps", "128", "--run-dir", str(tmp_path / "on"), "--compile-rollout", "on"]) == 0
    assert seen and all(not marked for _mode, _written, marked in seen)


class StaleOutputs(torch.overrides.TorchFunctionMode):
    """A stand-in CUDA graph's memory pool: once the graph runs again, any use of a tensor on the storage of one of
    its outputs (a view too) raises, as CUDA graph trees make a stale output's storage raise
    (torch._C._set_storage_access_error_msg, a CUDA build's alone). The stale outputs are kept, so their
    addresses are not reused."""

    def __init__(self):
        super().__init__()
        self.live: list[torch.Tensor] = []  # the last replay's outputs
        self.kept: list[torch.Tensor] = []
        self.stale: set[int] = set()

    def run_again(self) -> None:
        """The graph runs again: the last run's outputs are overwritten."""
        self.stale |= {t.untyped_storage().data_ptr() for t in self.live if t.numel()}
        self.kept += self.live
        self.live = []

    def check(self, things) -> None:
        for t in things:
            if isinstance(t, (tuple, list)):
                self.check(t)
            elif isinstance(t, torch.Tensor) and t.numel() and t.untyped_storage().data_ptr() in self.stale:
                raise RuntimeError("accessing tensor output of CUDAGraphs that has been overwritten by a subsequent run")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.check([*args, *(kwargs or {}).values()])
        return func(*args, **(kwargs or {}))


@pytest.mark.slow  # two runs; nothing in it depends on the SIMD width (CI's narrowed pass skips it)
def test_graphs_mode_passes_no_graph_output_past_the_next_replay(tmp_path, monkeypatch):
    """Under `--compile-rollout graphs` a CUDA graph's outputs are overwritten when it runs again (any agent's
    call): the H200 (1adc135) died recording the graph at its second call, on the observation the first returned.
    A stand-in compiler whose outputs (and views of them) raise on any use once it is called again, and which
    reads its inputs first as CUDA graph trees do, over two agents (one step shared): the run completes and trains
    exactly what `--compile-rollout off` trains (without the observation's clone it raises)."""
    two_agents = [*TINY, "--seeds", "2", "--total-steps", "384"]
    assert main([*two_agents, "--run-dir", str(tmp_path / "eager")]) == 0
    pool = StaleOutputs()

    def graph_like_compile(fn, **kwargs):
        def replay(*args):
            pool.run_again()
            pool.check(args)  # the graph's inputs are read first
            obs, reward, done, *rest = fn(*args)
            out = (tuple(o.clone() for o in obs), *(t.clone() for t in (reward, done, *rest)))  # in "its pool"
            pool.live = [*out[0], *out[1:]]
            return out
        return replay

    monkeypatch.setattr(torch, "compile", graph_like_compile)
    with pool:
        assert main([*two_agents, "--run-dir", str(tmp_path / "graphs"), "--compile-rollout", "graphs"]) == 0
    eager, graphs = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("eager", "graphs"))
    assert graphs["training"]["compile_error"] is None and len(pool.stale) > 100
    assert json.dumps(graphs["evaluation"], sort_keys=True) == json.dumps(eager["evaluation"], sort_keys=True)
