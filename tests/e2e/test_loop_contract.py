"""The loop contract every trainer keeps, tested the same way for each (CPU, gloo, 2 ranks):

- a worker SIGKILLed under `torchrun --max-restarts=1` resumes and ends equal to an uninterrupted run
  (each rank's data position and RNG really are restored);
- SIGTERM on one rank stops every rank at the same step with a checkpoint and results.json, exit 0,
  evaluation skipped; the next start resumes and ends equal to the uninterrupted run;
- SIGTERM from outside (what a pod stop sends) exits 0 well inside torchrun's 30 s grace period;
- a budget stop leaves a checkpoint and results with the evaluation;
- a run folder that holds another config is refused in one line, exit 2, untouched.

A new trainer joins by adding a `Contract` to CONTRACTS.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from conftest import GPT_TINY, TINY_DATA, read_metrics, read_results, run_cli, run_torchrun, wait_for

pytestmark = pytest.mark.slow


def _gnn_data(root: Path) -> list[str]:
    data = root / "graphs"
    if not (data / "metadata.json").exists():
        run_cli(["gnn", "data", "--out", str(data), "--train", "32", "--val", "8", "--max-nodes", "50",
                 "--no-progress"], check=True)
    return ["--data-dir", str(data)]


@dataclass
class Contract:
    trainer: str
    args: list[str]  # a tiny run (2 ranks) of `trainers <trainer> train`
    steps: int  # its total steps with 2 ranks
    ckpt_every: int
    kill_step: int  # SIGKILL here (rank 1); the resume starts from the checkpoint before it
    term_step: int
    equal: list[tuple[str, ...]]  # result paths that must equal the uninterrupted run's
    prepare: Callable[[Path], list[str]] = lambda _root: []
    long_args: list[str] = field(default_factory=list)  # a run long enough to be stopped from outside
    # The one run a stop case inspects (its steps, checkpoints, evaluation): the run folder itself, or
    # for a job of many runs (lstm: a run per symbol) the run its results name as stopped first.
    run_of: Callable[[Path, dict], Path] = lambda run_dir, _results: run_dir

    @property
    def resumed_from(self) -> int:
        return self.kill_step // self.ckpt_every * self.ckpt_every


def _lstm_stopped_symbol(run_dir: Path, results: dict) -> Path:
    return run_dir / "symbols" / results["training"]["stopped_by"]["symbol"]


# 4 synthetic symbols, 10 steps each (2 epochs of 5), on 2 workers taking them from the queue. For a job
# "equal" means: every symbol's best validation loss and the job's total steps equal the uninterrupted run's.
LSTM_TINY = ["--synthetic-tickers", "4", "--synthetic-days", "800", "--window", "16", "--hidden", "8",
             "--batch-size", "64", "--no-export"]

PPO_TINY = ["--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "600", "--window", "8",
            "--episode-days", "20", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64", "--hidden", "16",
            "--total-steps", "2048", "--eval-every", "4", "--random-runs", "2", "--device", "cpu"]

CONTRACTS = {
    "forecast": Contract(
        "forecast", [*TINY_DATA, "--epochs", "2", "--log-every", "5", "--batch-size", "128"], steps=56,
        ckpt_every=4, kill_step=10, term_step=5,
        equal=[("training", "best_val", "value"), ("evaluation", "test", "model", "mse")],
        long_args=[*TINY_DATA, "--epochs", "500", "--batch-size", "64", "--patience", "0"]),
    "gnn": Contract(
        "gnn", ["--epochs", "3", "--nodes-per-batch", "150", "--hidden", "16", "--layers", "2", "--dropout", "0.2",
                "--search-iters", "200"],
        steps=12, ckpt_every=2, kill_step=7, term_step=5,  # 32 graphs, 1147 nodes: 4 steps per epoch on 2 ranks
        equal=[("training", "best_val", "value"), ("training", "last_val"), ("evaluation", "val", "mean_colors")],
        prepare=_gnn_data,
        long_args=["--epochs", "5000", "--nodes-per-batch", "60", "--hidden", "16", "--layers", "2", "--patience", "0",
                   "--search-iters", "200"]),
    "lstm": Contract(
        "lstm", [*LSTM_TINY, "--epochs", "2"], steps=40, ckpt_every=2, kill_step=7, term_step=5,
        equal=[("training", "steps"), *[("symbols", f"SYN00{i}", "best_val_loss") for i in range(4)]],
        long_args=[*LSTM_TINY, "--symbols", "SYN000", "--epochs", "5000", "--patience", "0"],
        run_of=_lstm_stopped_symbol),
    # 2 agents (clstm, mlp) x 8 updates; the kill at update 9 resumes from 8: the second agent's first
    # update, from a checkpoint whose environment position belongs to the first agent
    "ppo": Contract(
        "ppo", PPO_TINY, steps=16, ckpt_every=2, kill_step=9, term_step=5,
        equal=[("evaluation", "table", "ppo_clstm", "summary", "cumulative_return", "mean"),
               ("evaluation", "table", "ppo_clstm", "summary", "turnover", "mean"),
               ("evaluation", "table", "ppo_mlp", "summary", "cumulative_return", "mean")],
        long_args=[*PPO_TINY, "--total-steps", "100000000"]),
    # DDP with 2 accumulation steps on the synthetic Markov text (nothing to prepare); the stream's
    # per-rank positions are what the resume must restore
    "gpt": Contract(
        "gpt", [*GPT_TINY, "--batch-tokens", "1024", "--max-steps", "12", "--eval-every", "4", "--log-every", "2"],
        steps=12, ckpt_every=4, kill_step=7, term_step=5,
        equal=[("training", "best_val", "value"), ("evaluation", "val_loss"), ("training", "stream")],
        long_args=[*GPT_TINY, "--batch-tokens", "512", "--max-steps", "1000000", "--eval-every", "50"]),
}


def dig(results: dict, path: tuple[str, ...]):
    for key in path:
        results = results[key]
    return results


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("contract")


_references: dict[str, Path] = {}


def reference(c: Contract, root: Path) -> Path:
    """The uninterrupted 2-rank run every fault case is compared with (made once per trainer)."""
    if c.trainer not in _references:
        run_dir = root / f"{c.trainer}-reference"
        run_torchrun([c.trainer, "train", *c.args, *c.prepare(root), "--run-dir", str(run_dir)])
        r = read_results(run_dir)
        assert r["training"]["stop_reason"] == "completed" and r["training"]["steps"] == c.steps
        _references[c.trainer] = run_dir
    return _references[c.trainer]


# What "equal" means, by where the runs ran (README, "exact resume on a GPU"). On a CPU, and on CUDA with
# --deterministic, a resumed run repeats the uninterrupted one's kernels: equal to rel 1e-5 (bitwise in
# practice). On CUDA without it, kernels that add in whatever order threads finish (the GNN's index_add,
# cuDNN's LSTM backward in the LSTM and PPO trainers, SDPA's backward in the forecaster and the GPT, cuBLAS's
# split reductions) differ in the last bits each run, and the difference grows over the steps after the
# resume: equal within GPU_NONDETERMINISTIC_REL. Stated, not yet measured: no GPU has run this contract.
EXACT_REL = 1e-5
GPU_NONDETERMINISTIC_REL = 2e-2


def resume_tolerance(ref: dict) -> float:
    exact = ref["training"]["device"] != "cuda" or ref["config"]["deterministic"]
    return EXACT_REL if exact else GPU_NONDETERMINISTIC_REL


def assert_equal_to_reference(c: Contract, got: dict, ref: dict) -> None:
    rel = resume_tolerance(ref)
    for path in c.equal:
        assert dig(got, path) == pytest.approx(dig(ref, path), rel=rel), path


@pytest.mark.parametrize("name", CONTRACTS)
@pytest.mark.resume
def test_sigkill_of_one_worker_resumes_and_ends_like_an_uninterrupted_run(name, workdir):
    c = CONTRACTS[name]
    ref = read_results(reference(c, workdir))
    run_dir = workdir / f"{name}-killed"
    run_torchrun([name, "train", *c.args, *c.prepare(workdir), "--run-dir", str(run_dir),
                  "--ckpt-every", str(c.ckpt_every)], extra=["--max-restarts=1"],
                 env={"TRAINERS_FAULT": f"sigkill@rank1:step{c.kill_step}"})
    r = read_results(run_dir)
    assert r["training"]["restarts"] == 1 and r["training"]["steps"] == c.steps
    assert f"resumed from checkpoint step {c.resumed_from}" in (run_dir / "training.log").read_text()
    assert_equal_to_reference(c, r, ref)


@pytest.mark.parametrize("name", CONTRACTS)
def test_sigterm_on_one_rank_stops_all_with_a_checkpoint_then_resumes(name, workdir):
    c = CONTRACTS[name]
    ref = read_results(reference(c, workdir))
    run_dir = workdir / f"{name}-term"
    args = [name, "train", *c.args, *c.prepare(workdir), "--run-dir", str(run_dir)]
    run_torchrun(args, env={"TRAINERS_FAULT": f"sigterm@rank1:step{c.term_step}"})  # exit 0 is checked
    r = read_results(run_dir)
    stopped = c.run_of(run_dir, r)
    assert r["training"]["stop_reason"] == "signal" and read_results(stopped)["training"]["steps"] == c.term_step
    assert "skipped" in r["evaluation"] and f"trainers {name} evaluate" in r["evaluation"]["skipped"]
    assert (stopped / "checkpoints" / f"meta_{c.term_step:08d}.json").exists()
    run_torchrun(args)
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "completed" and r["training"]["steps"] == c.steps
    assert f"resumed from checkpoint step {c.term_step}" in (run_dir / "training.log").read_text()
    assert_equal_to_reference(c, r, ref)


@pytest.mark.parametrize("name", ["forecast", "gnn"])  # (their loops count epochs of an EpochCursor's steps)
def test_a_resume_on_more_ranks_trains_the_epoch_it_restarts_and_every_one_after(name, workdir):
    """Another world size cannot map the ranks' data positions: rank 0's epoch starts again, at this world's steps
    an epoch. The loops counted `epochs x steps an epoch` from the saved step: resumed on 2 ranks after 3 steps on
    one, a run ended an epoch short and called it completed."""
    c = CONTRACTS[name]
    run_dir = workdir / f"{name}-more-ranks"
    args = [name, "train", *c.args, *c.prepare(workdir), "--run-dir", str(run_dir)]
    run_cli(args, env={"TRAINERS_FAULT": "sigterm@rank0:step3"}, check=True)  # one process
    assert read_results(run_dir)["training"]["steps"] == 3
    run_torchrun(args)
    r = read_results(run_dir)["training"]
    assert r["stop_reason"] == "completed" and r["steps"] == r["total_steps"] == 3 + c.steps  # c.steps: 2 ranks'


def test_a_forecast_resumed_on_fewer_ranks_ends_its_cosine_where_its_loop_ends(workdir):
    """After 30 steps on 2 ranks (an epoch and 2 steps), 1 process restarts epoch 1 and trains 56 more: the loop ends
    at 86, and the learning rate must reach its floor there. The schedule was built for the one process's 112
    steps, and the run ended halfway down the cosine."""
    c = CONTRACTS["forecast"]
    run_dir = workdir / "forecast-fewer-ranks"
    args = ["forecast", "train", *c.args, "--run-dir", str(run_dir)]
    run_torchrun(args, env={"TRAINERS_FAULT": "sigterm@rank0:step30"})
    run_cli(args, check=True)
    r = read_results(run_dir)
    assert r["training"]["steps"] == r["training"]["total_steps"] == 30 + 56
    last = [m for m in read_metrics(run_dir) if m["kind"] == "train"][-1]
    floor = r["config"]["lr"] * r["config"]["min_lr_ratio"]
    assert last["step"] == 86 and last["lr"] == pytest.approx(floor, rel=1e-6)


@pytest.mark.parametrize("name", CONTRACTS)
def test_external_sigterm_exits_zero_well_inside_the_grace_period(name, workdir):
    c = CONTRACTS[name]
    run_dir = workdir / f"{name}-external"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRAINERS_FAULT", None)
    proc = subprocess.Popen([sys.executable, "-m", "trainers", name, "train", *c.long_args, *c.prepare(workdir),
                             "--ckpt-every", "3", "--run-dir", str(run_dir)], stderr=subprocess.PIPE, text=True,
                            env=env)
    wait_for(lambda: any(run_dir.rglob("checkpoints/meta_*.json")), 120, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
    assert time.monotonic() - t0 < 30
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "signal" and r["training"]["signal"] == "SIGTERM"
    stopped = c.run_of(run_dir, r)
    assert (stopped / "checkpoints" / f"meta_{read_results(stopped)['training']['steps']:08d}.json").exists()


@pytest.mark.parametrize("name", CONTRACTS)
def test_a_budget_stop_leaves_a_checkpoint_and_results(name, workdir):
    c = CONTRACTS[name]
    run_dir = workdir / f"{name}-budget"
    run_cli([name, "train", *c.long_args, *c.prepare(workdir), "--max-hours", "0.0005", "--run-dir", str(run_dir)],
            check=True)
    r = read_results(run_dir)
    t = r["training"]
    assert t["stop_reason"] == "time_budget" and 0 < t["steps"] < t["total_steps"]
    stopped = c.run_of(run_dir, r)
    one = read_results(stopped)
    # stopped inside the budget, keeping time for the end: judged by what the run recorded at its decision, not by
    # the host's clock after it (a loaded machine stretches the final save and evaluation: 10.6 s for 1.8 s)
    if name == "lstm":  # (the job's wind-down decides for its symbols: their own runs have no budget)
        assert t["budget_s"] == pytest.approx(1.8) and one["training"]["stop_reason"] in ("signal", "time_budget")
        assert t["elapsed_s_all_attempts"] < 1.8 + 120  # a bound on a hang only
    else:  # no step after the budget was spent: the stop came at the first agreement that reached it
        decision = t["budget_stop"]
        assert decision["limit_s"] == pytest.approx(1.8), decision
        reserve, before = decision["reserve_s"], decision["previous_agreement_elapsed_s"]
        rounding = 1e-3  # the record rounds each value to a millisecond (a sum can fall a float's width short)
        # each agreement is judged with the reserve it kept then: a save or an evaluation in between can raise it
        # (CI: 1.762 s + the later 0.2 s passed 1.8). None: the budget was spent before the first agreement, in the
        # start-up it counts
        assert before is None or before + decision["previous_agreement_reserve_s"] < 1.8 + rounding, decision
        assert 1.8 <= decision["elapsed_s"] + reserve + rounding, decision
    assert (stopped / "checkpoints" / f"meta_{one['training']['steps']:08d}.json").exists()
    evaluation = one["evaluation"]
    assert "skipped" not in evaluation and "pending" not in evaluation and evaluation["checkpoint_step"] is not None


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("name", CONTRACTS)
def test_a_run_folder_of_another_config_is_refused_in_one_line_untouched(name, workdir, tmp_path):
    """Built cheaply: a folder whose config.json differs in one field (no training needed)."""
    from trainers.registry import trainer_config
    from trainers.runtime import config as cfgmod

    c = CONTRACTS[name]
    extra = c.prepare(workdir)
    run_dir = tmp_path / "run"
    cfg = trainer_config(name, [*c.args, *extra, "--run-dir", str(run_dir)])
    saved = cfgmod.to_dict(cfg)
    saved["seed"] = 12345
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(saved))
    before = tree_digest(run_dir)
    proc = run_cli([name, "train", *c.args, *extra, "--run-dir", str(run_dir)])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "different config" in lines[0] and "seed: saved 12345, now 0" in lines[0], proc.stderr
    assert tree_digest(run_dir) == before


# ---- the same contract under what a GPU deploy turns on, rehearsed on the CPU (--gpu-defaults) ----------
# torch.compile (forecast, gpt), bf16 autocast (forecast, gpt, ppo), fused AdamW, checkpoints written behind
# the loop, adaptive stop agreement, reused host buffers; the GPT in both its layouts. A SIGKILLed worker's
# run must end equal to an uninterrupted rehearsal: bitwise here (rel 1e-5, as above), because every kernel
# of the rehearsal is deterministic on a CPU; on a GPU bf16 reductions may not be, which is why the plain
# contract above stays the exactness test and this one the "it runs and resumes" test of the GPU config.
REHEARSAL = {name: ["--gpu-defaults"] for name in CONTRACTS}
REHEARSAL["gpt-fsdp"] = ["--gpu-defaults", "--parallel", "fsdp", "--activation-checkpointing", "on"]
# An LSTM symbol holds its new bests in host memory (--ckpt-at-eval held) and writes them with its next checkpoint:
# a step cadence gives it writes behind the loop to make (each after the best it held)
REHEARSAL["lstm"] = ["--gpu-defaults", "--ckpt-every", str(CONTRACTS["lstm"].ckpt_every)]
# A write behind the loop completes at the next agreement, which adaptive agreement makes rare (about a
# second of steps): a kill soon after the first save finds no complete checkpoint and rightly starts over.
# The kill comes late, after evaluations (always agreements) have completed earlier saves.
LATE_KILL = {"forecast": 50, "gnn": 10, "lstm": 8, "ppo": 14, "gpt": 10}
# The SIGTERM case once more under adaptive agreement: the stop lands at the next agreement, whichever trainer
# asks (runtime code): run for a compiled DDP trainer (the GPT's, the cheapest to compile) and for FSDP2's
# sharded saves, not for every variant (each case is a torchrun launch: CI's time, issue 36).
TERM_REHEARSED = ("gpt", "gpt-fsdp")


@pytest.mark.parametrize("variant", REHEARSAL)
def test_the_gpu_configuration_rehearsed_on_a_cpu_keeps_the_contract(variant, workdir):
    name = variant.split("-")[0]
    c = CONTRACTS[name]
    flags = REHEARSAL[variant]
    ref_dir = workdir / f"{variant}-rehearsal-reference"
    run_torchrun([name, "train", *c.args, *flags, *c.prepare(workdir), "--run-dir", str(ref_dir)])
    ref = read_results(ref_dir)
    assert ref["training"]["stop_reason"] == "completed" and ref["training"]["steps"] == c.steps
    one = read_results(c.run_of(ref_dir, {"training": {"stopped_by": {"symbol": "SYN000"}}}))["training"]
    assert one["throughput"]["checkpoint_writes_behind_s"] > 0 or "fsdp" in variant  # FSDP2 shards: written in the loop
    if name in ("forecast", "gpt"):
        from trainers.gpt.train import recompute_refused

        eager_here = recompute_refused(True) if variant == "gpt-fsdp" else None  # (torch 2.7: CheckpointError)
        assert one.get("precision") == "bf16" and (one.get("compiled") if eager_here is None else
                                                   (one.get("compile_error") or "").endswith(eager_here)), one

    # SIGKILL: resumes from a complete checkpoint, ends equal. With the saves written behind the loop this is also
    # --ckpt-async's SIGKILL case (a test of its own repeated the forecaster's without compile and bf16).
    killed = workdir / f"{variant}-rehearsal-killed"
    run_torchrun([name, "train", *c.args, *flags, *c.prepare(workdir), "--run-dir", str(killed), "--ckpt-every",
                  str(c.ckpt_every)], extra=["--max-restarts=1"], env={"TRAINERS_FAULT": f"sigkill@rank1:step{LATE_KILL[name]}"})
    r = read_results(killed)
    assert r["training"]["restarts"] == 1 and r["training"]["steps"] == c.steps
    # Each run resumes from a complete checkpoint: one written behind the loop before the kill, or that run's
    # own stop checkpoint. The LSTM's other worker trains its own symbol: torchrun's SIGTERM after the kill
    # stops it gracefully at whatever step it reached (under load, its symbol's last step), and it resumes there.
    resumed = []
    for run_log in killed.rglob("training.log"):
        text = run_log.read_text()  # the LSTM job's own log repeats its symbols' lines as "SYN000: resumed ..."
        stopped_at = {int(s) for s in re.findall(r"training stopped: signal at step (\d+)", text)}
        resumed += [(int(s), stopped_at) for s in re.findall(r"INFO resumed from checkpoint step (\d+)", text)]
    assert resumed and all(0 < s < LATE_KILL[name] or s in stopped_at for s, stopped_at in resumed), resumed
    assert_equal_to_reference(c, r, ref)

    if variant not in TERM_REHEARSED:
        return
    termed = workdir / f"{variant}-rehearsal-term"  # SIGTERM on one rank: every rank stops, with a checkpoint
    run_torchrun([name, "train", *c.args, *flags, *c.prepare(workdir), "--run-dir", str(termed)],
                 env={"TRAINERS_FAULT": f"sigterm@rank1:step{c.term_step}"})
    r = read_results(termed)
    stopped = c.run_of(termed, r)
    steps = read_results(stopped)["training"]["steps"]  # adaptive agreement: the stop lands at the next agreement
    assert r["training"]["stop_reason"] == "signal" and c.term_step <= steps < c.steps
    assert (stopped / "checkpoints" / f"meta_{steps:08d}.json").exists() and "skipped" in r["evaluation"]
    # (A budget stop takes the SIGTERM's path here: a stop requested on one rank, agreed at the next adaptive
    # agreement, saved once. The plain contract's budget test keeps its own run; this one no longer repeats it.)
