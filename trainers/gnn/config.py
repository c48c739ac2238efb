"""The coloring GNN's options: one dataclass, the command line, config.json and every checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

from trainers.runtime.config import option
from trainers.runtime.options import RunOptions

N_DEGREE_FEATURES = 2  # log degree and relative degree (trainers.gnn.features)
# `trainers gnn data`: the generators draw from all n(n-1)/2 node pairs at once (several arrays of that
# length): 20,000 nodes is about 200M pairs, a few GB; --max-nodes 10**20 failed inside NumPy.
MAX_GENERATED_NODES = 20_000


@dataclass
class GnnConfig(RunOptions):
    run_dir: str = option("runs/gnn", "run folder (resumed if it holds a run)", resume_safe=True)
    data_dir: str = option("data/graphs", "graph dataset written by `trainers gnn data`", resume_safe=True)
    hidden: int = option(64, "hidden width", min=1)
    # ceilings: 100,000 layers hung the start, 100,000 colours asked 6 GiB of the plan's sample and were killed
    layers: int = option(4, "message-passing layers", min=1, max=64)
    max_colors: int = option(16, "most colors the model can offer (per graph: the greedy bound, capped)", min=2,
                             max=1024)
    random_features: int = option(8, "random node features that break symmetry", min=0)
    fewer_colors: float = option(0.0, "training offers each graph its greedy bound minus a uniform share of it below "
                                      "this (0: the bound; 0.35: down to 0.65 of it)", min=0, lt=1)
    dropout: float = option(0.0, "dropout on the residual branches", min=0, lt=1)
    epochs: int = option(20, "passes over the training graphs", min=1)
    nodes_per_batch: int | None = option(None, "nodes per rank per step: whole graphs, about this many nodes in all "
                                               "(each graph once per epoch across ranks; default: 4096 on a CPU, on "
                                               "a GPU up to 65536 as its memory and 16 steps an epoch allow: "
                                               "gnn/size.py)", min=1)
    compile: bool | None = option(None, "torch.compile the model for the train step, every batch padded to the "
                                        "run's largest step (one compile a run, never one per batch); default: on "
                                        "with CUDA when the steps left are enough for the compile to pay for itself "
                                        "(about 10,000, measured on an H200: gnn/size.py), else eager; off on CPU",
                                  resume_safe=True)
    lr: float = option(3e-3, "AdamW learning rate", gt=0)
    weight_decay: float = option(0.0, "AdamW weight decay", min=0)
    grad_clip: float = option(1.0, "clip the gradient norm (0: off)", min=0)
    seed: int = option(0, "seed of init, shuffling and random features", min=0)
    search_iters: int = option(20_000, "final evaluation: tabu-search iterations per graph (0: no search)",
                               resume_safe=True, min=0)
    search_seconds: float = option(2.0, "final evaluation: tabu-search seconds per graph at most", resume_safe=True,
                                   gt=0)
    patience: int = option(5, "early stop after this many epochs without validation improvement (0: off)",
                           resume_safe=True, min=0)

    def validate(self) -> None:
        self.validate_run_options()  # every field's type, range and choices

    @property
    def in_dim(self) -> int:
        return N_DEGREE_FEATURES + self.random_features
