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

Sharded states (FSDP2): torch.distributed.checkpoint writes each rank's part to that rank's own disk; the parts node
0's folder lacks are relayed to rank 0 before the meta is written, one file at a time in chunks (RELAY_CHUNK bytes
held at once, never a whole part), so node 0's folder and the remote hold complete checkpoints and the other nodes
keep none. A resume or the best model's restore relays to each rank of another node the parts it reads, checked
against the meta, and removes them once loaded.

All of this needs rank 0 on node 0: the deploy numbers the ranks by node (trainers.runtime.dist.rank_by_deploy_node)
and a run whose rank 0 is elsewhere is refused (refuse_unless_rank0_on_node0).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers.errors import UsageError
from trainers.runtime.device import optimizer_steps_on_host
from trainers.runtime.dist import all_gather_object, barrier, broadcast_object
from trainers.runtime.files import atomic_write_json, sha256_file

ENV = "TRAINERS_RUN_DIR_APART"


def run_dir_apart() -> bool:
    return os.environ.get(ENV) == "1"


def refuse_unless_rank0_on_node0(ctx) -> None:
    """Collective: node 0's folder is the job's only if rank 0 runs there (the deploy numbers the ranks by node when
    every node runs as many workers: trainers.runtime.dist.rank_by_deploy_node); else every rank is refused."""
    node = broadcast_object(ctx, os.environ.get("TRAINERS_NODE_RANK", "") if ctx.is_main else None)
    if node not in ("", "0"):
        raise UsageError(f"without a shared disk rank 0 must run on node 0, whose folder is the job's, but it runs on "
                         f"node {node}: run as many workers on every node (the deploy then numbers the ranks by node), "
                         f"or put --out on storage every node mounts")


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


def resume_on_rank0(manager, map_location: torch.device, sharded: dict[str, Any] | None = None):
    """CheckpointManager.resume here: rank 0 checks every file of the newest checkpoint (each rank's and every shard
    too) and falls back to older ones as `resume` does; every rank gets (step, the model file's states, its own state,
    the meta), and its `sharded` states loaded in place."""
    ctx, found = manager.ctx, None
    if ctx.is_main:
        found = _newest_usable(manager)
    found = broadcast_object(ctx, found)  # (the model's states, once, to every rank: a resume's cost)
    share_metas(manager)
    if found is None:
        manager.refuse_if_a_run_was_here()
        return None
    step, shared, ranks, meta = found
    manager.refuse_other_sharding(step, meta, sharded)
    if sharded:
        manager.load_sharded(step, sharded, checked=True)  # (rank 0 has just checked every part)
    shared = optimizer_steps_on_host(to_device(shared, map_location))
    return step, shared, None if ranks is None else ranks[ctx.rank], meta


def gather_shards(manager, folder: Path, written: dict[str, str]) -> None:
    """Collective, after torch.distributed.checkpoint wrote every rank's part (`written`: this rank's, {name: SHA-256}):
    the parts node 0's folder lacks (the other nodes') relayed to rank 0 one file at a time, checked and written
    there; then the other nodes' folder of the step is removed (rank 0 prunes only its own disk)."""
    ctx = manager.ctx
    by_rank = all_gather_object(ctx, written)
    lacking = broadcast_object(ctx, {rank: sorted(n for n in part if not (manager.dir / n).is_file())
                                     for rank, part in enumerate(by_rank)} if ctx.is_main else None)
    problem = None
    for src, name in sorted((rank, name) for rank, names in lacking.items() if rank != 0 for name in names):
        said = _relay(manager, src, name, ctx.is_main, by_rank[src][name])
        problem = problem or said
    _agree(ctx, problem, OSError)  # (rank 0's disk full, or a part garbled: the checkpoint is not committed)
    if other_nodes_first_rank(ctx) and lacking[ctx.rank]:  # (its own part was not on node 0's disk: another disk)
        shutil.rmtree(folder, ignore_errors=True)


