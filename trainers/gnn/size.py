"""The colouring GNN for the planner. Items are nodes (a step gathers whole graphs up to
--nodes-per-batch nodes per rank). Counted on the real model on the CPU (it is small), over graphs
drawn by the same generator `trainers gnn data` uses; the dataset's own counts are read when
--data-dir already holds one."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable
from pathlib import Path

from trainers.gnn.config import GnnConfig
from trainers.gnn.sampling import epoch_steps
from trainers.ops.plan import PLAN_GPU_MEMORY, Workload, forward_flops, saved_bytes

SAMPLE_GRAPHS = 96  # drawn from the generator to measure bytes and FLOPs per node
DEPLOY_GRAPHS, DEPLOY_MIN_NODES, DEPLOY_MAX_NODES = 20_000, 20, 300  # what `deploy_8gpu.sh --trainer gnn` generates
SMALL_STEP_S = 0.004  # an eager step of a small message-passing model on a GPU: launches, not FLOPs (assumed)
CPU_NODES = 4096  # the CPU default (and the least a GPU gets)
MAX_AUTO_NODES = 65536  # a GPU's default at most: 10x fewer aten ops per graph in the training loop than 4,096
# (bench/results/gnn_ops_65536_cpu.json); also fewer optimizer steps an epoch, hence MIN_STEPS_PER_EPOCH
MIN_STEPS_PER_EPOCH = 16  # a GPU's default never leaves an epoch fewer steps than this (a small dataset)
ACTIVATION_MEMORY_SHARE = 0.25  # of a GPU's memory, for a step's saved activations
DEVICE_BYTES_PER_NODE, DEVICE_BYTES_PER_EDGE = 2 * 4 + 8, 2 * 2 * 4  # degree features + offsets; both directions
# Whether a compile pays for itself (bench/results/gpu_h200/: the job at 65,536 nodes a step, 108 steps,
# eager and compiled on one H200, one run each): the compiled run's first window took 16.73 s, the eager one's 0.80 s,
# and a steady step took 5.70 ms compiled against 7.28 ms eager (98 steps each). So about 10,000 steps before the
# compile is paid back; the deploy's default job (20 epochs of its 20,000 graphs) is about 1,000. Thin: one GPU,
# one step size, one pair of runs, and the same compiled job ran 7.14 and 8.26 ms a step on two other H200s
# (bench/results/gpu_h200/run_gnn_gpu.runs.json, runs 2 and 3: 44 steady steps each): there it would pay only after
# far more steps. Eager for the default job holds either way; a run near the break-even loses at most the compile.
EAGER_STEP_S, COMPILED_STEP_S = 0.7133 / 98, 0.5586 / 98  # the steady steps' seconds / their count
COMPILE_S = 16.7345 - 0.8017  # the first windows, compiled less eager
COMPILE_PAYS_AFTER_STEPS = math.ceil(COMPILE_S / (EAGER_STEP_S - COMPILED_STEP_S))
COMPILE_EAGER_STEP_RATIO = EAGER_STEP_S / COMPILED_STEP_S


def compiles(setting: bool | None, gpu_like: bool, steps: int) -> tuple[bool, str]:
    """Whether the run compiles its training step, and why (the log's and results.json's words): --compile or
    --no-compile as given; by default on a GPU (or rehearsing one: --gpu-defaults) when the steps left to train
    are enough for the compile to pay for itself, else eager. (The steps left are at most: early stopping or a
    budget may end the run sooner.)"""
    if setting is not None:
        return setting, f"{'--compile' if setting else '--no-compile'} given"
    if not gpu_like:
        return False, "eager: the CPU default"
    if steps >= COMPILE_PAYS_AFTER_STEPS:
        return True, (f"compiled: {steps:,} steps to train, at least the {COMPILE_PAYS_AFTER_STEPS:,} after which a "
                      f"compile pays for itself (measured on an H200)")
    return False, (f"eager: {steps:,} steps to train, fewer than the {COMPILE_PAYS_AFTER_STEPS:,} after which a "
                   f"compile ({COMPILE_S:.0f} s on an H200) pays for itself; --compile to compile anyway")


def dataset_counts(cfg: GnnConfig) -> tuple[int, int, int, str]:
    """(graphs, nodes, undirected edges) of the training split, and where they came from: the dataset in --data-dir,
    else (the deploy's plan runs before its data phase) the graphs the deploy generates (assumed_counts)."""
    meta = Path(cfg.data_dir) / "metadata.json"
    try:
        train = json.loads(meta.read_text())["splits"]["train"]
        return int(train["graphs"]), int(train["nodes"]), int(train["edges"]), f"the dataset in {cfg.data_dir}"
    except (OSError, ValueError, KeyError, TypeError):
        return (*assumed_counts(cfg.seed), f"ASSUMED: the deploy's {DEPLOY_GRAPHS:,} generated graphs of "
                f"{DEPLOY_MIN_NODES}-{DEPLOY_MAX_NODES} nodes (no dataset in {cfg.data_dir} yet)")


def sample_graphs(seed: int) -> list:
    """The plan's SAMPLE_GRAPHS graphs, drawn as the deploy's generator draws them."""
    from trainers.gnn.graphs import random_graph

    return [random_graph(i, seed, DEPLOY_MIN_NODES, DEPLOY_MAX_NODES) for i in range(SAMPLE_GRAPHS)]


@functools.cache
def assumed_counts(seed: int) -> tuple[int, int, int]:
    """(graphs, nodes, undirected edges) of the training split the deploy generates: DEPLOY_GRAPHS graphs at the
    mean of the plan's sample graphs."""
    sample = sample_graphs(seed)
    return (DEPLOY_GRAPHS, int(DEPLOY_GRAPHS * sum(g.n for g in sample) / SAMPLE_GRAPHS),
            int(DEPLOY_GRAPHS * sum(g.n_edges for g in sample) / SAMPLE_GRAPHS))


def _sample(cfg: GnnConfig) -> tuple[list, Callable[[int], tuple]]:
    """The sample graphs and the model's inputs for the first b of them (on the CPU)."""
    import torch

    from trainers.gnn.batch import make_batch

    sample = sample_graphs(cfg.seed)

    def inputs(b: int) -> tuple:
        batch = make_batch(sample[:b], cfg.max_colors, cfg.random_features, list(range(b)), torch.device("cpu"))
        return batch.x, batch.edge_index, batch.color_mask
    return sample, inputs


def _flops_per_node(model, sample: list, inputs: Callable[[int], tuple]) -> float:
    """A training step's matmul FLOPs per node (forward and backward: 3 forwards) over the sample graphs."""
    return 3 * forward_flops(model, inputs(SAMPLE_GRAPHS)) / sum(g.n for g in sample)


def flops_per_node(cfg: GnnConfig) -> float:
    """What `_flops_per_node` counts, for a run: a CPU copy of the model, the global RNG untouched."""
    import torch

    from trainers.gnn.build import build_model

    with torch.random.fork_rng(devices=[]):
        sample, inputs = _sample(cfg)
        return _flops_per_node(build_model(cfg).train(), sample, inputs)


def _loss_inputs(cfg: GnnConfig, graphs: list, twice: bool = False) -> tuple:
    """A batch of `graphs` as `_loss_module` takes it; `twice`: every edge listed twice (the nodes alike)."""
    import torch

    from trainers.gnn.batch import make_batch

    b = make_batch(graphs, cfg.max_colors, cfg.random_features, list(range(len(graphs))), torch.device("cpu"))
    k = 2 if twice else 1
    return b.x, b.edge_index.repeat(1, k), b.color_mask, b.edge_graph.repeat(k), b.edges_per_graph * k


def _loss_module(model):
    """The training step's forward as one module (model and Potts loss), for `saved_bytes`."""
    import torch

    from trainers.gnn.batch import GraphBatch, potts_loss

    class Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, x, edge_index, color_mask, edge_graph, edges_per_graph):
            batch = GraphBatch(x, edge_index, color_mask, edge_graph, edges_per_graph, len(edges_per_graph))
            return potts_loss(self.model, batch, 1.0)[0]
    return Loss()


