"""A toy trainer on the run boundary, for tests of what every trainer gets from it (in-process, fast)."""

from __future__ import annotations

import os
import random
import signal
import time
from dataclasses import dataclass

import numpy as np
import torch

from trainers.runtime.config import option
from trainers.runtime.options import RunOptions
from trainers.runtime.run import Run, RunSpec
from trainers.runtime.rundir import single_process_context
from trainers.runtime.stops import StopReason


@dataclass
class ToyConfig(RunOptions):
    run_dir: str = option("runs/toy", "run folder")
    seed: int = option(0, "seed")


def toy_loop(cfg: ToyConfig, total_steps: int, signal_at: int | None = None, evaluate=None, summary=None,
             draws: list | None = None, data_fingerprint: str | None = None, eval_seconds: float = 0.0,
             epoch_steps: int = 3, nan_at: int | None = None, val_nan_at: int | None = None, val_metric=None):
    """A minimal trainer: a linear model, SGD, a 'position' that counts samples. `nan_at`: the loss
    of that step is NaN (the weights follow); `val_metric(step)`: the validation value (else the loss)."""
    ctx = single_process_context()
    torch.manual_seed(cfg.seed)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with Run(cfg, ctx, RunSpec("toy", {"model": model, "optimizer": opt}, total_steps,
                               data_fingerprint=data_fingerprint)) as run:
        start = run.resume()
        seen = (start.position or {"seen": 0})["seen"]
        step = start.step
        if draws is not None:
            draws.append(("start", torch.rand(1).item(), np.random.rand(), random.random()))
        while step < total_steps and not start.ended:
            x = torch.randn(4, 3)
            loss = model(x).pow(2).mean() * (float("nan") if step + 1 == nan_at else 1.0)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            seen += 4
            if step == signal_at:
                os.kill(os.getpid(), signal.SIGTERM)
            if run.should_log(step):
                run.log_train(step, {"loss": float(loss.detach())})
            if run.should_eval(step, end_of_epoch=step % epoch_steps == 0):
                with run.timing("evaluation"):
                    time.sleep(eval_seconds)
                    value = float(loss.detach()) if val_metric is None else val_metric(step)
                    run.evaluated(step, float("nan") if step == val_nan_at else value)
            reason = run.step_done(step, {"seen": seen}, items=4, loss=loss.detach())
            if reason != StopReason.NONE:
                if draws is not None:
                    draws.append(("stop", torch.rand(1).item(), np.random.rand(), random.random()))
                break
        return run.finish(summary or {"model": {"parameters": 4}}, evaluate=evaluate), model


def cfg_for(tmp_path, **kw) -> ToyConfig:
    return ToyConfig(run_dir=str(tmp_path / "run"), log_every=1, **kw)
