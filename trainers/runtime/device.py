"""The device seam: every CUDA-only call the kit makes, each with its answer on a CPU.

No other module of `trainers` touches `torch.cuda` (a test walks the code for it), so a call that
would crash a CPU run — or a GPU run on a path only a GPU takes — is answered here, once, and is
exercised by every CPU test: the CUDA branch by a GPU, the other by the CPU.

It also decides what a run turns on because it will meet a GPU (`gpu_like`): on CUDA, or on the CPU
with `--gpu-defaults`, the rehearsal of a GPU deploy's configuration (compile, bf16 autocast,
checkpoints written behind the loop, adaptive stop agreement, fused AdamW, reused host buffers).
"""

from __future__ import annotations

import contextlib
import os
import platform
import resource
from typing import Any

import torch


def is_cuda(device: torch.device) -> bool:
    return torch.device(device).type == "cuda"


def gpu_like(device: torch.device, rehearse: bool = False) -> bool:
    """Whether a run takes the defaults of a GPU deploy: on CUDA, or rehearsing them on the CPU."""
    return is_cuda(device) or rehearse


def cuda_available() -> bool:
    return torch.cuda.is_available()


def accelerator_available() -> bool:
    """Whether `--device auto` gets an accelerator. Every choice of a run's device asks here and in
    `accelerator`, never torch.cuda: the tests' fake accelerator (CUDA's placement rules on a CPU)
    answers both, so a CPU test runs the very path a GPU run takes."""
    return torch.cuda.is_available()


def accelerator(index: int = 0) -> torch.device:
    """The accelerator a worker with this local index uses (modulo the visible GPUs)."""
    return torch.device("cuda", index % torch.cuda.device_count())


def device_count() -> int:
    """Visible CUDA devices (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def set_device(device: torch.device) -> None:
    if is_cuda(device):
        torch.cuda.set_device(device)


def synchronize(device: torch.device | None = None) -> None:
    """Wait for the device's queued work (on a CPU the work is already done)."""
    if device is None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    elif is_cuda(device):
        torch.cuda.synchronize(device)


