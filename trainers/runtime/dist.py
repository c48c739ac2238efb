"""torchrun environment, process-group lifetime and the few collectives the trainers need."""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from trainers.runtime import device as device_mod
from trainers.runtime import nodewatch


@dataclass(frozen=True)
class DistContext:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    device: torch.device
    backend: str | None  # None when running as a single process without a process group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend is not None

    @property
    def restart_count(self) -> int:
        """How many times torchrun has restarted this worker group (0 on the first attempt)."""
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return default if value is None or value == "" else int(value)


def pick_device(local_rank: int, requested: str = "auto") -> torch.device:
    """`auto`: this rank's GPU when CUDA is available, else CPU. `cpu` forces CPU."""
    if requested == "cpu":
        return torch.device("cpu")
    if requested not in ("auto", "cuda"):
        from trainers.errors import UsageError

        raise UsageError(f"--device {requested!r} is not one of: auto, cpu, cuda")
    if device_mod.accelerator_available():
        return device_mod.accelerator(local_rank)
    if requested == "cuda":
        from trainers.errors import UsageError

        raise UsageError("--device cuda was asked for but no CUDA GPU is visible; use --device cpu or auto")
    return torch.device("cpu")


def _fresh_store_after_restart(rank: int, world_size: int, timeout: datetime.timedelta) -> dict[str, Any]:
    """Store arguments that keep a restarted worker group from reading its predecessor's keys.

    torchrun's agent keeps one TCPStore across `--max-restarts` attempts and workers join it without
    a per-attempt prefix, so a restarted rank can read the previous attempt's gloo/NCCL addresses
    and fail with "connection refused" (seen in CI; cf. pytorch/pytorch#167288). With a single agent
    (one node) every worker of an attempt has the same TORCHELASTIC_RESTART_COUNT, so it is a safe
    namespace. Across nodes agents count restarts independently, so the default path is kept there.
    """
    env = os.environ
    single_agent = env.get("GROUP_WORLD_SIZE", "1") == "1"
    if not (single_agent and env.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and "MASTER_ADDR" in env):
        return {}
    base = dist.TCPStore(host_name=env["MASTER_ADDR"], port=int(env["MASTER_PORT"]), world_size=world_size,
                         is_master=False, timeout=timeout)
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    return {"store": dist.PrefixStore(f"trainers/attempt{attempt}/", base), "rank": rank, "world_size": world_size}


def rank_by_deploy_node(world_size: int, local_rank: int, local_world_size: int) -> int:
    """This worker's rank: torchrun's RANK, except where the deploy found every node running as many workers
    (TRAINERS_RANKS_BY_NODE=1, from `trainers nodes meet`) and named this node's rank (TRAINERS_NODE_RANK): node R's
    workers are then ranks R*L .. R*L+L-1. c10d's rendezvous numbers the nodes by sorting their host names (then
    pids), so its rank 0 may be on any node; the deploy's node 0 is the one that exports and packages and, without a
    shared disk, holds the run's folder. Only through torchrun's agent store, where every worker is the store's
    client (else the rank-0 worker would host a store at an address that is another node's)."""
    env = os.environ
    said, nodes = env.get("TRAINERS_NODE_RANK", ""), _env_int("GROUP_WORLD_SIZE", 1)
    if (env.get("TRAINERS_RANKS_BY_NODE") != "1" or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or nodes < 2
            or not said.isdigit() or int(said) >= nodes or nodes * local_world_size != world_size):
        return _env_int("RANK", 0)
    rank = int(said) * local_world_size + local_rank
    env["RANK"] = str(rank)  # (one numbering in this process: logs, error files, libraries that read it)
    return rank


TERMINAL_STOP_KEY = "trainers/terminal_stop"