def _measured(cfg: GnnConfig) -> tuple[float, float, float, int, list]:
    """(saved bytes per node, per directed edge, FLOPs per node, parameters, the sample graphs): the real model and
    its loss on the CPU. Autograd's saves grow with the edges too (the loss keeps both ends' colour probabilities
    of every edge): the same graphs with each edge listed twice give an edge's bytes, then the sample's graphs 32
    to 96 a node's. Counted per node alone, on the deploy's sparse graphs and without the loss, a dense dataset's
    step saved 17x what the plan and a GPU's auto-size said."""
    from trainers.gnn.build import build_model

    sample, inputs = _sample(cfg)
    model = build_model(cfg).train()
    step = _loss_module(model)
    few, rest, every = (_loss_inputs(cfg, g) for g in (sample[:32], sample[32:], sample))
    per_edge = (saved_bytes(step, _loss_inputs(cfg, sample[32:], twice=True)) - saved_bytes(step, rest)) \
        / rest[1].shape[1]
    grown = saved_bytes(step, every) - saved_bytes(step, few)
    per_node = (grown - per_edge * rest[1].shape[1]) / sum(g.n for g in sample[32:])
    return per_node, per_edge, _flops_per_node(model, sample, inputs), sum(p.numel() for p in model.parameters()), \
        sample


