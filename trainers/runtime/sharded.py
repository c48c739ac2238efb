"""States split across ranks (FSDP2), as objects the run boundary checkpoints with
torch.distributed.checkpoint: `Run(cfg, ctx, RunSpec(..., sharded_states={"model":
ShardedModel(m), "optimizer": ShardedOptimizer(m, opt)}))`.

torch.distributed.checkpoint.state_dict gives both keys by parameter name (not the optimizer's
positional ids) with DTensor values, so each rank writes and reads only its own shards; a
checkpoint so written loads into the same model on the same world size (or, through DCP's
resharding, another one). Nothing here assumes a particular trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

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


def consolidate(manager, step: int, names: tuple[str, ...] = ("model",)) -> Path:
    """CheckpointManager.consolidate. One process, no process group needed: the named sharded states of
    checkpoint `step` as one torch file of full tensors (for export and sampling), its SHA-256 added to the
    meta. The shard files are checked first; an existing consolidated file that verifies is kept."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    from trainers.errors import UsageError
    from trainers.runtime.files import atomic_write, atomic_write_json, sha256_file

    record = manager.read_meta(step)
    target = manager.consolidated_path(step)
    known = record["files"].get(target.name)
    if known and target.is_file() and sha256_file(target) == known:
        return target
    missing = [n for n in names if n not in (record.get("sharded") or [])]
    if missing:
        raise UsageError(f"checkpoint step {step} has no sharded {', '.join(missing)} to consolidate")
    problem = manager._verify_names(step, manager.shard_files(step, record), record)
    if problem:
        raise UsageError(f"checkpoint step {step} cannot be consolidated: {problem}")
    # DCP's own single-process reader (what its dcp_to_torch_save uses), limited to `names`; no_dist
    # so rank 0 alone may call it inside a live process group.
    full: dict[str, Any] = {}
    _load_state_dict(full, storage_reader=FileSystemReader(manager.shard_dir(step)),
                     planner=_EmptyStateDictLoadPlanner(keys=set(names)), no_dist=True)
    atomic_write(target, lambda f: torch.save({n: full[n] for n in names}, f))
    sha = sha256_file(target)
    record = manager.read_meta(step)
    record["files"][target.name] = sha
    atomic_write_json(manager.meta_path(step), record)
    return target
