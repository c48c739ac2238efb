"""States split across ranks (FSDP2), as objects the run boundary checkpoints with
torch.distributed.checkpoint: `Run(..., sharded_states={"model": ShardedModel(m),
"optimizer": ShardedOptimizer(m, opt)})`.

torch.distributed.checkpoint.state_dict gives both keys by parameter name (not the optimizer's
positional ids) with DTensor values, so each rank writes and reads only its own shards; a
checkpoint so written loads into the same model on the same world size (or, through DCP's
resharding, another one). Nothing here assumes a particular trainer.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)


class ShardedModel:
    def __init__(self, model: torch.nn.Module):
        self.model = model

    def state_dict(self) -> dict:
        return get_model_state_dict(self.model)

    def load_state_dict(self, state: dict) -> None:
        set_model_state_dict(self.model, state)


class ShardedOptimizer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        return get_optimizer_state_dict(self.model, self.optimizer)

    def load_state_dict(self, state: dict) -> None:
        set_optimizer_state_dict(self.model, self.optimizer, state)
