"""Whole-pipeline tests under torchrun with 2 gloo workers: train -> evaluate -> export -> package,
and the faults a rented GPU box meets: a worker SIGKILLed, SIGTERM, a corrupt checkpoint, a budget."""

import json
import os
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

from conftest import TINY_DATA, read_metrics, read_results, run_cli, run_torchrun

pytestmark = pytest.mark.slow

TRAIN = ["forecast", *TINY_DATA, "--epochs", "3", "--log-every", "5", "--batch-size", "128"]
STEPS_PER_EPOCH = 28  # 7072 train samples / (2 ranks x 128)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("e2e") / "forecast"
    run_torchrun([*TRAIN, "--run-dir", str(run_dir), "--usd-per-gpu-hour", "2.0"])
    return run_dir


def test_torchrun_trains_to_results_with_baselines(reference_run):
    r = read_results(reference_run)
    t = r["training"]
    assert t["stop_reason"] == "completed" and t["steps"] == 3 * STEPS_PER_EPOCH and t["world_size"] == 2
    assert t["best_val_loss"] < t["initial_val_loss"], "validation loss must fall from the untrained model's"
    assert t["samples_per_s_global"] > 0 and t["samples_per_s_per_device"] == pytest.approx(t["samples_per_s_global"] / 2)
    assert t["cost_usd"] == pytest.approx(t["device_hours"] * 2.0) and t["peak_memory_bytes"] > 0
    assert r["model"]["parameters"] > 0 and r["data"]["synthetic"] is True
    for split in ("val", "test"):
        e = r["evaluation"][split]
        assert {"mse", "directional_accuracy", "ic_mean"} <= set(e["model"])
        assert set(e["baselines"]) == {"always_up", "persistence", "zero_return", "train_mean"}
        assert e["baselines"]["always_up"]["directional_accuracy"] == e["up_rate"]
        assert e["rows"] == r["data"]["samples"][split]
    assert r["evaluation"]["checkpoint_step"] is not None
    logged = [m for m in read_metrics(reference_run) if m["kind"] == "train"]
    assert {"loss", "lr", "samples_per_s", "step_time_s", "peak_memory_bytes"} <= set(logged[0])
    assert list((reference_run / "tensorboard").glob("events.out.tfevents.*"))
    assert "val loss" in (reference_run / "training.log").read_text()


def test_export_and_package_give_a_tarball_sha256sum_accepts(reference_run, tmp_path):
    run_cli(["export", "--run-dir", str(reference_run), "--latency-iters", "5"], check=True)
    r = read_results(reference_run)
    parity = r["export"]["parity"]
    assert parity["max_abs_error"] < 1e-4 and 2 not in parity["batch_sizes"]
    assert {"batch_1", "batch_256"} <= set(r["export"]["latency_cpu"])
    proc = run_cli(["package", "--run-dir", str(reference_run), "--output", str(tmp_path / "out.tar.gz")], check=True)
    info = json.loads(proc.stdout)
    with tarfile.open(info["path"]) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    root = tmp_path / "x" / reference_run.name
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    names = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert {"model.onnx", "results.json", "config.json", "training.log", "metrics.jsonl", "SHA256SUMS"} <= names
    assert any(n.startswith("checkpoints/model_") for n in names) and any(n.startswith("tensorboard/") for n in names)
    # the packed ONNX runs on its own
    import onnxruntime as ort

    out = ort.InferenceSession(str(root / "model.onnx")).run(None, {"features": np.zeros((5, 32, 5), np.float32)})[0]
    assert out.shape == (5,)


def test_sigkill_of_one_worker_resumes_and_finishes_like_an_uninterrupted_run(reference_run, tmp_path):
    run_dir = tmp_path / "killed"
    run_torchrun([*TRAIN, "--run-dir", str(run_dir), "--ckpt-every", "4"], extra=["--max-restarts=1"],
                        env={"TRAINERS_FAULT": "sigkill@rank1:step10"})
    r = read_results(run_dir)
    assert r["training"]["restarts"] == 1 and r["training"]["steps"] == 3 * STEPS_PER_EPOCH
    assert "resumed from checkpoint step 8" in (run_dir / "training.log").read_text()
    # Each rank's data position and RNG were restored: the result is the uninterrupted run's.
    ref = read_results(reference_run)
    assert r["training"]["best_val_loss"] == pytest.approx(ref["training"]["best_val_loss"], rel=1e-5)
    assert r["evaluation"]["test"]["model"]["mse"] == pytest.approx(ref["evaluation"]["test"]["model"]["mse"], rel=1e-5)


