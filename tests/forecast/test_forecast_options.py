"""Options that change training behaviour, each shown to do what it says."""

import math

import pytest
import torch

from conftest import TINY_DATA, read_metrics, read_results, run_cli
from trainers.forecast.train import optimizer_step
from trainers.runtime.precision import make_grad_scaler, resolve_precision
from trainers.runtime.schedule import warmup_cosine

BASE = ["forecast", "train", *TINY_DATA, "--dropout", "0", "--log-every", "1"]


def test_warmup_then_cosine_to_the_floor():
    assert warmup_cosine(0, 100, 10, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(9, 100, 10, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(10, 100, 10, 0.1) == pytest.approx(1.0)
    assert warmup_cosine(55, 100, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert warmup_cosine(100, 100, 10, 0.1) == pytest.approx(0.1)
    assert warmup_cosine(5, 100, 0, 0.2) < 1.0 and warmup_cosine(0, 100, 0, 0.2) == pytest.approx(1.0)


def test_grad_clip_bounds_the_gradient_norm(monkeypatch):
    seen = []
    real = torch.nn.utils.clip_grad_norm_

    def spy(params, max_norm):
        params = list(params)
        seen.append(max_norm)
        real(params, max_norm)
        seen.append(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])).item())

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", spy)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = make_grad_scaler(torch.device("cpu"), resolve_precision("auto", "cpu", None))
    (model(torch.full((8, 4), 100.0)).sum() * 1000).backward()
    optimizer_step(model, opt, scaler, grad_clip=0.5)
    assert seen[0] == 0.5 and seen[1] == pytest.approx(0.5, rel=1e-4)
    (model(torch.ones(2, 4)).sum()).backward()
    optimizer_step(model, opt, scaler, grad_clip=0.0)
    assert len(seen) == 2  # 0 turns clipping off


@pytest.mark.slow
def test_grad_accum_gives_the_gradient_of_the_whole_batch(tmp_path):
    """batch 64 x 2 micro-batches trains exactly like batch 128 in one: same samples, same mean."""
    a = tmp_path / "a"
    b = tmp_path / "b"
    run_cli([*BASE, "--run-dir", str(a), "--batch-size", "128", "--max-steps", "4"], check=True)
    run_cli([*BASE, "--run-dir", str(b), "--batch-size", "64", "--grad-accum", "2", "--max-steps", "4"], check=True)
    la = [m["loss"] for m in read_metrics(a) if m["kind"] == "train"]
    lb = [m["loss"] for m in read_metrics(b) if m["kind"] == "train"]
    assert len(la) == 4 and la == pytest.approx(lb, rel=1e-5)
    lr = [m["lr"] for m in read_metrics(a) if m["kind"] == "train"]  # the default 1e-3, warming up
    assert lr == pytest.approx([1e-3 * warmup_cosine(s, 4, 50, 0.1) for s in range(1, 5)])
    assert read_results(a)["training"]["global_batch"] == read_results(b)["training"]["global_batch"] == 128


@pytest.mark.slow
def test_patience_stops_early_and_eval_every_sets_the_cadence(tmp_path):
    run_dir = tmp_path / "r"
    # min-delta so large nothing counts as an improvement: the 2nd evaluation without one stops training
    run_cli([*BASE, "--run-dir", str(run_dir), "--epochs", "50", "--eval-every", "5", "--patience", "2",
             "--min-delta", "1e9"], check=True)
    r = read_results(run_dir)
    assert r["training"]["stop_reason"] == "early_stop" and r["training"]["steps"] == 15
    val_steps = [m["step"] for m in read_metrics(run_dir) if m["kind"] == "val"]
    assert val_steps == [0, 5, 10, 15]  # the untrained model, then every 5 steps
