"""`trainers gnn export`: ONNX with dynamic node and edge counts (traced on a 25-node graph),
checked by onnxruntime on graphs of 11, 47 and 64 nodes: the offered colors' logits and the
decoded colors must agree."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from trainers.gnn.batch import make_batch
from trainers.gnn.build import build_model
from trainers.gnn.config import GnnConfig
from trainers.gnn.graphs import mycielski, queen
from trainers.onnx import check_parity, check_tolerance, export_program
from trainers.runtime.files import sha256_file
from trainers.runtime.results import merge_results
from trainers.runtime.rundir import exclusive, load_checkpoint_states, load_run_config
from trainers.runtime.written import write_result_json

INPUTS = ["x", "edge_index", "color_mask"]


def _offered_error(expected: np.ndarray, got: np.ndarray, args: tuple) -> float:
    """Masked logits are a constant: compare the offered colors, and the decoded color of each node."""
    offered = args[2].numpy() > 0
    if not np.array_equal(got.argmax(-1), expected.argmax(-1)):
        return float("inf")
    return float(np.abs(got[offered] - expected[offered]).max())


def export_run(run_dir: Path, checkpoint: str = "best", tolerance: float = 1e-4) -> dict:
    check_tolerance(tolerance)
    run_dir = Path(run_dir)
    cfg = load_run_config(run_dir, GnnConfig)
    with exclusive(run_dir):
        return _export(run_dir, cfg, checkpoint, tolerance)


def _export(run_dir: Path, cfg: GnnConfig, checkpoint: str, tolerance: float) -> dict:
    step, states = load_checkpoint_states(run_dir, checkpoint)
    model = build_model(cfg)
    model.load_state_dict(states["model"])
    model.eval()
    cpu = torch.device("cpu")
    example = make_batch([queen(5)], cfg.max_colors, cfg.random_features, [0], cpu)
    nodes, edges = torch.export.Dim("nodes", min=2, max=1 << 24), torch.export.Dim("edges", min=2, max=1 << 28)
    path = run_dir / "model.onnx"
    export_program(model, (example.x, example.edge_index, example.color_mask), path, input_names=INPUTS,
                   output_names=["logits"],
                   dynamic_shapes={"x": {0: nodes}, "edge_index": {1: edges}, "color_mask": {0: nodes}})
    cases = {}
    for g in (mycielski(5), queen(8), mycielski(3)):  # 47, 64 and 11 nodes; the export saw 25
        b = make_batch([g], cfg.max_colors, cfg.random_features, [1], cpu)
        cases[g.name] = (b.x, b.edge_index, b.color_mask)
    parity = check_parity(model, path, cases, INPUTS, tolerance, error=_offered_error)
    info = {"path": path.name, "checkpoint_step": step, "export_nodes": 25, "checked": parity["per_case"],
            "max_abs_error": parity["max_abs_error"], "parity": parity, "bytes": path.stat().st_size,
            "sha256": sha256_file(path),
            "inputs": {"x": ["nodes", cfg.in_dim], "edge_index": [2, "edges (both directions)"],
                       "color_mask": ["nodes", cfg.max_colors]}, "random_features": cfg.random_features}
    write_result_json(run_dir / "export.json", info)
    merge_results(run_dir, {"export": info})
    return info
