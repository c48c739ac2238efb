"""The GPT's compiled blocks when the rented machine cannot compile (no C compiler, no triton, a GPU too
old for triton, an inductor bug): the run trains eager from its first forward, says so once in the log and
in results.json, and ends with the very numbers of a `--compile off` run; on one process (the compile fails
inside the first forward: it is made again eager, and so is activation checkpointing's recomputation), and on
two FSDP2 ranks, one of which cannot compile (they agree before the first forward)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import GPT_TINY, read_results, run_torchrun
from trainers.cli import main

RUN = ["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--max-steps", "6", "--eval-every", "3", "--gpu-defaults",
       "--device", "cpu"]
FALLBACK_WARNING = "torch.compile failed; training eager from here (--compile off skips the try)"


@pytest.fixture(autouse=True)
def default_stance():
    """The fallback sets torch.compiler's stance for the rest of the process: this worker's later tests get theirs."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch.compiler.set_stance("default")
    torch._dynamo.reset()


def the_numbers(run_dir) -> dict:
    r = read_results(run_dir)
    return {"val_loss": r["evaluation"]["val_loss"], "best_val_bpc": r["training"]["best_val_bpc"],
            "initial_val": r["training"]["initial_val"], "steps": r["training"]["steps"]}


@pytest.mark.slow  # its numbers are compared with a run of the same kernels (no SIMD pass needed)
def test_a_block_compile_that_fails_trains_eager_to_the_numbers_of_compile_off(tmp_path, monkeypatch):
    def broken_backend(gm, example_inputs):
        raise RuntimeError("no working compiler on this machine")

    real_compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real_compile(model, backend=broken_backend, **kw))
    assert main([*RUN, "--run-dir", str(tmp_path / "fallback")]) == 0
    monkeypatch.setattr(torch, "compile", real_compile)
    # the eager stance ended with the run: the next job in this process compiles (bench/ops_per_item.py runs several)
    from torch._dynamo.utils import counters

    counters.clear()
    torch.compile(lambda t: t * 2 + 1)(torch.ones(3))
    assert counters["stats"]["unique_graphs"] == 1
    assert main([*RUN, "--compile", "off", "--run-dir", str(tmp_path / "eager")]) == 0
    training = read_results(tmp_path / "fallback")["training"]
    assert training["compiled"] is False and "no working compiler" in training["compile_error"]
    assert (tmp_path / "fallback" / "training.log").read_text().count(FALLBACK_WARNING) == 1
    assert the_numbers(tmp_path / "fallback") == the_numbers(tmp_path / "eager")
    assert read_results(tmp_path / "eager")["training"]["compile_error"] is None


@pytest.mark.slow  # two processes; their numbers are compared with a run of the same kernels (no SIMD pass needed)
def test_two_fsdp_ranks_one_without_a_c_compiler_agree_to_train_eager_to_the_numbers_of_compile_off(tmp_path):
    """A real failure, not a stand-in: inductor's C++ kernels need the compiler CXX names, here one that works on
    rank 0 only. FSDP2's ranks cannot fall back one by one (a rank falling back inside a training step crashed
    gloo's size check), so they agree before the first forward, and both train eager."""
    cxx = tmp_path / "g++"
    cxx.write_text('#!/bin/sh\n[ "$RANK" = "1" ] && exit 1\nexec g++ "$@"\n')
    cxx.chmod(0o755)
    args = ["gpt", "train", *RUN[2:], "--parallel", "fsdp", "--activation-checkpointing", "on"]
    run_torchrun([*args, "--run-dir", str(tmp_path / "fallback")], env={"CXX": str(cxx)})
    run_torchrun([*args, "--compile", "off", "--run-dir", str(tmp_path / "eager")])
    training = read_results(tmp_path / "fallback")["training"]
    assert training["compiled"] is False and training["parallel"] == "fsdp" and training["world_size"] == 2
    assert training["compile_error"].startswith("ranks 0, 1 of 2: rank 1 cannot compile, so no rank does (FSDP2): ")
    assert "C++ compiler" in training["compile_error"]
    assert the_numbers(tmp_path / "fallback") == the_numbers(tmp_path / "eager")
    assert json.loads((tmp_path / "fallback" / "results.json").read_text())["evaluation"]["checkpoint_step"] == 6
