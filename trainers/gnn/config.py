"""The coloring GNN's options: one dataclass, the command line, config.json and every checkpoint."""

from __future__ import annotations

from dataclasses import dataclass

from trainers.errors import UsageError
from trainers.runtime.config import option
from trainers.runtime.options import RunOptions

N_DEGREE_FEATURES = 2  # log degree and relative degree (trainers.gnn.features)


@dataclass
class GnnConfig(RunOptions):
    run_dir: str = option("runs/gnn", "run folder (resumed if it holds a run)")
    data_dir: str = option("data/graphs", "graph dataset written by `trainers gnn data`", resume_safe=True)
    hidden: int = option(64, "hidden width")
    layers: int = option(4, "message-passing layers")
    max_colors: int = option(16, "most colors the model can offer (per graph: the greedy bound, capped)")
    random_features: int = option(8, "random node features that break symmetry")
    dropout: float = option(0.0, "dropout on the residual branches")
    epochs: int = option(20, "passes over the training graphs")
    graphs_per_batch: int = option(16, "graphs per rank per step (one block-diagonal batch)")
    lr: float = option(3e-3, "AdamW learning rate")
    weight_decay: float = option(0.0, "AdamW weight decay")
    grad_clip: float = option(1.0, "clip the gradient norm (0: off)")
    seed: int = option(0, "seed of init, shuffling and random features")
    patience: int = option(5, "early stop after this many epochs without validation improvement (0: off)",
                           resume_safe=True)

    def validate(self) -> None:
        self.validate_run_options()
        for name in ("hidden", "layers", "epochs", "graphs_per_batch"):
            if getattr(self, name) < 1:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)} must be >= 1")
        if self.max_colors < 2:
            raise UsageError(f"--max-colors {self.max_colors} must be >= 2")
        if self.random_features < 0 or self.lr <= 0 or not 0 <= self.dropout < 1:
            raise UsageError("--random-features must be >= 0, --lr > 0 and --dropout in [0, 1)")

    @property
    def in_dim(self) -> int:
        return N_DEGREE_FEATURES + self.random_features
