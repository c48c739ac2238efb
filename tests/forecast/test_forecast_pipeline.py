"""The forecaster end to end under torchrun with 2 gloo workers: train -> evaluate -> export -> package,
and a corrupt newest checkpoint after a stop. (SIGKILL, SIGTERM, budgets and refused folders are the
loop contract every trainer keeps: tests/e2e/test_loop_contract.py.)"""

import json
import logging
import os
import signal
import subprocess
import sys
import tarfile
import time

import numpy as np
import pytest

from conftest import TINY_DATA, read_metrics, read_results, run_cli, run_torchrun, wait_for

pytestmark = pytest.mark.slow

TRAIN = ["forecast", "train", *TINY_DATA, "--epochs", "3", "--log-every", "5", "--batch-size", "128"]
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
    assert t["best_val"]["value"] < t["initial_val"], "validation loss must fall from the untrained model's"
    assert t["best_val"]["name"] == "val_loss" and t["best_val"]["step"] > 0
    tp = t["throughput"]
    assert tp["unit"] == "samples" and tp["per_s_steady"] > 0 and tp["effective_per_s"] > 0
    assert tp["per_s_per_device"] == pytest.approx(tp["per_s_steady"] / 2)
    assert tp["breakdown_s"]["evaluation"] > 0 and tp["breakdown_s"]["checkpoint"] > 0
    assert t["cost_usd"] == pytest.approx(t["device_hours"] * 2.0) and t["peak_memory_bytes"] > 0
    assert r["trainer"] == "forecast" and r["model"]["parameters"] > 0 and r["data"]["synthetic"] is True
    assert r["run"]["git_commit"] and r["run"]["versions"]["torch"]
    for split in ("val", "test"):
        e = r["evaluation"][split]
        assert {"mse", "directional_accuracy", "ic", "rank_ic", "long_short", "long_only", "decile_returns"} <= set(e["model"])
        assert set(e["baselines"]) == {"always_up", "persistence", "zero_return", "train_mean", "ridge", "lightgbm",
                                       "ensemble"}
        assert set(e["model_minus_rank_ic"]) == {"persistence", "ridge", "lightgbm", "ensemble"}
        for name in ("persistence", "ridge", "lightgbm", "ensemble"):
            b = e["baselines"][name]
            assert "skipped" in b or {"ic", "rank_ic", "long_short", "long_only"} <= set(b), name
        assert e["baselines"]["always_up"]["directional_accuracy"] == e["up_rate"]
        assert e["rows"] == r["data"]["samples"][split]
        assert e["verdict"] in ("skill", "no skill detected") and e["equal_weight"]["periods"] > 0
    assert r["evaluation"]["checkpoint_step"] is not None and r["evaluation"]["cost_bps"] == 10
    assert r["evaluation"]["baselines_fitted"]["ridge"]["alpha"] > 0
    log = (reference_run / "training.log").read_text()
    assert f"test: {r['evaluation']['test']['verdict'].upper()}" in log
    report = (reference_run / "report.md").read_text()
    assert "SYNTHETIC" in report and "| ridge |" in report and "| ensemble |" in report and "](equity.png)" in report
    assert "the exported model is the Transformer alone" in report
    for picture in ("loss.png", "ic.png", "equity.png", "deciles.png"):
        assert (reference_run / picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", picture
    logged = [m for m in read_metrics(reference_run) if m["kind"] == "train"]
    assert {"loss", "lr", "samples_per_s", "step_time_s", "peak_memory_bytes"} <= set(logged[0])
    assert list((reference_run / "tensorboard").glob("events.out.tfevents.*"))
    assert "val loss" in (reference_run / "training.log").read_text()


def test_export_and_package_give_a_tarball_sha256sum_accepts(reference_run, tmp_path):
    run_cli(["forecast", "export", "--run-dir", str(reference_run), "--latency-iters", "5"], check=True)
    r = read_results(reference_run)
    parity = r["export"]["parity"]
    assert parity["max_abs_error"] < 1e-4 and 2 not in parity["batch_sizes"]
    assert {"batch_1", "batch_256"} <= set(r["export"]["latency_cpu"])
    proc = run_cli(["package", "--run-dir", str(reference_run), "--output", str(tmp_path / "out.tar.gz")], check=True)
    info = json.loads(proc.stdout)
    assert os.stat(info["path"]).st_mode & 0o044 == 0o044  # readable by whoever downloads it, not 0600
    with tarfile.open(info["path"]) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    root = tmp_path / "x" / reference_run.name
    check = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=root, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    names = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert {"model.onnx", "results.json", "config.json", "training.log", "metrics.jsonl", "SHA256SUMS", "report.md",
            "loss.png", "ic.png", "equity.png", "deciles.png"} <= names
    assert any(n.startswith("checkpoints/model_") for n in names) and any(n.startswith("tensorboard/") for n in names)
    # the packed ONNX runs on its own
    import onnxruntime as ort

    session = ort.InferenceSession(str(root / "model.onnx"))
    assert [o.name for o in session.get_outputs()] == ["rank_score"] == [r["export"]["output"]["name"]]
    out = session.run(None, {"features": np.zeros((5, 32, 5), np.float32)})[0]
    assert out.shape == (5,)


def test_evaluate_reprices_the_portfolios_with_other_costs_and_sizes(reference_run, tmp_path):
    import shutil

    from trainers.forecast.evaluate import evaluate_run

    run = tmp_path / "copy"
    shutil.copytree(reference_run, run)
    before = read_results(run)["evaluation"]["test"]["model"]["long_short"]
    free = evaluate_run(str(run), device="cpu", top_k=2, cost_bps=0)["test"]["model"]["long_short"]
    assert free["ann_return"] == pytest.approx(free["ann_return_gross"])  # no costs: net is gross
    assert before["ann_return"] < before["ann_return_gross"] and free["turnover"] != before["turnover"]
    r = read_results(run)
    assert r["evaluation"]["cost_bps"] == 0 and r["evaluation"]["top_k"] == 2 and "| model |" in (run / "report.md").read_text()


def test_package_refuses_to_vouch_for_corrupt_bytes(reference_run, tmp_path):
    """A byte-flipped best checkpoint or a junk-appended model.onnx is never packed (sha256sum -c would say OK)."""
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(reference_run, run)
    if not (run / "model.onnx").exists():
        run_cli(["forecast", "export", "--run-dir", str(run), "--latency-iters", "2"], check=True)
    best = read_results(run)["evaluation"]["checkpoint_step"]
    model = run / "checkpoints" / f"model_{best:08d}.pt"
    good = model.read_bytes()
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF
    model.write_bytes(bytes(bad))
    proc = run_cli(["package", "--run-dir", str(run), "--output", str(tmp_path / "a.tar.gz")])
    assert proc.returncode == 1 and f"model_{best:08d}.pt fails its SHA-256 check" in proc.stderr
    model.write_bytes(good)
    with open(run / "model.onnx", "ab") as f:
        f.write(b"junk")
    proc = run_cli(["package", "--run-dir", str(run), "--output", str(tmp_path / "b.tar.gz")])
    assert proc.returncode == 1 and "not the file its export checked" in proc.stderr
    assert not list(tmp_path.glob("*.tar.gz"))


def test_package_refuses_an_edited_results_file_unless_told_and_then_says_so(reference_run, tmp_path):
    """results.json edited after training was packed with exit 0, its checksum listed (issue 34): the tarball
    vouched for numbers the run never produced. The run records each result file's hash (written.json);
    package refuses one that differs, in one line naming it, unless --allow-edited, which EDITED.json lists."""
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(reference_run, run)
    if not (run / "model.onnx").exists():
        run_cli(["forecast", "export", "--run-dir", str(run), "--latency-iters", "2"], check=True)
    recorded = json.loads((run / "written.json").read_text())["files"]
    assert {"results.json", "report.md", "export.json", "loss.png", "equity.png"} <= set(recorded)
    results = json.loads((run / "results.json").read_text())
    results["evaluation"]["test"]["model"]["rank_ic"]["mean"] = 0.99  # a better number than the run's
    (run / "results.json").write_text(json.dumps(results))
    refused = run_cli(["package", "--run-dir", str(run), "--output", str(tmp_path / "a.tar.gz")])
    lines = refused.stderr.strip().splitlines()
    assert refused.returncode == 1 and len(lines) == 1 and "will not pack results.json" in lines[0], refused.stderr
    assert not (tmp_path / "a.tar.gz").exists()
    packed = run_cli(["package", "--run-dir", str(run), "--output", str(tmp_path / "b.tar.gz"), "--allow-edited"],
                     check=True)
    assert json.loads(packed.stdout)["edited_after_the_run"] == ["results.json"]
    with tarfile.open(tmp_path / "b.tar.gz") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    root = tmp_path / "x" / run.name
    assert json.loads((root / "EDITED.json").read_text())["edited_after_the_run"] == ["results.json"]
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=root, capture_output=True).returncode == 0
    run_cli(["forecast", "evaluate", "--run-dir", str(run), "--device", "cpu"], check=True)  # rewritten by the kit
    run_cli(["package", "--run-dir", str(run), "--output", str(tmp_path / "c.tar.gz")], check=True)


