"""`trainers ppo export`: the chosen agent's deterministic policy (observation normalisers, the
cascaded LSTM, tanh of the Gaussian mean) to ONNX with a dynamic batch axis, checked by onnxruntime
at batch sizes the export never saw (1, 5, 64; traced at 2), with CPU latency p50/p99.

Inputs: `market` [batch, window, stocks, features] (the z-scored features of trainers.ppo.features,
statistics in export.json) and `portfolio` [batch, stocks + 1] (value weights of each stock and of
cash). Output: `action` [batch, stocks] in [-1, 1] (trades: times h_max shares; weights: see env.py).
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from trainers.errors import UsageError
from trainers.onnx import check_parity, check_tolerance, export_program, measure_latency, opset
from trainers.ppo.build import AgentSet, best_main_agent, chosen
from trainers.ppo.config import PpoConfig
from trainers.ppo.features import FEATURES
from trainers.ppo.model import NormalisedPolicy
from trainers.runtime.files import sha256_file
from trainers.runtime.results import merge_results, read_results
from trainers.runtime.rundir import exclusive, load_checkpoint_states, load_run_config
from trainers.runtime.written import write_result_json

EXPORT_BATCH = 2
CHECK_BATCHES = (1, 5, 64)
INPUTS = ["market", "portfolio"]


def cases(window: int, n_stocks: int, batches, seed: int = 0) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for b in batches:
        weights = torch.rand((b, n_stocks + 1), generator=g)
        out[f"batch_{b}"] = (torch.randn((b, window, n_stocks, len(FEATURES)), generator=g),
                             weights / weights.sum(-1, keepdim=True))
    return out


def preprocessing_from_data(run_dir: Path, cfg: PpoConfig) -> dict:
    """The features' statistics and tickers the model's `market` input is scaled with, for a run that ended before
    its results.json (killed, or stopped before `finish`): the run's data read again and checked against its
    record, as `evaluate` does. Without them the export was written with nulls there and no way to feed it."""
    from trainers.ppo.data import load_checked_data

    data, _ = load_checked_data(cfg, run_dir, "its export needs the data it trained on, for the features' statistics")
    return data.describe()


def export_run(run_dir: Path, checkpoint: str = "latest", tolerance: float = 1e-4, latency_iters: int = 50) -> dict:
    check_tolerance(tolerance)
    if latency_iters < 1:
        raise UsageError(f"--latency-iters {latency_iters} must be >= 1")

    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, PpoConfig)
    with exclusive(run_dir):  # not while training (or another command) writes into the folder
        step, states = load_checkpoint_states(run_dir, checkpoint)
        n_stocks = states["agents"]["agents"][0]["policy"]["net.log_std"].shape[0]
        agents = AgentSet(cfg, n_stocks, torch.device("cpu"))
        agents.load_state_dict(states["agents"])
        agent = best_main_agent(agents, cfg)
        policy, norms, update, val_score = chosen(agent)
        norms = norms if norms is not None else torch.nn.ModuleList([torch.nn.Identity(), torch.nn.Identity()])
        module = NormalisedPolicy(norms, policy).eval()
        path = run_dir / "model.onnx"
        batch = torch.export.Dim("batch", min=1, max=1 << 20)
        t0 = time.perf_counter()
        export_program(module, cases(cfg.window, n_stocks, (EXPORT_BATCH,), seed=7)[f"batch_{EXPORT_BATCH}"], path,
                       input_names=INPUTS, output_names=["action"], dynamic_shapes={"inputs": ({0: batch}, {0: batch})})
        export_s = time.perf_counter() - t0
        parity = check_parity(module, path, cases(cfg.window, n_stocks, CHECK_BATCHES), INPUTS, tolerance)
        parity["batch_sizes"] = list(CHECK_BATCHES)
        latency = measure_latency(module, path, cases(cfg.window, n_stocks, (1, 256), seed=1), INPUTS, latency_iters)
        data = read_results(run_dir).get("data") or preprocessing_from_data(run_dir, cfg)
        info = {"path": path.name, "checkpoint_step": step, "agent": f"{agent.encoder}/seed{agent.seed}",
                "selected_update": update, "val_score": val_score, "select_by": cfg.select_by, "export_batch": EXPORT_BATCH, "export_s": export_s,
                "opset": opset(path), "bytes": path.stat().st_size, "sha256": sha256_file(path), "parity": parity,
                "latency_cpu": latency,
                "inputs": {"market": ["batch", cfg.window, n_stocks, len(FEATURES)], "portfolio": ["batch", n_stocks + 1]},
                "output": {"name": "action", "shape": ["batch", n_stocks], "range": [-1, 1], "action": cfg.action,
                           "h_max": cfg.h_max},
                "preprocessing": {"features": list(FEATURES), "feature_mean": data.get("feature_mean"),
                                  "feature_std": data.get("feature_std"), "tickers": data.get("tickers")}}
        write_result_json(run_dir / "export.json", info)
        merge_results(run_dir, {"export": info})
        return info
