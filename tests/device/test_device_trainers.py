"""Everything a GPU user runs, on the fake accelerator: CUDA's placement rules on the CPU.

At a09b8e2 the forecaster, the deploy's default, died at its first CUDA step and the population search
at its first draw, with 1,546 CPU tests green: on a CPU-only machine `.to(device)` returns the very
tensor it was given, so nothing about where a tensor lives can fail. Here every process runs with its
device distinct from the host (tests/fakes/accelerator): each trainer's `train` on two gloo workers,
then `evaluate` and `export` of that run (the forecaster's baselines and report, the LSTM's queue and
PPO's evaluation included), the GPT's sampling and its server, `gnn color` with every search. A test
fails on an assertion carrying the error CUDA would have raised.

The same runs count the host syncs CUDA would block on (`.item()`, `float()`, `.tolist()`, `.cpu()`,
pageable copies to the device, data-dependent shapes): none is allowed in a steady step, between the
points where the loop waits on purpose (logging, evaluation, the stop agreement, checkpoints).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import GPT_TINY, TINY_DATA, free_port, read_results, run_cli, run_torchrun, wait_until_serving
from fake_accelerator import fake_env, read_logs, steady_step_syncs

pytestmark = pytest.mark.slow

# Waits only where the loop means to: an agreement every 4 steps, the log, evaluation and a checkpoint
# at the last step; steps 2..last-1 are steady. --deterministic: its switches break no trainer.
QUIET = ["--agree-every", "4", "--log-every", "1000", "--ckpt-every", "1000", "--deterministic"]


@dataclass
class Case:
    train: list[str]
    steps: int  # completed steps each worker must have made (at least)
    evaluate: list[str] = field(default_factory=lambda: ["evaluate"])
    prepare: str | None = None  # a data step (gnn)


CASES = {
    "forecast": Case([*TINY_DATA, "--epochs", "2", "--batch-size", "128", "--max-steps", "16", "--eval-every", "1000",
                      *QUIET], steps=16),
    "gnn": Case(["--epochs", "3", "--nodes-per-batch", "150", "--hidden", "16", "--layers", "2", "--search-iters",
                 "200", *QUIET], steps=12, prepare="gnn"),
    "lstm": Case(["--synthetic-tickers", "4", "--synthetic-days", "600", "--window", "8", "--hidden", "8",
                  "--batch-size", "64", "--epochs", "2", "--eval-every", "1000", "--export-behind", *QUIET], steps=10),
    "ppo": Case(["--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "600", "--window", "8",
                 "--episode-days", "20", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64", "--hidden",
                 "16", "--total-steps", "1536", "--eval-every", "1000", "--random-runs", "2", *QUIET], steps=12),
    "gpt": Case([*GPT_TINY, "--batch-tokens", "1024", "--max-steps", "12", "--eval-every", "1000", *QUIET], steps=12),
}


def tail(proc) -> str:
    return (proc.stdout + proc.stderr)[-5000:]


def workers(log_dir: Path) -> list[dict]:
    """The records of the `python -m trainers` processes (not torchrun's agent)."""
    return [r for r in read_logs(log_dir) if r["argv"][0].endswith("trainers/__main__.py")]


@dataclass
class Trained:
    run_dir: Path
    log_dir: Path
    proc: subprocess.CompletedProcess
    data: list[str]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each trainer trained once on the fake accelerator, on demand (a module-wide cache)."""
    root = tmp_path_factory.mktemp("device")
    done: dict[str, Trained] = {}

    def get(trainer: str) -> Trained:
        if trainer not in done:
            case = CASES[trainer]
            data = []
            if case.prepare == "gnn":
                graphs = root / "graphs"
                run_cli(["gnn", "data", "--out", str(graphs), "--train", "32", "--val", "8", "--max-nodes", "50",
                         "--no-progress"], check=True)
                data = ["--data-dir", str(graphs)]
            run_dir, log_dir = root / trainer, root / f"{trainer}-syncs"
            proc = run_torchrun([trainer, "train", *case.train, *data, "--run-dir", str(run_dir)], check=False,
                                env=fake_env(log_dir), timeout=600)
            done[trainer] = Trained(run_dir, log_dir, proc, data)
        return done[trainer]
    return get


@pytest.mark.parametrize("trainer", list(CASES))
def test_trains_on_the_fake_accelerator(trained, trainer):
    run = trained(trainer)
    assert run.proc.returncode == 0, f"{trainer} train failed on the fake accelerator:\n{tail(run.proc)}"
    results = read_results(run.run_dir)
    assert results["training"]["stop_reason"] == "completed"
    one_run = read_results(run.run_dir / "symbols" / "SYN000") if trainer == "lstm" else results
    assert one_run["training"]["deterministic"] is True
    if trainer == "lstm":  # on an accelerator each worker trains its 2 symbols as one cohort (--cohort auto)
        assert one_run["training"]["cohort"] == 2
        # and exports them behind its training, in a process of its own (--export-behind: a GPU deploy's default)
        log = (run.run_dir / "training.log").read_text()
        assert log.count("exporting behind the training in process") == 2
        assert all(row["export"]["sha256"] for row in results["symbols"].values())
    assert sorted(r["rank"] for r in workers(run.log_dir)) == [0, 1]  # both ran under the fake, left a record


@pytest.mark.parametrize("trainer", list(CASES))
def test_no_host_sync_in_a_steady_step(trained, trainer):
    run = trained(trainer)
    assert run.proc.returncode == 0, tail(run.proc)
    for record in workers(run.log_dir):
        completed = [m for m in record["markers"] if m["marker"] == "step_done"]
        assert len(completed) >= CASES[trainer].steps, f"rank {record['rank']}: {len(completed)} steps"
        syncs = steady_step_syncs(record)
        assert syncs == [], f"{trainer} rank {record['rank']}: host syncs in steady steps:\n" + \
            "\n".join(f"  {s['label']}: {s['kind']} ({s['op']}) at {s['where']}" for s in syncs)


@pytest.mark.parametrize("trainer,extra", [("ppo", []), ("lstm", ["--cohort", "1"]), ("forecast", [])])
def test_no_host_sync_in_a_steady_step_after_a_resume(trainer, extra, tmp_path):
    """A run stopped (SIGTERM at step 5) and resumed on the device: its steps wait on the GPU no more than a
    fresh run's. torch keeps a plain (not fused) Adam's step count on the host and reads it every update;
    loaded onto the device with the checkpoint, it made every update of PPO's resumed run wait once per
    parameter (9,120 waits in a short run), and the LSTM's alone too."""
    job = [trainer, "train", *CASES[trainer].train, *extra, "--run-dir", str(tmp_path / "run")]
    run_cli(job, env={**fake_env(tmp_path / "first"), "TRAINERS_FAULT": "sigterm@rank0:step5"})
    resumed = run_cli(job, env=fake_env(tmp_path / "resumed"))
    assert resumed.returncode == 0, tail(resumed)
    assert "resumed from checkpoint step 5" in resumed.stderr + resumed.stdout, tail(resumed)
    (record,) = workers(tmp_path / "resumed")
    first = min(m["step"] for m in record["markers"] if m["marker"] == "step_done")
    assert len([m for m in record["markers"] if m["marker"] == "step_done"]) >= 4, "too few steps after the resume"
    syncs = steady_step_syncs(record, first_steady=first + 1)
    assert syncs == [], f"{trainer}: host syncs in steady steps after a resume:\n" + \
        "\n".join(f"  {s['label']}: {s['kind']} ({s['op']}) at {s['where']}" for s in syncs[:10])


@pytest.mark.parametrize("trainer", list(CASES))
def test_evaluate_and_export_on_the_fake_accelerator(trained, trainer, tmp_path):
    run = trained(trainer)
    assert run.proc.returncode == 0, tail(run.proc)
    env = fake_env(tmp_path / "syncs")
    evaluated = run_cli([trainer, *CASES[trainer].evaluate, "--run-dir", str(run.run_dir), "--device", "auto"], env=env)
    assert evaluated.returncode == 0, f"{trainer} evaluate failed on the fake accelerator:\n{tail(evaluated)}"
    exported = run_cli([trainer, "export", "--run-dir", str(run.run_dir)], env=env)
    assert exported.returncode == 0, f"{trainer} export failed on the fake accelerator:\n{tail(exported)}"
    assert read_logs(tmp_path / "syncs")  # both ran under the fake


# ---- the GPT's sampling and server, the GNN's colouring ----------------------------------------------
def test_gpt_samples_and_serves_on_the_fake_accelerator(trained, tmp_path):
    run = trained("gpt")
    assert run.proc.returncode == 0, tail(run.proc)
    env = fake_env(tmp_path / "syncs")
    sampled = run_cli(["gpt", "sample", "--run-dir", str(run.run_dir), "--max-new-tokens", "20", "--seed", "1"],
                      env=env)
    assert sampled.returncode == 0, tail(sampled)
    from trainers.gpt.loadtest import post, stream

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "trainers", "gpt", "serve", "--run-dir", str(run.run_dir),
                               "--port", str(port), "--device", "auto", "--threads", "1"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_serving(url, server)
        status, out = post(url + "/generate", {"prompt": "ab", "max_new_tokens": 12, "seed": 3})
        assert status == 200 and len(out["text"]) >= 2, out
        kind, events = stream(url + "/generate", {"prompt": "ab", "max_new_tokens": 12, "seed": 3})
        assert "event-stream" in kind and events and all(name != "error" for name, _ in events), events
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize("search,device", [("tabu", "auto"), ("population", "auto"), ("population", "cuda")])
def test_gnn_colors_with_every_search_on_the_fake_accelerator(trained, tmp_path, search, device):
    run = trained("gnn")
    assert run.proc.returncode == 0, tail(run.proc)
    if not (run.run_dir / "model.onnx").exists():
        assert run_cli(["gnn", "export", "--run-dir", str(run.run_dir)]).returncode == 0
    graph = tmp_path / "g.col"
    edges = [(i, j) for i in range(1, 31) for j in range(i + 1, 31) if (i * 7 + j * 3) % 5 == 0]
    graph.write_text(f"p edge 30 {len(edges)}\n" + "".join(f"e {i} {j}\n" for i, j in edges))
    colored = run_cli(["gnn", "color", "--model", str(run.run_dir / "model.onnx"), "--graph", str(graph), "--search",
                       search, "--device", device, "--search-seconds", "2", "--search-iters", "20000"],
                      env=fake_env(tmp_path / "syncs"))
    assert colored.returncode == 0, f"gnn color --search {search} failed on the fake accelerator:\n{tail(colored)}"
    result = json.loads(colored.stdout.strip().splitlines()[-1])
    assert result["conflicts"] == 0
    if search == "population":
        assert result["searched"]["device"] == "cpu:0"  # it ran on "the GPU"


def test_an_lstm_cohort_out_of_device_memory_trains_in_passes_on_the_fake_accelerator(tmp_path):
    """On an accelerator a cohort's validations and final evaluation are stacked passes too: with no pass of
    2 or more models fitting (TRAINERS_FAULT_MEMORY=1), the validations, the training steps and the final
    evaluation run one model a pass, on the device (CUDA's placement rules), to the numbers of the same job
    with the memory it needs; when not even one model fits a pass, each member is tried alone."""
    job = ["lstm", "train", "--synthetic-tickers", "3", "--synthetic-days", "600", "--window", "8", "--hidden", "8",
           "--batch-size", "64", "--epochs", "2", "--eval-every", "1", "--no-export", "--cohort", "3"]
    results = {}
    for name, extra in (("fits", {}), ("short", {"TRAINERS_FAULT_MEMORY": "1"}), ("none", {"TRAINERS_FAULT_MEMORY": "0"})):
        run_dir = tmp_path / name
        proc = run_cli([*job, "--run-dir", str(run_dir)], env={**fake_env(tmp_path / f"{name}-syncs"), **extra})
        assert proc.returncode == 0, tail(proc)
        results[name] = {s: read_results(run_dir / "symbols" / s) for s in ("SYN000", "SYN001", "SYN002")}
    # the validation before the first step halves the evaluations' passes twice, the first step the training
    # steps' (their memory differs); every pass after (steps, validations, final evaluation) holds one model
    log = (tmp_path / "short" / "training.log").read_text()
    assert log.count("ran out of device memory") == 4, log
    for what in ("validation", "training step"):
        assert f"{what} with 3 models in one pass ran out" in log and f"{what} with 2 models in one pass" in log
    assert "together failed" not in log  # the final evaluation in passes, not its member-by-member fallback
    # not one model a pass fits (0): the first validation sends every member to be tried alone (nn.LSTM)
    assert all(r["training"]["try"] == 1 and "cohort" not in r["training"] for r in results["none"].values())
    assert "a cohort of 3 symbols ran out of device memory" in (tmp_path / "none" / "training.log").read_text()
    for s, fits in results["fits"].items():
        short = results["short"][s]
        assert short["training"]["cohort_rows_per_pass"] == 1 and short["training"]["cohort"] == fits["training"]["cohort"]
        assert (short["training"]["steps"], short["training"]["best_val"]["step"]) == \
            (fits["training"]["steps"], fits["training"]["best_val"]["step"])
        assert short["training"]["best_val"]["value"] == pytest.approx(fits["training"]["best_val"]["value"], abs=1e-6)
        for split in ("val", "test"):
            for key in ("log_loss", "accuracy", "roc_auc"):
                assert short["evaluation"][split]["model"][key] == \
                    pytest.approx(fits["evaluation"][split]["model"][key], abs=1e-6), (s, split, key)


def test_an_lstm_worker_whose_device_broke_leaves_its_symbols_pending_on_the_fake_accelerator(tmp_path):
    """A kernel fault in a cohort on the device (TRAINERS_FAULT_RAISE's `lost`: sticky, as CUDA's is): exit 1,
    nothing recorded failed; the next run, on the device again, trains every symbol on its first try."""
    job = ["lstm", "train", "--synthetic-tickers", "3", "--synthetic-days", "600", "--window", "8", "--hidden", "8",
           "--batch-size", "64", "--epochs", "2", "--no-export", "--cohort", "3", "--run-dir", str(tmp_path / "job")]
    lost = run_cli(job, env={**fake_env(tmp_path / "lost-syncs"), "TRAINERS_FAULT_RAISE": "SYN001@step1:lost"})
    assert lost.returncode == 1 and "CUDA's context is broken" in lost.stderr, tail(lost)
    assert read_results(tmp_path / "job")["training"]["symbols"]["failed"] == 0
    again = run_cli(job, env=fake_env(tmp_path / "again-syncs"))
    assert again.returncode == 0, tail(again)
    assert all(read_results(tmp_path / "job" / "symbols" / s)["training"]["try"] == 1
               for s in ("SYN000", "SYN001", "SYN002"))
