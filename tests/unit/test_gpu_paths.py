"""What a GPU deploy relies on, checked on the CPU: no host sync in the steady training step of any
trainer, and no recompilation of a compiled step across an epoch boundary or a resume.

A host sync (`.item()`, `float(t)`, `.tolist()`, `.cpu()`, `.numpy()`, `if t:`, `nonzero`) stalls a
GPU until every queued kernel is done; a loop is allowed them only where it reads values on purpose:
at its log points, evaluations and stop agreements. On a CPU nothing stalls, so the calls are counted
instead: each is attributed to the step it happens in, and a step that is none of those points must
have none. Only calls made by the kit's own code count (torch's internals — e.g. AdamW reading its
step counter, a CPU tensor even on a GPU — are torch's business).
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from conftest import GPT_TINY, TINY_DATA
from trainers.cli import main
from trainers.runtime.run import Run
from trainers.runtime.stops import AgreementCadence

PACKAGE = str(Path(__file__).resolve().parents[2] / "trainers")
SYNCING = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__", "nonzero")


class SyncCounter:
    """Counts syncing calls made from trainers/ code, by the step they happen in, and which steps
    read values on purpose (log, evaluation, agreement)."""

    def __init__(self):
        self.step = 1
        self.calls: dict[int, list[str]] = defaultdict(list)
        self.reading: set[int] = set()

    def record(self):
        caller = sys._getframe(2)
        if caller.f_code.co_filename.startswith(PACKAGE):
            self.calls[self.step].append(f"{Path(caller.f_code.co_filename).name}:{caller.f_lineno}")

    @contextlib.contextmanager
    def installed(self, monkeypatch):
        for name in SYNCING:
            real = getattr(torch.Tensor, name)

            def counted(*args, _real=real, **kwargs):
                self.record()
                return _real(*args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, counted)
        real_nonzero = torch.nonzero

        def nonzero(*args, **kwargs):
            self.record()
            return real_nonzero(*args, **kwargs)

        monkeypatch.setattr(torch, "nonzero", nonzero)
        real_step_done, real_log, real_eval, real_due = Run.step_done, Run.should_log, Run.should_eval, \
            AgreementCadence.due

        def step_done(run, step, *args, **kwargs):
            self.step = step  # the body of this step is behind us; what step_done does is this step's too
            try:
                return real_step_done(run, step, *args, **kwargs)
            finally:
                self.step = step + 1

        def marks(real):
            def wrapped(obj, *args, **kwargs):
                due = real(obj, *args, **kwargs)
                if due:
                    self.reading.add(self.step)
                return due
            return wrapped

        monkeypatch.setattr(Run, "step_done", step_done)
        monkeypatch.setattr(Run, "should_log", marks(real_log))
        monkeypatch.setattr(Run, "should_eval", marks(real_eval))
        monkeypatch.setattr(AgreementCadence, "due", marks(real_due))
        yield self

    def steady_syncs(self, steps: set[int]) -> dict[int, list[str]]:
        """The syncs of those steps that read nothing on purpose."""
        return {s: calls for s, calls in self.calls.items() if s in steps and s not in self.reading}


RARELY = ["--log-every", "1000", "--agree-every", "1000", "--ckpt-every", "1000"]  # between the ends: steady steps
LOOPS = {
    "forecast": ["forecast", "train", *TINY_DATA, "--epochs", "1", "--batch-size", "64", "--eval-every", "1000",
                 "--device", "cpu"],
    "gnn": ["gnn", "train", "--epochs", "1", "--nodes-per-batch", "80", "--hidden", "16", "--layers", "2",
            "--search-iters", "50", "--device", "cpu"],  # evaluates at the epoch end only
    "gpt": ["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--max-steps", "14", "--eval-every", "1000",
            "--device", "cpu"],
    "ppo": ["ppo", "train", "--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "600", "--window", "8",
            "--episode-days", "20", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64", "--hidden", "16",
            "--total-steps", "1536", "--eval-every", "1000", "--random-runs", "2", "--seeds", "1",
            "--no-baseline-mlp", "--device", "cpu"],
    "lstm": ["lstm", "train", "--synthetic-tickers", "1", "--synthetic-days", "800", "--window", "16", "--hidden", "8",
             "--batch-size", "32", "--epochs", "1", "--eval-every", "1000", "--no-export", "--device", "cpu"],
}


def _gnn_data(tmp_path: Path) -> list[str]:
    from trainers.gnn.graphs import write_dataset

    write_dataset(tmp_path / "graphs", 32, 8, seed=0, min_nodes=10, max_nodes=40, workers=1, progress=False)
    return ["--data-dir", str(tmp_path / "graphs")]


@pytest.mark.parametrize("trainer", LOOPS)
def test_no_host_sync_in_the_steady_step(trainer, tmp_path, monkeypatch):
    counter = SyncCounter()
    args = [*LOOPS[trainer], *RARELY, "--run-dir", str(tmp_path / "run")]
    if trainer == "gnn":
        args += _gnn_data(tmp_path)
    with counter.installed(monkeypatch):
        assert main(args) == 0
    total = max(counter.calls, default=0)
    steps = set(range(2, total))  # after the first (warm-up) step, before the last (the end reads everything)
    assert len(steps - counter.reading) >= 3, f"too few steady steps ({sorted(counter.reading)} of {total} read)"
    bad = counter.steady_syncs(steps)
    assert not bad, f"host syncs in steady steps of {trainer}: {dict(list(bad.items())[:3])}"
    assert counter.calls[max(counter.reading)], "the counter saw none of the reads it should (log, agreement)"


def test_the_counter_sees_a_sync_in_a_steady_step(tmp_path, monkeypatch):
    """The same counter on the toy loop with a `.item()` slipped into every step must complain."""
    from toy_trainer import cfg_for, toy_loop
    from trainers.runtime import stops

    counter = SyncCounter()
    real_watch = stops.FiniteWatch.watch
    # the mistake, as if written in the package: a read of a device value every step
    mistake = compile("def watch_and_read(self, value):\n"
                      "    if isinstance(value, torch.Tensor):\n"
                      "        value.item()\n"
                      "    return real_watch(self, value)\n", stops.__file__, "exec")
    scope = {"torch": torch, "real_watch": real_watch}
    exec(mistake, scope)
    monkeypatch.setattr(stops.FiniteWatch, "watch", scope["watch_and_read"])
    cfg = cfg_for(tmp_path, agree_every=1000, ckpt_every=1000, patience=0)
    cfg.log_every = 1000
    with counter.installed(monkeypatch):
        toy_loop(cfg, total_steps=12, epoch_steps=1000)
    assert counter.steady_syncs(set(range(2, 12))), "a per-step .item() went unseen"


COMPILED = {  # the trainers that compile on a GPU, in their GPU configuration (--gpu-defaults)
    "forecast": ["forecast", "train", "--synthetic-tickers", "12", "--synthetic-days", "500", "--window", "16",
                 "--horizon", "5", "--batch-size", "64", "--log-every", "3", "--gpu-defaults", "--device", "cpu"],
    "gpt": ["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--eval-every", "4", "--gpu-defaults",
            "--device", "cpu"],
    # batches of varying size, each padded to the run's largest step (gnn/batch.py pad_batch): one shape
    # (--compile: a GPU run of this few steps trains eager, gnn/size.py's break-even)
    "gnn": ["gnn", "train", "--nodes-per-batch", "300", "--hidden", "16", "--layers", "2", "--search-iters", "20",
            "--log-every", "3", "--gpu-defaults", "--compile", "--device", "cpu"],
}
LONGER = {"forecast": (["--epochs", "1"], ["--epochs", "2"]), "gpt": (["--max-steps", "8"], ["--max-steps", "16"]),
          "gnn": (["--epochs", "2"], ["--epochs", "3"])}


def compiled_graphs(args: list[str], fault: str | None, monkeypatch) -> int:
    """Graphs dynamo compiled for one run, in a fresh dynamo (as a new process would start)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    if fault:
        monkeypatch.setenv("TRAINERS_FAULT", fault)
    else:
        monkeypatch.delenv("TRAINERS_FAULT", raising=False)
    assert main(args) == 0
    return counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("trainer", COMPILED)
