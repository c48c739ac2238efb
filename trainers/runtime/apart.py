"""Several nodes without a shared disk: node 0's run folder is the job's.

The deploy sets TRAINERS_RUN_DIR_APART=1 when `trainers nodes meet` found that the other nodes cannot see node 0's
output folder and a --remote is given (trainers/ops/nodes.py); without a remote such a deploy is refused. Then:

- every rank's own checkpoint state (a data position and RNG streams, a few KB) comes to rank 0 over the process
  group at each save, and rank 0 writes every file of the checkpoint, so node 0's folder holds complete ones and
  the remote mirror (trainers.runtime.remote) uploads them as it does on one node;
- a resume and the best model's restore are read by rank 0, checked against the meta, and sent to every rank;
- the other nodes' first local ranks keep copies of rank 0's metas only, so `complete_steps` and `best_step` say
  the same on every rank, and of its config and data record (trainers.runtime.remote_pull.share_run_record), so
  every rank settles its options from the same saved run;
- a fresh node 0 (a new machine, an empty disk) gets the folder from the remote before training.

Sharded states (FSDP2) are written by every rank to its own disk and are refused here: they would need every
node's upload and a commit that waits for all of them.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from trainers.runtime.device import optimizer_steps_on_host
from trainers.runtime.dist import all_gather_object, barrier, broadcast_object
from trainers.runtime.files import atomic_write_json

ENV = "TRAINERS_RUN_DIR_APART"


def run_dir_apart() -> bool:
    return os.environ.get(ENV) == "1"


def gather_rank_states(ctx, rank_state: dict[str, Any]) -> dict[int, Any] | None:
    """Collective: every rank's state on rank 0 ({rank: state}), None elsewhere."""
    gathered = all_gather_object(ctx, rank_state)  # (gloo's and NCCL's alike; a few KB a rank)
    return dict(enumerate(gathered)) if ctx.is_main else None


def other_nodes_first_rank(ctx) -> bool:
    """The rank that writes another node's copies: torchrun numbers each node's ranks from its local rank 0."""
    return ctx.local_rank == 0 and not ctx.is_main


def share_metas(manager) -> None:
    """Collective: rank 0's metas copied to every other node, and those rank 0 no longer has removed there."""
    ctx = manager.ctx
    records = broadcast_object(ctx, {step: manager.meta(step) for step in manager._meta_steps()}
                               if ctx.is_main else None)
    if other_nodes_first_rank(ctx):
        manager.dir.mkdir(parents=True, exist_ok=True)
        for step in set(manager._meta_steps()) - set(records):
            manager.meta_path(step).unlink(missing_ok=True)
        for step, record in records.items():
            if record is not None:
                atomic_write_json(manager.meta_path(step), record)
    barrier(ctx)


def resume_on_rank0(manager, map_location: torch.device):
    """CheckpointManager.resume here: rank 0 checks every file of the newest checkpoint (each rank's too) and falls
    back to older ones as `resume` does; every rank gets (step, the model file's states, its own state, the meta)."""
    ctx, found = manager.ctx, None
    if ctx.is_main:
        found = _newest_usable(manager)
    found = broadcast_object(ctx, found)  # (the model's states, once, to every rank: a resume's cost)
    share_metas(manager)
    if found is None:
        manager.refuse_if_a_run_was_here()
        return None
    step, shared, ranks, meta = found
    shared = optimizer_steps_on_host(to_device(shared, map_location))
    return step, shared, None if ranks is None else ranks[ctx.rank], meta


def _newest_usable(manager):
    ctx, log = manager.ctx, manager.log
    for step in manager._meta_steps():
        try:
            meta = manager.read_meta(step)
            same_world = meta.get("world_size") == ctx.world_size
            needed = [manager.model_path(step).name]
            needed += [manager.rank_path(step, r).name for r in range(ctx.world_size)] if same_world else []
            problem = manager._verify_names(step, needed, meta)
        except (OSError, ValueError, UnicodeDecodeError) as exc:  # unreadable or half-written meta
            meta, problem, same_world = {}, f"meta unreadable: {exc}", False
        if problem:
            log.warning("checkpoint step %d is unusable (%s); trying an older one", step, problem)
            manager._quarantine(step)
            continue
        shared = torch.load(manager.model_path(step), map_location="cpu", weights_only=True)
        ranks = [torch.load(manager.rank_path(step, r), map_location="cpu", weights_only=True)
                 for r in range(ctx.world_size)] if same_world else None
        if not same_world:
            log.warning("checkpoint step %d was written by %s ranks, this run has %d: per-rank data positions "
                        "cannot be mapped, the interrupted epoch restarts", step, meta.get("world_size"),
                        ctx.world_size)
        return step, shared, ranks, meta
    return None


def to_device(obj: Any, device: torch.device) -> Any:
    """What torch.load(map_location=device) makes of it: every tensor in nested dicts, lists and tuples on `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, dict):
        return {key: to_device(value, device) for key, value in obj.items()}
    if type(obj) in (list, tuple):  # (exactly: a named tuple is rebuilt differently, and a state dict holds none)
        return type(obj)(to_device(value, device) for value in obj)
    return obj