def bring_shards(manager, step: int, meta: dict[str, Any], checked: bool = False) -> bool:
    """Collective, before a load of checkpoint `step`'s sharded states: each rank of another node gets from rank 0
    the parts it reads and lacks (checked against the meta), each file relayed once to every rank that lacks it.
    Refused on every rank when node 0's folder does not hold every part (`checked`: rank 0 has just verified them).
    Whether this rank was sent any (its node's copies are then removed after the load: drop_brought_shards)."""
    ctx = manager.ctx
    problem = None if checked else broadcast_object(
        ctx, manager._verify_names(step, manager.shard_files(step, meta), meta) if ctx.is_main else None)
    if problem:
        raise UsageError(f"checkpoint step {step}'s shards are unusable on node 0 ({problem}); pick another with "
                         f"--checkpoint")
    mine = [n for n in manager._shard_files_needed(step, meta) if manager._verify_names(step, [n], meta)]
    lacking = sorted({name for names in all_gather_object(ctx, mine) for name in names})
    for name in lacking:
        said = _relay(manager, 0, name, name in mine, meta["files"][name])
        problem = problem or said
    _agree(ctx, problem, UsageError, f"checkpoint step {step}'s shards did not reach every node")
    return bool(mine)


def drop_brought_shards(manager, step: int, brought: bool) -> None:
    """Collective, after the load: the copies a node was sent removed (node 0 keeps and prunes its own; a node that
    sees node 0's folder was sent nothing, and its folder is node 0's)."""
    barrier(manager.ctx)  # (every rank of the node has read them)
    if other_nodes_first_rank(manager.ctx) and brought:
        shutil.rmtree(manager.shard_dir(step), ignore_errors=True)


RELAY_CHUNK = 64 << 20  # bytes a relay holds at once, on the host and (NCCL) on the device


def _relay(manager, src: int, name: str, write_here: bool, expected: str) -> str | None:
    """Collective: rank `src`'s file `name` (relative to the checkpoints folder) sent to every rank in chunks over the
    world's own group; the ranks with `write_here` write it beside their checkpoints and check its SHA-256. The first
    problem here, or None; a rank that cannot write goes on receiving, so no rank is left in a collective.
    (A group of the two ranks alone would carry less, but a group made after a torchrun restart read the killed
    attempt's addresses from the agent's store, which outlives attempts, and failed to connect; NCCL's send/recv
    makes such a pair's communicator too.)"""
    ctx, path = manager.ctx, manager.dir / name
    partial = path.with_name(f".{path.name}.relay{ctx.rank}")  # (a node's ranks may each write the same file)
    size = broadcast_object(ctx, path.stat().st_size if ctx.rank == src else None, src=src)
    device = ctx.device if ctx.backend == "nccl" else torch.device("cpu")
    buffer = torch.empty(min(size, RELAY_CHUNK), dtype=torch.uint8, device=device)
    source = open(path, "rb") if ctx.rank == src else None  # noqa: SIM115 - closed below, after every chunk
    problem, target = None, None
    try:
        if write_here:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                target = open(partial, "wb")  # noqa: SIM115 - closed below
            except OSError as exc:
                problem = f"{name} could not be written on rank {ctx.rank}: {exc}"
        for offset in range(0, size, RELAY_CHUNK):
            chunk = buffer[: min(RELAY_CHUNK, size - offset)]
            if source is not None:
                chunk.copy_(torch.frombuffer(bytearray(source.read(chunk.numel())), dtype=torch.uint8))
            dist.broadcast(chunk, src=src)
            if target is not None and problem is None:
                try:
                    target.write(chunk.cpu().numpy().tobytes())
                except OSError as exc:  # (DiskFull included: said on every rank by the caller, never a hang)
                    problem = f"{name} could not be written on rank {ctx.rank}: {exc}"
    finally:
        for f in (source, target):
            if f is not None:
                f.close()
    if target is None:
        return problem
    if problem is None and sha256_file(partial) != expected:
        problem = f"{name} reached rank {ctx.rank} with another SHA-256 than the one it was written with"
    if problem is None:
        os.replace(partial, path)
    partial.unlink(missing_ok=True)
    return problem


def _agree(ctx, problem: str | None, error: type[Exception], prefix: str = "") -> None:
    """Collective: the first rank's problem raised on every rank (a rank raising alone would leave the others in
    the next collective)."""
    said = [p for p in all_gather_object(ctx, problem) if p]
    if said:
        raise error(f"{prefix}: {said[0]}" if prefix else said[0])


def _newest_usable(manager):
    ctx, log = manager.ctx, manager.log
    for step in manager._meta_steps():
        try:
            meta = manager.read_meta(step)
            same_world = meta.get("world_size") == ctx.world_size
            needed = [manager.model_path(step).name]
            needed += [manager.rank_path(step, r).name for r in range(ctx.world_size)] if same_world else []
            needed += manager.shard_files(step, meta)
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