def test_a_compiled_step_does_not_recompile_across_epochs_evaluations_and_a_resume(trainer, tmp_path, monkeypatch):
    """Constant shapes (a padded last batch, fixed windows): more epochs, more evaluations and a resume
    in the middle of an epoch compile nothing more than the shortest run. (An evaluation under no_grad
    is a graph of its own, once; the forecaster evaluates eagerly and stays at one.)"""
    import torch._dynamo

    with torch._dynamo.config.patch(error_on_recompile=trainer in ("forecast", "gnn")):
        _compiles_once(trainer, tmp_path, monkeypatch)


def _compiles_once(trainer: str, tmp_path: Path, monkeypatch) -> None:
    base = COMPILED[trainer]
    if trainer == "gnn":  # graphs of 10 to 60 nodes: no two steps hold the same numbers of nodes and edges
        from trainers.gnn.graphs import write_dataset

        write_dataset(tmp_path / "graphs", 40, 4, seed=1, min_nodes=10, max_nodes=60, workers=1, progress=False)
        base = [*base, "--data-dir", str(tmp_path / "graphs")]
    short, longer = LONGER[trainer]
    once = compiled_graphs([*base, *short, "--run-dir", str(tmp_path / "short")], None, monkeypatch)
    assert once >= 1
    training = json.loads((tmp_path / "short" / "results.json").read_text())["training"]
    assert training["compiled"] is True and training["compile_error"] is None
    assert compiled_graphs([*base, *longer, "--run-dir", str(tmp_path / "long")], None, monkeypatch) == once
    resumed = tmp_path / "resumed"
    compiled_graphs([*base, *longer, "--run-dir", str(resumed)], "sigterm@rank0:step7", monkeypatch)
    assert compiled_graphs([*base, *longer, "--run-dir", str(resumed)], None, monkeypatch) == once
    assert "resumed from checkpoint step" in (resumed / "training.log").read_text()


@pytest.mark.parametrize("trainer", ["forecast", "gnn"])
def test_a_step_whose_compile_fails_trains_eager_and_says_so(trainer, tmp_path, monkeypatch):
    """A compiler broken on the rented machine (here a backend that raises, as a missing triton or an
    inductor bug would) costs speed, not the run: the step runs eager, the log and results.json say why;
    a step that compiles records compiled and no error."""
    import torch._dynamo

    def broken_backend(gm, example_inputs):
        raise RuntimeError("no working compiler on this machine")

    real_compile = torch.compile
    torch._dynamo.reset()
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=broken_backend, **kw))
    args = [*COMPILED[trainer], *LONGER[trainer][0]]
    if trainer == "gnn":
        from trainers.gnn.graphs import write_dataset

        write_dataset(tmp_path / "graphs", 40, 4, seed=1, min_nodes=10, max_nodes=60, workers=1, progress=False)
        args += ["--data-dir", str(tmp_path / "graphs")]
    assert main([*args, "--run-dir", str(tmp_path / "run")]) == 0
    training = json.loads((tmp_path / "run" / "results.json").read_text())["training"]
    assert training["compiled"] is False and "no working compiler" in training["compile_error"]
    assert "torch.compile failed; training eager" in (tmp_path / "run" / "training.log").read_text()
    assert json.loads((tmp_path / "run" / "results.json").read_text())["evaluation"]
