"""The colouring GNN for the planner. Items are nodes (a step gathers whole graphs up to
--nodes-per-batch nodes per rank). Counted on the real model on the CPU (it is small), over graphs
drawn by the same generator `trainers gnn data` uses; the dataset's own counts are read when
--data-dir already holds one."""

from __future__ import annotations

import json
from pathlib import Path

from trainers.gnn.config import GnnConfig
from trainers.ops.plan import Workload, forward_flops, saved_bytes_per_item

SAMPLE_GRAPHS = 96  # drawn from the generator to measure bytes and FLOPs per node
DEPLOY_GRAPHS, DEPLOY_MIN_NODES, DEPLOY_MAX_NODES = 20_000, 20, 300  # what `deploy_8gpu.sh --trainer gnn` generates
SMALL_STEP_S = 0.004  # an eager step of a small message-passing model on a GPU: launches, not FLOPs (assumed)
DEVICE_BYTES_PER_NODE, DEVICE_BYTES_PER_EDGE = 2 * 4 + 8, 2 * 2 * 4  # degree features + offsets; both directions


def dataset_counts(cfg: GnnConfig) -> tuple[int, int, int, str]:
    """(graphs, nodes, undirected edges) of the training split, and where they came from."""
    meta = Path(cfg.data_dir) / "metadata.json"
    try:
        train = json.loads(meta.read_text())["splits"]["train"]
        return int(train["graphs"]), int(train["nodes"]), int(train["edges"]), f"the dataset in {cfg.data_dir}"
    except (OSError, ValueError, KeyError, TypeError):
        return 0, 0, 0, ""


def workload(cfg: GnnConfig) -> Workload:
    import torch

    from trainers.gnn.batch import make_batch
    from trainers.gnn.build import build_model
    from trainers.gnn.graphs import random_graph

    sample = [random_graph(i, cfg.seed, DEPLOY_MIN_NODES, DEPLOY_MAX_NODES) for i in range(SAMPLE_GRAPHS)]
    model = build_model(cfg).train()

    def inputs(b: int) -> tuple:
        batch = make_batch(sample[:b], cfg.max_colors, cfg.random_features, list(range(b)), torch.device("cpu"))
        return batch.x, batch.edge_index, batch.color_mask

    # saved_bytes_per_item's slope runs between 32 and 96 graphs: per graph of that stretch, then per node
    per_graph = saved_bytes_per_item(model, inputs, batches=(32, SAMPLE_GRAPHS))
    per_node = per_graph * (SAMPLE_GRAPHS - 32) / sum(g.n for g in sample[32:])
    sample_nodes = sum(g.n for g in sample)
    flops_per_node = 3 * forward_flops(model, inputs(SAMPLE_GRAPHS)) / sample_nodes
    parameters = sum(p.numel() for p in model.parameters())

    graphs, nodes, edges, source = dataset_counts(cfg)
    if not graphs:
        mean_nodes = sample_nodes / SAMPLE_GRAPHS
        mean_edges = sum(g.n_edges for g in sample) / SAMPLE_GRAPHS
        graphs, nodes, edges = DEPLOY_GRAPHS, int(DEPLOY_GRAPHS * mean_nodes), int(DEPLOY_GRAPHS * mean_edges)
        source = (f"ASSUMED: the deploy's {DEPLOY_GRAPHS:,} generated graphs of {DEPLOY_MIN_NODES}-{DEPLOY_MAX_NODES} "
                  f"nodes (no dataset in {cfg.data_dir} yet)")
    on_device = nodes * DEVICE_BYTES_PER_NODE + edges * DEVICE_BYTES_PER_EDGE  # the split lives on the GPU
    return Workload(
        trainer="gnn", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="nodes",
        items_per_micro=cfg.nodes_per_batch, grad_accum=1, flops_per_item=flops_per_node,
        activation_bytes=lambda micro, _ck: int(per_node * micro), kind="small", strategies=("ddp",),
        items_total=float(nodes * cfg.epochs), extra_bytes=on_device, min_step_s=SMALL_STEP_S,
        shape={"hidden": cfg.hidden, "layers": cfg.layers, "max_colors": cfg.max_colors},
        notes=[f"{graphs:,} training graphs, {nodes:,} nodes, {edges:,} edges ({source}); {cfg.epochs} epochs; "
               f"the final evaluation's tabu search runs on the CPU and is not counted"])