def _job_store(timeout_s: float = 30.0):
    """torchrun's agent store (c10d rendezvous's on several nodes): it outlives the worker groups torchrun
    restarts. None outside torchrun."""
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env:
        return None
    return dist.TCPStore(host_name=env["MASTER_ADDR"], port=int(env["MASTER_PORT"]), is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def remember_terminal_stop(why: str) -> None:
    """A run ended for good (diverged, the disk full) or was refused (a usage error: the same options meet the same
    refusal): tell the worker groups torchrun starts after this one, which end at once with it. (A file would not
    do: the disk may be the thing that is full, and a refusal writes nothing.)"""
    store = _job_store()
    if store is not None and not store.check([TERMINAL_STOP_KEY]):  # the first ending is the one to tell
        store.set(TERMINAL_STOP_KEY, why)


def terminal_stop_of_an_earlier_attempt() -> str | None:
    """What an earlier attempt of this torchrun job ended with for good, if one did (restarts only)."""
    if _env_int("TORCHELASTIC_RESTART_COUNT", 0) == 0:
        return None
    store = _job_store()
    if store is None or not store.check([TERMINAL_STOP_KEY]):
        return None
    return store.get(TERMINAL_STOP_KEY).decode(errors="replace")


def end_with_parent() -> bool:
    """A torchrun worker gets SIGTERM when its agent dies (Linux PR_SET_PDEATHSIG), so a `kill -9`
    of the agent cannot leave orphaned workers writing the run folder: they checkpoint and exit
    through the usual signal path. True when set up."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, int(signal.SIGTERM), 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
        return False
    if os.getppid() == 1:  # the agent died before we got here: we are already an orphan
        os.kill(os.getpid(), signal.SIGTERM)
    return True


@contextlib.contextmanager
def distributed(device: str = "auto", timeout_s: float = 600.0) -> Iterator[DistContext]:
    """Init the process group from torchrun's environment; always tear it down.

    NCCL on CUDA, gloo on CPU. `timeout_s` bounds every collective, so a dead peer ends the
    job (and torchrun can restart it) instead of leaving the GPUs idle forever.
    Without torchrun's variables this runs as a single process with no process group.
    """
    end_with_parent()
    earlier = terminal_stop_of_an_earlier_attempt()
    if earlier is not None:  # before anything is built or written: torchrun's restart trains nothing
        from trainers.errors import RunEnded

        raise RunEnded(f"an earlier attempt of this job ended for good, so this restart does not train: {earlier}")
    world_size = _env_int("WORLD_SIZE", 1)
    local_rank = _env_int("LOCAL_RANK", 0)
    local_world_size = _env_int("LOCAL_WORLD_SIZE", world_size)
    rank = rank_by_deploy_node(world_size, local_rank, local_world_size)
    dev = pick_device(local_rank, device)
    backend = None
    if world_size > 1 or "TORCHELASTIC_RUN_ID" in os.environ:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        if dev.type == "cuda":
            device_mod.set_device(dev)
            # Surface NCCL failures as exceptions at the timeout instead of a silent hang.
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend=backend, timeout=timeout, device_id=dev if dev.type == "cuda" else None,
                                **(_fresh_store_after_restart(rank, world_size, timeout)
                                   or {"rank": rank, "world_size": world_size}))
    ctx = DistContext(rank, local_rank, world_size, local_world_size, dev, backend)
    try:
        nodewatch.start_if_several_nodes()  # several nodes: a silent one ends this node in a bound, not a hang
        yield ctx
    finally:
        nodewatch.stop()
        if backend is not None and dist.is_initialized():
            # A DDP wrapper still alive when its group is destroyed made about one worker exit in five
            # abort (SIGABRT, "terminate called without an active exception"; torch 2.13, gloo), so torchrun
            # failed a run that had completed. The loop's wrapper is unreachable by now (its frame has
            # returned) but held by reference cycles: collect it while the group still exists.
            gc.collect()
            dist.destroy_process_group()


def wrap_ddp(module: torch.nn.Module, ctx: DistContext, accumulates: bool = False,
             static_graph: bool = True) -> torch.nn.Module:
    """DDP with nothing extra per step: gradients are views into the all-reduce buckets (no copy),
    buffers are not re-broadcast before each forward (a module whose buffers never change in
    training), and a static graph (every parameter used in every step) where that is allowed.

    `accumulates`: the loop skips the all-reduce on all but the last micro-batch of a step
    (`no_sync`). A static graph is then turned off: torch 2.13's reducer asserts
    (`expect_autograd_hooks_`) on a first backward under no_sync, and once past that stops
    all-reducing from the second step (pytorch/pytorch#187732); tests/unit/test_ddp.py checks the
    gradients. `static_graph=False` for a module that leaves parameters unused in some steps."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel as DDP

    names = inspect.signature(DDP).parameters  # torch 2.13 renamed broadcast_buffers (and warns on it)
    no_buffer_sync = {"forward_sync_buffers": False} if "forward_sync_buffers" in names else {"broadcast_buffers": False}
    return DDP(module, device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
               gradient_as_bucket_view=True, static_graph=static_graph and not accumulates, **no_buffer_sync)


def barrier(ctx: DistContext) -> None:
    if ctx.distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.device.index])
        else:
            dist.barrier()


def all_reduce_max(ctx: DistContext, values: list[float], on_device: torch.Tensor | None = None) -> list[float]:
    """Element-wise max over ranks; one small collective. `on_device`: a 0-dim tensor on this rank's
    device that rides as one more element (its max over ranks comes last), so a flag the device holds
    costs no host wait of its own: the one read of the result is the only one."""
    if not ctx.distributed:  # nothing to agree with: the flag's one read, nothing sent to the device and back
        return [*values, *([] if on_device is None else [float(on_device.detach())])]
    t = device_mod.to_device(torch.tensor(values, dtype=torch.float64), ctx.device)
    if on_device is not None:
        t = torch.cat([t, on_device.detach().to(torch.float64).reshape(1)])
    if ctx.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def all_reduce_sum(ctx: DistContext, values: list[float]) -> list[float]:
    if not ctx.distributed:
        return list(values)
    t = device_mod.to_device(torch.tensor(values, dtype=torch.float64), ctx.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t.tolist()


def all_gather_object(ctx: DistContext, obj: Any) -> list[Any]:
    if not ctx.distributed:
        return [obj]
    out: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(ctx: DistContext, obj: Any, src: int = 0) -> Any:
    """Rank `src`'s object (rank 0's unless said) on every rank."""
    if not ctx.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]