def test_sigterm_on_one_rank_stops_all_with_a_checkpoint_then_resumes(reference_run, tmp_path):
    run_dir = tmp_path / "term"
    run_torchrun([*TRAIN, "--run-dir", str(run_dir)], env={"TRAINERS_FAULT": "sigterm@rank1:step5"})
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "signal" and r["training"]["steps"] == 5
    assert "skipped" in r["evaluation"]
    assert (run_dir / "checkpoints" / "meta_00000005.json").exists()
    run_torchrun([*TRAIN, "--run-dir", str(run_dir)])
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "completed" and r["training"]["steps"] == 3 * STEPS_PER_EPOCH
    assert "resumed from checkpoint step 5" in (run_dir / "training.log").read_text()
    ref = read_results(reference_run)
    assert r["training"]["best_val_loss"] == pytest.approx(ref["training"]["best_val_loss"], rel=1e-5)


def _wait_for(predicate, timeout: float, proc: subprocess.Popen):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"process ended early: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("timed out")


def test_external_sigterm_then_corrupt_newest_then_budget_stop(tmp_path):
    """SIGTERM from outside (what a pod stop sends) -> clean exit with a checkpoint; the newest checkpoint
    is corrupted -> the next start falls back to the previous; --max-hours tiny -> stops with results."""
    run_dir = tmp_path / "ext"
    args = ["forecast", *TINY_DATA, "--epochs", "500", "--ckpt-every", "3", "--batch-size", "64",
            "--run-dir", str(run_dir)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRAINERS_FAULT", None)
    proc = subprocess.Popen([sys.executable, "-m", "trainers", *args], stderr=subprocess.PIPE, text=True, env=env)
    ckpts = run_dir / "checkpoints"
    _wait_for(lambda: ckpts.is_dir() and len(list(ckpts.glob("meta_*.json"))) >= 2, 120, proc)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()[-3000:]
    assert time.monotonic() - t0 < 30  # inside torchrun's SIGTERM -> SIGKILL grace period
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "signal" and r["training"]["signal"] == "SIGTERM"
    steps = sorted(int(p.stem.split("_")[1]) for p in ckpts.glob("meta_*.json"))
    newest, previous = steps[-1], steps[-2]
    assert newest == r["training"]["steps"]
    model_file = ckpts / f"model_{newest:08d}.pt"
    model_file.write_bytes(model_file.read_bytes()[:-100])  # truncated: what a full disk leaves

    proc2 = run_cli([*args, "--max-hours", "1e-9"], check=True)
    log = (run_dir / "training.log").read_text()
    assert f"checkpoint step {newest} is unusable" in proc2.stderr
    assert f"resumed from checkpoint step {previous}" in log
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "time_budget" and r["training"]["steps"] == previous + 1
    assert "val" in r["evaluation"] and (ckpts / f"meta_{previous + 1:08d}.json").exists()


def test_max_hours_ends_a_fresh_run_early_with_checkpoint_and_results(tmp_path):
    run_dir = tmp_path / "budget"
    run_cli(["forecast", *TINY_DATA, "--epochs", "500", "--max-hours", "0.0005", "--run-dir", str(run_dir)],
            check=True)
    r = read_results(run_dir)
    t = r["training"]
    assert t["stop_reason"] == "time_budget" and 0 < t["steps"] < t["total_steps"]
    assert 1.8 <= t["elapsed_s_all_attempts"] < 30
    assert (run_dir / "checkpoints" / f"meta_{t['steps']:08d}.json").exists()
    assert r["evaluation"]["test"]["model"]["mse"] > 0
