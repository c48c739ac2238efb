"""`make bench-gpu`: every GPU benchmark of this repository in one command, on the machine it meets.

    python3 bench/gpu.py                      # on a GPU machine: bench/results/*_gpu.json + gpu_summary.md
    python3 bench/gpu.py --dry-run            # the same steps at tiny sizes on the CPU, into a temporary folder
    python3 bench/gpu.py --list               # the steps, their commands, timeouts and estimated times
    python3 bench/gpu.py --resume --total-min 9   # in pieces, where one command may run at most 10 minutes

It detects the GPUs (torch's count, which honours CUDA_VISIBLE_DEVICES; nvidia-smi for the driver),
runs every multi-process step with as many processes as there are visible GPUs, and runs each step
in its own process group under its own timeout: a step that hangs is killed with all its workers
(torchrun's too) and recorded as timed out, one that fails is recorded as failed, and the rest go on.
A step that needs an optional package that is missing (gcol for the GNN's peer) is skipped with that
reason. Nothing is installed and nothing is fetched: the steps run against the torch already there,
with the repository on PYTHONPATH (the kit need not be pip-installed).

Before measuring, `trainers plan` predicts each comparable figure (at the MFU the plan names: an
ASSUMED default unless a committed GPU benchmark of ours gave one), so the predictions are those of
the code as it stood before this run. After every step, gpu_steps.json (what ran, how, how long,
with which result) and gpu_summary.md (bench/gpu_summary.py: each figure beside its committed CPU
rehearsal and the plan's prediction) are rewritten, so a session cut short still leaves both.

The estimated times below are estimates for one H100 (FLOPs at an assumed MFU plus start-up and
compile guesses), used only to schedule within --total-min; nothing here is a measurement.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench"
RESULTS = BENCH / "results"
RECORD = "gpu_steps.json"
PLANS = "gpu_plan.json"  # no trainer's name in it: `trainers plan` reads *<trainer>*gpu*.json as measured MFU
SUMMARY = "gpu_summary.md"
KILL_GRACE_S = 20  # SIGTERM, then SIGKILL: the trainers write a checkpoint on SIGTERM and need a moment
FINAL = ("ok", "skipped", "failed", "timed out")  # --resume runs the others again: not run, cut, interrupted


@dataclass
class Setup:
    dry: bool
    nproc: int  # processes of the multi-process steps: the visible GPUs (2 gloo processes in the dry run)
    device: str  # cuda; the dry run's --dry-device (cpu, or auto: the tests' fake accelerator where it is on)
    gpu_key: str | None  # the plan's table key for this GPU (h100-sxm in the dry run: the machine it will meet)
    out: Path  # where the JSON, the logs and the summary go
    work: Path  # run folders and datasets (deleted at the end)
    python: str = sys.executable


@dataclass
class Step:
    name: str
    what: str  # the figures it measures, in words (the summary names them)
    commands: list[list[str]]
    out: str | None  # the JSON it leaves under Setup.out
    timeout_s: int
    estimate_s: int  # expected wall time on one H100: an estimate for scheduling, not a measurement
    needs: tuple[str, ...] = ()  # optional modules: a missing one skips the step with that reason
    plans: dict[str, tuple[list[str], int]] = field(default_factory=dict)  # figure -> (plan options, GPUs)
    collect: Callable[[Setup, "Step", dict], dict] | None = None  # a trainer run: its results.json -> the JSON
    run_dir: Path | None = None


# ---- the steps ----------------------------------------------------------------------------------------

def _script(s: Setup, name: str, *args: str) -> list[str]:
    return [s.python, str(BENCH / name), *args]


def _torchrun(s: Setup, *args: str) -> list[str]:
    return [s.python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={s.nproc}", "-m", "trainers",
            *args]


def _trainers(s: Setup, *args: str) -> list[str]:
    return [s.python, "-m", "trainers", *args]


# The GPT benchmark's runs (depth:compile:parallel). On one GPU FSDP2 shards nothing, but it is the first
# run of that code path on CUDA and shows its cost beside DDP at the same depth. d26 (1.1B parameters)
# fits one H100 too, but its 17 GB final checkpoint would cost more minutes than its figure is worth here.
GPT_RUNS_GPU = "12:on:ddp,20:off:ddp,20:on:ddp,20:on:fsdp"
GPT_SEQ, GPT_DBS = 2048, 8
FORECAST_PRESETS_GPU = ("151m", "base", "small")  # largest first: a step cut short keeps what matters most


def build_steps(s: Setup) -> list[Step]:
    out = lambda name: str(s.out / name)  # noqa: E731
    cpu = ["--device", s.device] if s.dry else []
    n = s.nproc
    steps: list[Step] = [
        Step("plan", "the plan's predictions for every comparable figure (before measuring)",
             [_script(s, "gpu.py", "predict", "--setup", str(s.work / "setup.json"), "--out", out(PLANS))],
             PLANS, timeout_s=120 if not s.dry else 90, estimate_s=15),
    ]
    if s.dry:
        steps.append(Step("matmul", "bf16 matmul peak (TFLOP/s, share of the datasheet peak); device copy (GB/s)",
                          [_script(s, "matmul.py", *cpu, "--size", "256", "--dtype", "fp32", "--iters", "3",
                                   "--copy-mib", "4", "--out", out("matmul_gpu.json"))],
                          "matmul_gpu.json", 90, 30))
    else:
        steps.append(Step("matmul", "bf16 matmul peak (TFLOP/s, share of the datasheet peak); device copy (GB/s)",
                          [_script(s, "matmul.py", "--out", out("matmul_gpu.json"))], "matmul_gpu.json", 180, 30))

    # The forecaster: the kit's step beside a plain loop, Lightning and the naive seed-000 pipeline.
    # The dry run does not compile (torch.compile takes 30+ s per graph on a 2-core CPU; CI compiles the
    # trainers' own steps in tests/unit/test_gpu_paths.py): it checks the script and the wiring.
    presets = ("tiny",) if s.dry else FORECAST_PRESETS_GPU
    train_args = (["--presets", "tiny", "--steps", "2", "--warmup", "1", "--batch", "16", "--tickers", "6",
                   "--days", "700", "--workers", "0", "--gpu-defaults", *cpu] if s.dry else
                  ["--presets", ",".join(presets), "--steps", "50", "--warmup", "10", "--workers", "8"])
    batch = "16" if s.dry else "256"
    train_plans = {f"forecast {p}": (["--trainer", "forecast", "--preset", p, "--window", "120", "--batch-size", batch],
                                     1) for p in presets}
    steps.append(Step("train_eager", "forecaster training, eager: kit, plain loop, Lightning, naive (samples/s, MFU)",
                      [_script(s, "train_throughput.py", *train_args, "--out", out("train_gpu_eager.json"))],
                      "train_gpu_eager.json", 240 if s.dry else 420, 90, plans=train_plans))
    steps.append(Step("train_compiled",
                      "forecaster training, compiled: kit, plain loop, Lightning (samples/s, MFU)",
                      [_script(s, "train_throughput.py", *train_args, *([] if s.dry else ["--compile"]),
                               "--peers", "kit,plain,lightning", "--out", out("train_gpu_compiled.json"))],
                      "train_gpu_compiled.json", 240 if s.dry else 570, 270))
    steps.append(Step("profile", "where the forecaster's step time goes (torch.profiler, kit vs naive)",
                      [_script(s, "profile_step.py", *(["--preset", "tiny", "--steps", "1", "--batch", "16", *cpu]
                                                       if s.dry else ["--preset", "151m", "--steps", "5"]),
                               "--out", out("profile_gpu.json"))], "profile_gpu.json", 120 if s.dry else 240, 45))
    steps.append(Step("checkpoint", "checkpoint stall: written in the loop vs behind it (--ckpt-async)",
                      [_script(s, "checkpoint_save.py", *(["--presets", "tiny", "--saves", "1", *cpu] if s.dry else
                                                          ["--presets", "base,151m"]),
                               "--out", out("checkpoint_gpu.json"))], "checkpoint_gpu.json",
                      120 if s.dry else 300, 60))

    gpt_runs = "1:off:fsdp" if s.dry else GPT_RUNS_GPU  # the dry run's run_gpt rehearses DDP
    gpt_shape = (["--head-dim", "16", "--seq-len", "32", "--device-batch-size", "2", "--steps", "4", "--log-every", "2",
                  "--synthetic-chars", "65536", "--run-timeout", "120"] if s.dry else
                 ["--seq-len", str(GPT_SEQ), "--device-batch-size", str(GPT_DBS), "--steps", "30", "--log-every", "5",
                  "--run-timeout", "170"])
    seq, dbs, head = ("32", "2", "16") if s.dry else (str(GPT_SEQ), str(GPT_DBS), "128")
    gpt_plans = {}
    for run in gpt_runs.split(","):
        depth, _compile, parallel = run.split(":")
        gpt_plans[f"gpt d{depth} {parallel}"] = (
            ["--trainer", "gpt", "--depth", depth, "--head-dim", head, "--seq-len", seq, "--device-batch-size", dbs,
             "--batch-tokens", str(n * int(dbs) * int(seq)), "--parallel", parallel], n)
    steps.append(Step("gpt_throughput", f"GPT tokens/s and MFU over {n} process(es): {gpt_runs}",
                      [_script(s, "gpt_throughput.py", "--device", s.device if s.dry else "auto", "--nproc", str(n),
                               "--runs", gpt_runs, *gpt_shape, "--out", out("gpt_throughput_gpu.json"))],
                      "gpt_throughput_gpu.json", 180 if s.dry else 570, 240, plans=gpt_plans))

    steps += trainer_runs(s)

    # The LSTM job's cohorts (trainers.lstm.cohort): 64 symbols one at a time and in cohorts, then 500 in
    # cohorts only (one at a time they would take most of the session). Not named *lstm*gpu*: the plan
    # reads those as the LSTM's measured MFU.
    plan_gpu = ["--plan-gpu", s.gpu_key] if s.gpu_key else []  # the plan's job time beside each job's
    cohort_args = (["--symbols", "2", "--cohorts", "auto", "--epochs", "1", "--device", s.device, *plan_gpu] if s.dry else
                   ["--symbols", "64,500", "--cohorts", "auto", "--baseline-max", "64", "--shape", "default",
                    "--epochs", "5", "--device", "auto", "--keep", out("lstm_cohort_jobs"), *plan_gpu])
    steps.append(Step("lstm_cohort", "the LSTM job in cohorts vs one symbol at a time (64 symbols; 500 in cohorts)",
                      [_script(s, "lstm_pack.py", *cohort_args, "--out", out("cohort_packing_gpu.json"))],
                      "cohort_packing_gpu.json", 120 if s.dry else 540, 210))  # the H100's: ~190 s (21fae23)

    # The GNN against gcol's TabuCol (gnn_coloring.py as it is, with the options it has). On the GPU it
    # trains its own model; the dry run exports the model run_gnn trained and colours two graphs with it
    # (gnn_coloring's own training, data and export cost a 2-core CPU 40 s for two graphs).
    run_gnn = str(s.work / "run_gnn")
    coloring = ([_trainers(s, "gnn", "export", "--run-dir", run_gnn),
                 _script(s, "gnn_coloring.py", "--run-dir", run_gnn, "--budget", "0.1", "--finetune-steps", "2",
                         "--finetune-restarts", "1", "--only", "queen5_5,myciel3", "--out", out("gnn_gpu.json"))]
                if s.dry else
                [_script(s, "gnn_coloring.py", "--nproc", str(n), "--train", "2000", "--val", "50", "--epochs", "5",
                         "--budget", "1", "--finetune-steps", "100", "--finetune-restarts", "2",
                         "--out", out("gnn_gpu.json"))])
    steps.append(Step("gnn_coloring", "GNN colouring vs gcol's TabuCol and DSATUR; its training rate (graphs/s)",
                      coloring, "gnn_gpu.json", 180 if s.dry else 540, 300, needs=("gcol",)))
    return steps


def trainer_runs(s: Setup) -> list[Step]:
    """A short real run of each trainer in its GPU configuration (what a CUDA deploy turns on by default:
    compile (the GNN's where a run is long enough: here given), bf16, fused AdamW, checkpoints behind the loop,
    adaptive stop agreement). The dry run
    rehearses it with --gpu-defaults on the CPU, compile off (see train_compiled). Each run's options
    are its shape (what `trainers plan` is given too) and its loop (how long, how often it logs)."""
    w, n, dry = s.work, s.nproc, s.dry
    rehearse = ["--device", s.device, "--gpu-defaults"] if dry else []

    # the forecaster at the kit bench's shape (window 120, batch 256): its rate compares with train_compiled's kit
    f_shape = (["--synthetic-tickers", "16", "--synthetic-days", "800", "--window", "32", "--horizon", "5",
                "--preset", "tiny", "--batch-size", "64"] if dry else
               ["--preset", "151m", "--window", "120", "--batch-size", "256"])
    f_loop = (["--max-steps", "12", "--log-every", "4", "--ckpt-every", "8", "--no-compile"] if dry else
              ["--max-steps", "150", "--log-every", "10", "--ckpt-every", "100"])

    graphs = w / "graphs"
    # 7,000 graphs (about 1.09M nodes): the GPU's own step size, 65,536 nodes (gnn/size.py keeps 16 steps an epoch;
    # the H200's 1,000 graphs held it at 8,192: 1,153,729 nodes/s, bench/results/gpu_h200/run_gnn_gpu.runs.json)
    g_data = ["--train", "32", "--val", "8", "--max-nodes", "50"] if dry else ["--train", "7000", "--val", "32"]
    g_shape = (["--epochs", "2", "--nodes-per-batch", "150", "--hidden", "16", "--layers", "2"] if dry else
               ["--epochs", "3"])
    # --compile: a run this short trains eager by default (gnn/size.py's break-even); this measures the compiled
    # step a long run takes, the rate `trainers plan` counts for every GNN run
    g_loop = (["--search-iters", "200", "--log-every", "2", "--no-compile"] if dry else  # (as the forecaster's)
              ["--search-iters", "2000", "--search-seconds", "0.2", "--log-every", "10", "--compile"])

    if dry:
        t_shape = ["--depth", "1", "--head-dim", "16", "--seq-len", "32", "--device-batch-size", "8",
                   "--synthetic-chars", "65536", "--batch-tokens", str(n * 8 * 32 * 2)]
        t_loop = ["--eval-tokens", "2048", "--sample-chars", "16", "--warmup-steps", "2", "--max-steps", "8",
                  "--eval-every", "8", "--log-every", "2", "--compile", "off"]
    else:  # two micro-steps per step: gradient accumulation is part of the configuration
        t_shape = ["--depth", "12", "--seq-len", str(GPT_SEQ), "--device-batch-size", str(GPT_DBS), "--batch-tokens",
                   str(n * GPT_DBS * GPT_SEQ * 2)]
        t_loop = ["--max-steps", "150", "--eval-every", "150", "--log-every", "10", "--warmup-steps", "20"]

    l_shape = (["--synthetic-tickers", "2", "--synthetic-days", "800", "--window", "16", "--hidden", "8",
                "--batch-size", "64", "--epochs", "2"] if dry else ["--epochs", "5"])

    p_shape = (["--synthetic-tickers", "5", "--num-stocks", "4", "--synthetic-days", "600", "--window", "8",
                "--episode-days", "20", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64",
                "--hidden", "16", "--total-steps", "2048"] if dry else
               # the GPU's own default environment batch (ppo/size.py: 4,096 x 64 steps on a card of 22 GB or
               # more, for a job long enough to leave the agent 16 updates); one agent, the throughput's
               ["--total-steps", str(16 * 4096 * 64), "--no-baseline-mlp"])
    p_loop = ["--eval-every", "4", "--random-runs", "2"] if dry else ["--log-every", "1", "--eval-every", "4"]

    def run(name):
        return ["--run-dir", str(w / f"run_{name}"), *rehearse]

    # estimates: the H100's walls of bench/results/gpu_h100 (forecast 89 s, ppo 38 at 1,024 environments (the H200's
    # 40 s at 4,096), lstm 20, gnn 22 before its compiled step and 27 s (21 s of it compiling) on the H200 at 1,000
    # graphs) with a margin; --total-min starts a step only with its estimate left
    runs = [  # name, what, commands, shape for the plan, timeout on a GPU, estimate on one H100
        ("forecast", "the forecaster's real loop",
         [_torchrun(s, "forecast", "train", *run("forecast"), *f_shape, *f_loop, "--patience", "0")], f_shape, 360, 100),
        ("gnn", "the colouring GNN's real loop (its data, then training)",
         # --overwrite: the plan step made the same (seeded) dataset to size its prediction by it
         [_trainers(s, "gnn", "data", "--out", str(graphs), *g_data, "--no-progress", "--overwrite"),
          _torchrun(s, "gnn", "train", "--data-dir", str(graphs), *run("gnn"), *g_shape, *g_loop)],
         ["--data-dir", str(graphs), *g_shape], 360, 75),
        ("gpt", "the char-level GPT's real loop", [_torchrun(s, "gpt", "train", *run("gpt"), *t_shape, *t_loop)],
         t_shape, 360, 80),
        ("lstm", "the per-symbol LSTMs' job (one worker per GPU)",
         [_torchrun(s, "lstm", "train", *run("lstm"), *l_shape, "--no-export")], l_shape, 300, 25),
        ("ppo", "the CLSTM-PPO agent's real loop",
         [_torchrun(s, "ppo", "train", *run("ppo"), *p_shape, *p_loop)], p_shape, 300, 45),
    ]
    return [Step(f"run_{name}", f"{what}: ran, steady rate, MFU", commands, f"run_{name}_gpu.json",
                 180 if dry else timeout, estimate, plans={f"run {name}": (["--trainer", name, *shape], n)},
                 collect=collect_run, run_dir=w / f"run_{name}")
            for name, what, commands, shape, timeout, estimate in runs]


# ---- a trainer run's JSON -----------------------------------------------------------------------------

def collect_run(s: Setup, step: Step, facts: dict) -> dict:
    """The trainer run's results.json, reduced to what the summary and `trainers plan` read (`trainer`,
    `device`, `results[].mfu`), with the provenance every benchmark JSON carries."""
    results = json.loads((step.run_dir / "results.json").read_text())
    t = results.get("training", {})
    trainer = results.get("trainer") or step.name.removeprefix("run_")
    throughput = t.get("throughput") or {}
    row = {"unit": throughput.get("unit"), "per_s_steady": throughput.get("per_s_steady"),
           "per_s_per_device": throughput.get("per_s_per_device"), "effective_per_s": throughput.get("effective_per_s"),
           "steady_steps": throughput.get("steady_steps"), "mfu": t.get("mfu"), "breakdown_s": throughput.get("breakdown_s"),
           "parameters": (results.get("model") or {}).get("parameters")}  # the plan takes the row nearest its size
    if trainer == "gnn" and t.get("nodes_per_s_per_device"):  # the plan counts nodes, the loop graphs
        row["nodes_per_s"] = t["nodes_per_s_per_device"] * (t.get("world_size") or 1)
    # the plan's items a step on one device: a small model's MFU holds for about that step only (measured_mfu)
    config = results.get("config") or {}
    if trainer == "gnn":
        row["items_per_step"] = t.get("nodes_per_batch")
    elif trainer == "ppo" and config.get("num_envs") and config.get("rollout_steps"):
        row["items_per_step"] = config["num_envs"] * config["rollout_steps"]
    if trainer == "lstm":  # a job of many small runs: samples over the job's wall time, every worker together
        symbols = [json.loads(p.read_text()).get("training", {})
                   for p in sorted((step.run_dir / "symbols").glob("*/results.json"))]
        samples = sum((x.get("throughput") or {}).get("items_this_attempt") or 0 for x in symbols)
        wall = t.get("wall_time_s_this_attempt")
        row.update(unit="samples", job_samples=samples, per_s_job=samples / wall if wall else None,
                   packing=(t.get("packing") or {}).get("efficiency"), symbols=t.get("symbols"))
    training = {k: t.get(k) for k in ("stop_reason", "steps", "world_size", "device", "device_name", "precision",
                                      "compiled", "parallel", "peak_memory_bytes", "wall_time_s_this_attempt")}
    return {"benchmark": "trainer_run", "trainer": trainer, "device": t.get("device_name"), "training": training,
            "results": [row], "config": results.get("config"),
            **facts["provenance"], "command": " && ".join(shlex.join(c) for c in step.commands)}


# ---- predictions (a subprocess: it imports torch and the trainers) ------------------------------------

def make_data(step: Step, options: list[str]) -> None:
    """The dataset a plan reads (--data-dir) where the step makes it (its `... data --out DIR` command)
    and it is not there yet: the plan sizes a run by its data (the GNN's nodes a step), and the first
    H100 run's plan, made before the data, sized the GNN for the deploy's default dataset (8x its step)."""
    if "--data-dir" not in options or Path(options[options.index("--data-dir") + 1]).exists():
        return
    target = options[options.index("--data-dir") + 1]
    for command in step.commands:
        if "data" in command and "--out" in command and command[command.index("--out") + 1] == target:
            subprocess.run(command, check=True, capture_output=True, text=True, env=child_env(), timeout=300)
            return


def predict(setup_path: Path, out: Path) -> int:
    """Each step's plan cases through `trainers plan`'s own code (one process: one torch import)."""
    sys.path.insert(0, str(REPO))
    from trainers.ops.commands import load_workload
    from trainers.ops.devices import DEVICES
    from trainers.ops.plan import percent, plan

    meta = json.loads(setup_path.read_text())
    s = Setup(dry=meta["dry"], nproc=meta["nproc"], device=meta["device"], gpu_key=meta["gpu_key"],
              out=Path(meta["out"]), work=Path(meta["work"]))
    predictions: dict = {}
    if s.gpu_key is None:
        predictions["_skipped"] = f"`trainers plan` knows no GPU named {meta.get('gpu_name')!r}"
    for step in build_steps(s):
        for figure, (options, gpus) in step.plans.items():
            trainer, rest = options[1], options[2:]
            make_data(step, rest)
            parallel = rest[rest.index("--parallel") + 1] if "--parallel" in rest else "auto"
            rest = [a for i, a in enumerate(rest) if a != "--parallel" and (i == 0 or rest[i - 1] != "--parallel")]
            command = ["python", "-m", "trainers", "plan", "--trainer", trainer, *rest, "--gpus", str(gpus), "--gpu",
                       str(s.gpu_key), *(["--parallel", parallel] if parallel != "auto" else [])]
            if s.gpu_key is None:
                continue
            try:
                w = load_workload(trainer, rest)
                p = plan(w, DEVICES[s.gpu_key], gpus, parallel)
            except Exception as exc:  # one figure's plan failing leaves the others
                predictions[figure] = {"step": step.name, "command": shlex.join(command), "error": repr(exc)}
                continue
            predictions[figure] = {"step": step.name, "command": shlex.join(command), "unit": w.unit,
                                   "items_per_s": p.time["items_per_s"], "step_s": p.time["step_s"],
                                   "launch_bound": p.time.get("launch_bound"), "strategy": p.chosen, "fix": p.fix,
                                   "mfu": p.mfu, "gpus": gpus, "device": p.device, "parameters": p.parameters,
                                   "shape": w.shape, "notes": w.notes}
            print(f"{figure}: {p.time['items_per_s']:,.0f} {w.unit}/s at MFU {percent(p.mfu['value'])} ({p.mfu['source']})",
                  flush=True)
    out.write_text(json.dumps({"benchmark": "gpu_plan", "gpu": s.gpu_key, "predictions": predictions}, indent=2)
                   + "\n")
    return 0


# ---- the machine --------------------------------------------------------------------------------------

PROBE = r"""
import json, os, platform, sys
sys.path.insert(0, os.path.join(sys.argv[1], "bench"))
import torch
from record import provenance
n = torch.cuda.device_count()
print(json.dumps({"count": n, "names": [torch.cuda.get_device_name(i) for i in range(n)],
                  "memory_gib": [torch.cuda.get_device_properties(i).total_memory / 2**30 for i in range(n)],
                  "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                  "provenance": provenance()}))
"""


def probe(python: str) -> dict:
    """What the steps will see: torch's GPUs (CUDA_VISIBLE_DEVICES honoured), versions, driver, commit."""
    proc = subprocess.run([python, "-c", PROBE, str(REPO)], capture_output=True, text=True, timeout=180, env=child_env())
    if proc.returncode != 0:
        raise SystemExit(f"bench/gpu.py: could not import torch with {python}: {proc.stderr.strip()[-2000:]}")
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    facts["provenance"].pop("command", None)  # each step records its own
    return facts


def nvidia_smi_gpus() -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.strip()] if out.returncode == 0 else []


def plan_key(name: str, memory_gib: float | None) -> str | None:
    sys.path.insert(0, str(REPO))
    from trainers.ops.devices import device_for_name  # pure Python: no torch

    device = device_for_name(name, memory_gib)
    return device.key if device else None


def child_env() -> dict:
    env = dict(os.environ, TRAINERS_PROGRESS="0", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


# ---- running ------------------------------------------------------------------------------------------

class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


def run_command(cmd: list[str], log, env: dict, timeout: float | None, cwd: Path = REPO) -> tuple[int | None, float]:
    """(exit code, or None when it ran past `timeout`; seconds). On a timeout, or when this process is
    stopped, the command is ended with everything it started (end_tree)."""
    t0 = time.monotonic()
    # its own process group, in this session: a harness that ends this session's processes still ends it
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd, process_group=0)
    try:
        return proc.wait(timeout=None if timeout is None else max(timeout, 1)), time.monotonic() - t0
    except subprocess.TimeoutExpired:
        end_tree(proc)
        return None, time.monotonic() - t0
    except BaseException:
        end_tree(proc)
        raise


def descendants(pid: int) -> set[int]:
    """Every process below `pid`, in any process group or session. torchrun starts each worker in a
    session of its own, out of reach of a signal to torchrun's group, so the tree is read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # the name in parentheses may hold spaces; then state, ppid
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _send(pids, sig) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def end_tree(proc: subprocess.Popen, grace_s: float | None = None) -> None:
    """SIGTERM to the command and every process below it (the trainers checkpoint and exit on it;
    torchrun forwards it), SIGKILL to whatever is left after `grace_s`. The tree is read before any
    signal: a worker whose parent is gone can no longer be found."""
    tree = descendants(proc.pid)
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    _send(tree, signal.SIGTERM)
    until = time.monotonic() + (KILL_GRACE_S if grace_s is None else grace_s)
    while time.monotonic() < until:
        if proc.poll() is None:
            tree |= descendants(proc.pid)  # started meanwhile
        if proc.poll() is not None and not any(_alive(p) for p in tree):
            return
        time.sleep(0.2)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    _send([p for p in tree if _alive(p)], signal.SIGKILL)
    proc.wait()


def last_error(text: str) -> str:
    """The most telling line of a failed command's output: the last error or exception line (not
    torchrun's own wrapper lines), else the last line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        if any(k in line for k in ("Error", "error:", "Exception", "Traceback", "SystemExit")) and \
                "ChildFailedError" not in line and not line.startswith("torch.distributed.elastic"):
            return line[:300]
    return lines[-1][:300] if lines else ""


def run_step(step: Step, s: Setup, facts: dict, deadline: float | None, env: dict) -> dict:
    entry = {"what": step.what, "commands": [shlex.join(c) for c in step.commands], "json": step.out,
             "timeout_s": step.timeout_s, "estimate_s": step.estimate_s, "git_commit": facts["provenance"]["git_commit"]}
    missing = [m for m in step.needs if importlib.util.find_spec(m) is None]
    if missing:
        return dict(entry, status="skipped", reason=f"{', '.join(missing)} not installed")
    timeout, cut_by_budget = step.timeout_s, False
    if deadline is not None:
        left = deadline - time.monotonic()
        if left < step.estimate_s:
            return dict(entry, status="not run",
                        reason=f"{left:.0f} s of the set's --total-min left; it needs about {step.estimate_s} s "
                               f"(estimated): run again with --resume")
        if left < timeout:
            timeout, cut_by_budget = left, True
    logs = s.out / "gpu_logs"
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"{step.name}.log"
    if step.out:
        (s.out / step.out).unlink(missing_ok=True)  # a JSON left by an earlier run must not pass for this one's
    entry.update(log=str(log_path.relative_to(s.out)), started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
    print(f"== {step.name} (timeout {timeout:.0f} s): {step.what}", flush=True)
    wall, code = 0.0, 0
    with open(log_path, "w") as log:
        for cmd in step.commands:
            log.write(f"$ {shlex.join(cmd)}\n")
            log.flush()
            code, seconds = run_command(cmd, log, env, timeout - wall)
            wall += seconds
            if code != 0:
                break
    entry["wall_s"] = round(wall, 1)
    if code is None:
        status = ("cut", f"cut off by the set's --total-min after {wall:.0f} s: run again with --resume") \
            if cut_by_budget else ("timed out", f"killed after its {step.timeout_s} s timeout")
        return dict(entry, status=status[0], reason=status[1])
    if code != 0:
        return dict(entry, status="failed", exit_code=code,
                    reason=last_error(log_path.read_text(errors="replace")) or f"exit {code}")
    try:
        if step.collect is not None:
            record = step.collect(s, step, facts)
            (s.out / step.out).write_text(json.dumps(record, indent=2) + "\n")
        elif step.out:
            json.loads((s.out / step.out).read_text())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return dict(entry, status="failed", exit_code=0, reason=f"no readable {step.out}: {exc!r}")
    return dict(entry, status="ok")


def load_record(path: Path) -> dict:
    try:
        record = json.loads(path.read_text())
        return record if isinstance(record, dict) and isinstance(record.get("steps"), dict) else {}
    except (OSError, ValueError):
        return {}


def write_summary(out: Path) -> None:
    """gpu_summary.md from what is there now; a broken summary never stops the measurements."""
    try:
        sys.path.insert(0, str(BENCH))
        import gpu_summary

        gpu_summary.write(out, out / SUMMARY)
    except Exception:  # noqa: BLE001 - reported, the set goes on
        print("bench/gpu.py: the summary could not be written:\n" + traceback.format_exc(), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true",
                   help="every step at tiny sizes on the CPU (2 gloo processes where a step is multi-process), into "
                        "a temporary folder (never bench/results): checks the scripts and the wiring")
    p.add_argument("--dry-device", default="cpu", choices=("cpu", "auto"),
                   help="the dry run's --device for every step: cpu (default; even on a GPU machine) or auto (CI "
                        "runs the dry run on its fake accelerator so: CUDA's placement rules on the CPU)")
    p.add_argument("--out-dir", default=None, help="where the JSON, logs and summary go (default: bench/results; "
                                                   "the dry run: a new temporary folder)")
    p.add_argument("--only", default=None, help="comma-separated steps to run (the others keep their record)")
    p.add_argument("--skip", default=None, help="comma-separated steps not to run")
    p.add_argument("--resume", action="store_true", help="run only the steps the record does not hold as done "
                                                         "(not run, cut off by --total-min, interrupted)")
    p.add_argument("--total-min", type=float, default=None,
                   help="time budget of the whole set in minutes: a step is not started without its estimated "
                        "time left, and one running is cut off at the budget (default: 28 on a GPU, none dry)")
    p.add_argument("--timeout", action="append", default=[], metavar="STEP=SECONDS",
                   help="another timeout for one step (repeatable)")
    p.add_argument("--nproc", type=int, default=None, help="processes of the multi-process steps (default: every "
                                                           "visible GPU; 2 in the dry run)")
    p.add_argument("--list", action="store_true", help="print the steps and their commands, run nothing")
    p.add_argument("--keep-work", action="store_true", help="keep the run folders and datasets (default: deleted)")
    args = p.parse_args(argv)

    out = Path(args.out_dir).resolve() if args.out_dir else (
        Path(tempfile.mkdtemp(prefix="bench-gpu-dry-")) if args.dry_run else RESULTS)
    if args.dry_run and (out == RESULTS.resolve() or RESULTS.resolve() in out.parents):
        p.error("--dry-run never writes into bench/results (the committed results): give another --out-dir")
    out.mkdir(parents=True, exist_ok=True)

    facts = probe(sys.executable)
    smi = nvidia_smi_gpus()
    if args.dry_run:
        nproc, device, gpu_name, memory = args.nproc or 2, args.dry_device, "NVIDIA H100 80GB HBM3", 80.0
    else:
        if facts["count"] == 0:
            seen = f"nvidia-smi sees {len(smi)} ({'; '.join(smi)}) but " if smi else ""
            print(f"bench/gpu.py: {seen}torch {facts['torch']} sees no GPU. For the CPU rehearsal of every step: "
                  f"make bench-gpu-dry (python3 bench/gpu.py --dry-run)", file=sys.stderr)
            return 2
        if args.nproc is not None and not 1 <= args.nproc <= facts["count"]:
            p.error(f"--nproc {args.nproc}: {facts['count']} GPU(s) are visible")
        nproc, device = args.nproc or facts["count"], "cuda"
        gpu_name, memory = facts["names"][0], facts["memory_gib"][0]
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-work-"))
    s = Setup(dry=args.dry_run, nproc=nproc, device=device, gpu_key=plan_key(gpu_name, memory), out=out, work=work)
    steps = build_steps(s)
    names = [st.name for st in steps]
    for option in (args.only, args.skip):
        unknown = sorted(set((option or "").split(",")) - set(names) - {""})
        if unknown:
            p.error(f"unknown step(s) {unknown}; the steps: {', '.join(names)}")
    for item in args.timeout:
        name, _, seconds = item.partition("=")
        if name not in names or not seconds.replace(".", "", 1).isdigit():
            p.error(f"--timeout {item!r}: give STEP=SECONDS with one of {', '.join(names)}")
        next(st for st in steps if st.name == name).timeout_s = max(1, int(float(seconds)))

    if args.list:
        for st in steps:
            print(f"{st.name:<16} timeout {st.timeout_s:>4} s, about {st.estimate_s:>4} s on one H100 (estimated)"
                  f"{'; needs ' + ', '.join(st.needs) if st.needs else ''}\n    {st.what}")
            for c in st.commands:
                print(f"    $ {shlex.join(c)}")
        total = sum(st.estimate_s for st in steps if not st.needs)
        optional = sum(st.estimate_s for st in steps if st.needs)
        print(f"about {total / 60:.0f} min in all on one H100, {(total + optional) / 60:.0f} with the steps that need "
              f"an optional package (estimated from FLOPs at an assumed MFU, start-up and compile guesses)")
        shutil.rmtree(work, ignore_errors=True)
        return 0

    record_path = out / RECORD
    record = load_record(record_path)
    if record.get("dry_run", args.dry_run) != args.dry_run:
        record = {}  # a dry record never mixes with a GPU one
    done = {k for k, v in record.get("steps", {}).items() if v.get("status") in FINAL}
    chosen = [st for st in steps if (not args.only or st.name in args.only.split(","))
              and st.name not in (args.skip or "").split(",") and not (args.resume and st.name in done)]
    gpus = [{"name": n_, "memory_gib": round(m, 1)} for n_, m in zip(facts["names"], facts["memory_gib"])]
    record.update(dry_run=args.dry_run, nproc=nproc, device=device, gpus=gpus, nvidia_smi=smi,
                  driver=facts["provenance"]["machine"].get("gpu_driver"), torch=facts["torch"], cuda=facts["cuda"],
                  python=facts["python"], plan_gpu=s.gpu_key, machine=facts["provenance"]["machine"],
                  git_commit=facts["provenance"]["git_commit"], order=names)
    record.setdefault("steps", {})
    (work / "setup.json").write_text(json.dumps({"dry": s.dry, "nproc": nproc, "device": device,
                                                    "gpu_key": s.gpu_key, "gpu_name": gpu_name, "out": str(out),
                                                    "work": str(work)}) + "\n")
    budget_min = args.total_min if args.total_min is not None else (None if args.dry_run else 28.0)
    deadline = time.monotonic() + 60 * budget_min if budget_min else None
    env = child_env()
    if args.dry_run:
        env["OMP_NUM_THREADS"] = "1"  # 2 processes on 2 cores
    print(f"bench/gpu.py: {'DRY RUN on the CPU' if s.dry else gpu_name} x {nproc}, torch {facts['torch']}; "
          f"{len(chosen)} step(s) -> {out}", flush=True)

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    started = time.monotonic()
    try:
        for step in chosen:
            try:
                entry = run_step(step, s, facts, deadline, env)
            except (Interrupted, KeyboardInterrupt) as exc:
                record["steps"][step.name] = {"what": step.what, "status": "interrupted",
                                              "reason": f"the set was stopped ({exc or 'SIGINT'})"}
                raise
            record["steps"][step.name] = entry
            took = f" ({entry['wall_s']:.0f} s)" if "wall_s" in entry else ""
            print(f"   {entry['status']}{': ' + entry['reason'] if entry.get('reason') else ''}{took}", flush=True)
            record["wall_s_this_invocation"] = round(time.monotonic() - started, 1)
            record_path.write_text(json.dumps(record, indent=2) + "\n")
            write_summary(out)
    except (Interrupted, KeyboardInterrupt):
        record_path.write_text(json.dumps(record, indent=2) + "\n")
        write_summary(out)
        print(f"bench/gpu.py: stopped; what ran is in {record_path}", file=sys.stderr)
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not args.keep_work:
            shutil.rmtree(work, ignore_errors=True)
    record_path.write_text(json.dumps(record, indent=2) + "\n")
    write_summary(out)
    bad = [st.name for st in chosen if record["steps"][st.name].get("status") not in ("ok", "skipped")]
    print(f"bench/gpu.py: {out / SUMMARY}" + (f"; not ok: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0  # every step was tried either way; the exit code says whether all of them measured


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "predict":
        q = argparse.ArgumentParser(prog="bench/gpu.py predict")
        q.add_argument("--setup", required=True)
        q.add_argument("--out", required=True)
        a = q.parse_args(sys.argv[2:])
        raise SystemExit(predict(Path(a.setup), Path(a.out)))
    raise SystemExit(main())