# What CUDA and cuBLAS say when an allocation inside a library call fails: a RuntimeError (or torch's
# AcceleratorError), not torch.OutOfMemoryError, but the same condition (and not a broken context)
OUT_OF_MEMORY_WORDS = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED")


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is the device running out of memory."""
    return isinstance(exc, torch.OutOfMemoryError) or \
        (isinstance(exc, RuntimeError) and any(words in str(exc) for words in OUT_OF_MEMORY_WORDS))


# What CUDA says after a kernel fault that leaves the process's context unusable: "any further CUDA work will
# return the same error. To continue using CUDA, the process must be terminated and relaunched" (the runtime's
# documentation of cudaErrorIllegalAddress, Assert, HardwareStackError, IllegalInstruction, MisalignedAddress,
# InvalidAddressSpace, InvalidPc, LaunchFailure, LaunchTimeout; and an uncorrectable ECC error)
CONTEXT_LOST_WORDS = ("an illegal memory access was encountered", "device-side assert triggered",
                      "hardware stack error", "an illegal instruction was encountered", "misaligned address",
                      "operation not supported on global/shared address space", "invalid program counter",
                      "unspecified launch failure", "the launch timed out and was terminated",
                      "uncorrectable ECC error encountered")


def context_lost(exc: BaseException, device: torch.device | None = None) -> bool:
    """Whether `exc` is a CUDA error after which every later call on the device fails in this process: only a
    new process (torchrun's restart) can use the GPU again, so retrying work here would only fail it again.
    CUDA's words for it (its runtime's "CUDA error: ..." or the driver's "CUDA driver error: ..."); or, on a
    CUDA `device`, any RuntimeError after which the device no longer runs a kernel: the first call to notice an
    earlier kernel's fault may be a library's, in its own words (cuBLAS's CUBLAS_STATUS_EXECUTION_FAILED,
    cuDNN's), and an error that leaves the context usable (out of memory, a bad argument) passes the probe."""
    if not isinstance(exc, RuntimeError):
        return False
    text = str(exc)
    if "CUDA" in text and any(words in text for words in CONTEXT_LOST_WORDS):
        return True
    return device is not None and is_cuda(device) and not out_of_memory(exc) and not device_answers(device)


def device_answers(device: torch.device) -> bool:
    """Whether `device` still runs a kernel and hands back its result (after a sticky error every call raises it).
    Out of memory is an answer: a broken context repeats its own error, and the failed work's memory may still
    be held while this runs."""
    try:
        return torch.ones(1, device=device).add_(1).item() == 2.0
    except torch.OutOfMemoryError:
        return True
    except RuntimeError as exc:
        return out_of_memory(exc)


def release_cached_memory(device: torch.device) -> None:
    """After an out-of-memory error: the allocator's cached blocks go back to the device, so a smaller retry
    starts from the memory really in use, not from a cache fragmented by the failed attempt."""
    if is_cuda(device):
        torch.cuda.empty_cache()


def capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if is_cuda(device) else None


def name(device: torch.device) -> str:
    if is_cuda(device):
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def total_memory(device: torch.device) -> int | None:
    """Bytes of device memory (None on a CPU: nothing to fit a model into)."""
    return torch.cuda.get_device_properties(device).total_memory if is_cuda(device) else None


def peak_memory(device: torch.device) -> int:
    """Peak allocated memory on CUDA; peak resident set size of this process on a CPU."""
    if is_cuda(device):
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # Linux reports KiB


def rng_state(device: torch.device) -> torch.Tensor | None:
    return torch.cuda.get_rng_state(device) if is_cuda(device) else None


def set_rng_state(state: torch.Tensor | None, device: torch.device) -> None:
    if state is not None and is_cuda(device):
        torch.cuda.set_rng_state(state, device)


def pinnable(device: torch.device) -> bool:
    """Whether copies between the host and `device` go through pinned host memory: a device with memory
    of its own (CUDA), where a copy from pageable memory makes the host wait for the device's queue."""
    return is_cuda(device)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor's copy on `device` without making the host wait: through pinned memory and
    non-blocking where the device has memory of its own; `.to()` elsewhere (on a CPU: the tensor itself)."""
    if pinnable(device):
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def host_buffer(like: torch.Tensor) -> torch.Tensor:
    """A host tensor to copy `like` into: pinned for a device tensor (the copy then runs at PCIe speed
    and may be non-blocking), plain otherwise."""
    return torch.empty(like.shape, dtype=like.dtype, pin_memory=pinnable(like.device))


@contextlib.contextmanager
def deterministic_kernels(enabled: bool):
    """Deterministic kernels inside (`--deterministic`; nothing changes when not `enabled`): atomic adds
    (index_add, scatter), cuBLAS's reductions and cuDNN's algorithm choice are what make two CUDA runs of
    the same steps differ in the last bits. `warn_only`: an op with no deterministic kernel warns in the log
    instead of ending a run someone pays for. Enter it before the first kernel: cuBLAS reads its workspace
    setting when it starts."""
    if not enabled:
        yield
        return
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=True)
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[1:]


def tf32(device: torch.device) -> bool:
    """TF32 matmuls and convolutions on Ampere and newer; returns whether they are on."""
    if not is_cuda(device) or torch.cuda.get_device_capability(device) < (8, 0):
        return False
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    return True


def facts(indices: range | None = None) -> dict:
    """What preflight reports of the visible GPUs: count, compute capabilities, NCCL, peer access."""
    if not torch.cuda.is_available():
        return {"count": 0}
    n = torch.cuda.device_count()
    return {"count": n,
            "capabilities": sorted({torch.cuda.get_device_capability(i) for i in range(n)}),
            "names": [torch.cuda.get_device_name(i) for i in range(n)],
            "nccl": ".".join(map(str, torch.cuda.nccl.version())) if hasattr(torch.cuda, "nccl") else "n/a",
            "no_peer_access": [(i, j) for i in range(n) for j in range(n)
                               if i != j and not torch.cuda.can_device_access_peer(i, j)]}


def optimizer_steps_on_host(loaded: Any) -> Any:
    """`loaded` (a checkpoint as torch.load returns it) with every optimizer state dict's step counts on the
    host. torch keeps a plain (not fused, not capturable) Adam's step there and reads it at every update
    (`.item()`, per parameter), and its load_state_dict leaves a step where the load put it: loaded onto a
    GPU, every update of a resumed run waited on the GPU once per parameter (PPO's Adam, the LSTM's alone).
    A fused or capturable optimizer moves its steps back to the device itself as it loads them."""
    if isinstance(loaded, dict):
        if isinstance(loaded.get("state"), dict) and "param_groups" in loaded:
            for per_param in loaded["state"].values():
                if isinstance(per_param, dict) and torch.is_tensor(per_param.get("step")):
                    per_param["step"] = per_param["step"].cpu()
        for value in loaded.values():
            optimizer_steps_on_host(value)
    elif isinstance(loaded, (list, tuple)):
        for value in loaded:
            optimizer_steps_on_host(value)
    return loaded