def bytes_per_node(cfg: GnnConfig, per_node: float, per_edge: float) -> float:
    """A step's saved bytes per node on this run's graphs: its nodes' and their directed edges' (the dataset's
    edges a node, else the deploy's graphs')."""
    _graphs, nodes, edges, _source = dataset_counts(cfg)
    return per_node + per_edge * 2 * edges / max(nodes, 1)


SIZES = ("nodes_per_batch",)  # decided by the device when left out (a resume keeps the folder's)


def nodes_per_step(cfg: GnnConfig, memory_bytes: int | None, world_size: int, per_node: float | None = None) -> int:
    """--nodes-per-batch: the user's (or the run folder's, SIZES), else CPU_NODES on a CPU (`memory_bytes` None) and on a GPU the largest
    power of two that ACTIVATION_MEMORY_SHARE of its memory holds, at most MAX_AUTO_NODES and at most what
    leaves the dataset's epoch MIN_STEPS_PER_EPOCH steps, never below CPU_NODES."""
    if cfg.nodes_per_batch is not None:
        return cfg.nodes_per_batch
    if not memory_bytes:
        return CPU_NODES
    # the training split's nodes; with no dataset yet (the deploy's plan runs before its data phase) the graphs the
    # deploy generates, as the plan counts them: it sized 8 H200s' steps at 65,536 nodes, the run then at 16,384
    nodes = dataset_counts(cfg)[1]
    most = min(MAX_AUTO_NODES, nodes // (world_size * MIN_STEPS_PER_EPOCH))
    per_node = bytes_per_node(cfg, *_measured(cfg)[:2]) if per_node is None else per_node
    most = min(most, int(memory_bytes * ACTIVATION_MEMORY_SHARE // max(per_node, 1.0)))
    return max(CPU_NODES, 1 << (max(most, 1).bit_length() - 1))


def workload(cfg: GnnConfig, memory_bytes: int = PLAN_GPU_MEMORY, world_size: int = 1,
             measured: tuple | None = None) -> Workload:
    """The run of these options on GPUs of `memory_bytes` (one 80 GB card until the plan names its GPU:
    Workload.for_device sizes the step again for it and its ranks, as the run would)."""
    measured = measured or _measured(cfg)
    per_node_alone, per_edge, flops_per_node, parameters, sample = measured
    per_node = bytes_per_node(cfg, per_node_alone, per_edge)  # (with its edges)
    nodes_per_batch = nodes_per_step(cfg, memory_bytes, world_size, per_node)

    graphs, nodes, edges, source = dataset_counts(cfg)
    on_device = nodes * DEVICE_BYTES_PER_NODE + edges * DEVICE_BYTES_PER_EDGE  # the split lives on the GPU

    def planned_compile(steps: float) -> tuple[bool, str]:  # as the run decides on a GPU, on the plan's steps
        compiled, why = compiles(cfg.compile, True, round(steps))
        return compiled, why if compiled else (f"{why}; the steps at the compiled step's measured rate (an eager "
                                               f"step took {COMPILE_EAGER_STEP_RATIO:.2f}x as long on an H200)")

    return Workload(
        trainer="gnn", parameters=parameters, n_blocks=1, block_parameters=parameters, unit="nodes",
        items_per_micro=nodes_per_batch, grad_accum=1, flops_per_item=flops_per_node,
        activation_bytes=lambda micro, _ck: int(per_node * micro), kind="small", strategies=("ddp",),
        items_total=float(nodes * cfg.epochs), extra_bytes=on_device, min_step_s=SMALL_STEP_S,
        steps_total=float(cfg.epochs * epoch_steps(graphs, nodes, world_size, nodes_per_batch)),  # (as the run)
        compiles=planned_compile, compile_s=COMPILE_S,
        for_device=lambda memory, ranks, _items=None: workload(cfg, memory, ranks, measured),
        shape={"hidden": cfg.hidden, "layers": cfg.layers, "max_colors": cfg.max_colors, "nodes_per_step": nodes_per_batch},
        notes=[f"{graphs:,} training graphs, {nodes:,} nodes, {edges:,} edges ({source}); {cfg.epochs} epochs; "
               f"the final evaluation's tabu search runs on the CPU and is not counted"])