def test_external_sigterm_then_corrupt_newest_then_budget_stop(tmp_path):
    """SIGTERM from outside (what a pod stop sends) -> clean exit with a checkpoint; the newest checkpoint
    is corrupted -> the next start falls back to the previous; --max-hours tiny -> stops with results."""
    run_dir = tmp_path / "ext"
    args = ["forecast", "train", *TINY_DATA, "--epochs", "500", "--ckpt-every", "3", "--batch-size", "64",
            "--run-dir", str(run_dir)]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop("TRAINERS_FAULT", None)
    proc = subprocess.Popen([sys.executable, "-m", "trainers", *args], stderr=subprocess.PIPE, text=True, env=env)
    ckpts = run_dir / "checkpoints"
    wait_for(lambda: ckpts.is_dir() and len(list(ckpts.glob("meta_*.json"))) >= 2, 120, proc)
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


def test_the_report_keeps_its_tables_when_the_pictures_cannot_be_drawn(reference_run, tmp_path, monkeypatch):
    """A matplotlib that is missing, or installed but broken (a missing libfreetype), must not cost a
    finished run its report: the tables are written with a one-line note."""
    from trainers.forecast import report

    results = read_results(reference_run)
    rank_ic = f"{results['evaluation']['test']['model']['rank_ic']['mean']:+.4f}"

    def broken(*_args):
        raise OSError("libfreetype.so.6: cannot open shared object file")

    monkeypatch.setattr(report, "draw", broken)
    heard = []
    log = logging.getLogger("test-report")
    monkeypatch.setattr(log, "warning", lambda fmt, *args: heard.append(fmt % args))
    report.write_report(tmp_path, results, series={}, log=log)
    assert heard and "libfreetype" in heard[0]  # the run's log says why, not a logger no file hears
    text = (tmp_path / "report.md").read_text()
    assert "No pictures: drawing them failed (OSError: libfreetype.so.6" in text and rank_ic in text
    monkeypatch.setattr(report.importlib.util, "find_spec", lambda name: None)
    report.write_report(tmp_path, results, series={})
    assert "matplotlib is not installed" in (tmp_path / "report.md").read_text()


def test_a_package_pairing_a_model_with_another_checkpoints_numbers_is_flagged():
    from trainers.ops.package import step_mismatch

    assert step_mismatch({"export": {"checkpoint_step": 128}, "evaluation": {"checkpoint_step": 128}}) is None
    assert step_mismatch({"export": {"checkpoint_step": 128}, "evaluation": {"skipped": "SIGTERM"}}) is None
    why = step_mismatch({"export": {"checkpoint_step": 128}, "evaluation": {"checkpoint_step": 96}})
    assert "step 128" in why and "step 96" in why and "--checkpoint 96" in why
