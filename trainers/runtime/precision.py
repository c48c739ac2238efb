"""Device-dependent numerics: autocast dtype, gradient scaler, TF32, compile, fused AdamW, each
decided for the device a run is on — or, with `--gpu-defaults`, for the GPU it is rehearsing."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from trainers.errors import UsageError
from trainers.runtime.device import capability, gpu_like, tf32
from trainers.runtime.options import PRECISIONS


@dataclass(frozen=True)
class Precision:
    name: str  # fp32 | bf16 | fp16
    autocast_dtype: torch.dtype | None  # None: no autocast

    @property
    def needs_grad_scaler(self) -> bool:
        # fp16 has too little range for small gradients; bf16 and fp32 do not need scaling.
        return self.name == "fp16"


def resolve_precision(requested: str, device_type: str, cuda_capability: tuple[int, int] | None,
                      rehearse: bool = False) -> Precision:
    """Pick the numeric format.

    auto: bf16 autocast on GPUs with native bf16 (compute capability >= 8.0: A100, H100, L40S...),
    fp16 autocast + grad scaler on older GPUs (V100 7.0, T4 7.5), fp32 on CPU — bf16 there too when
    rehearsing a GPU deploy (`rehearse`). bf16 and fp16 may be asked for on a CPU: CPU autocast has
    both (slow: for rehearsing what a GPU will run, not for speed).
    """
    if requested not in PRECISIONS:
        raise UsageError(f"--precision {requested!r} is not one of: {', '.join(PRECISIONS)}")
    if device_type != "cuda":
        if requested == "auto":
            requested = "bf16" if rehearse else "fp32"
        return Precision(requested, {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[requested])
    bf16_ok = cuda_capability is not None and cuda_capability >= (8, 0)
    if requested == "auto":
        requested = "bf16" if bf16_ok else "fp16"
    if requested == "bf16" and not bf16_ok:
        raise UsageError(f"--precision bf16 needs compute capability >= 8.0, this GPU has {cuda_capability}; use fp16 or auto")
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[requested]
    return Precision(requested, dtype)


def precision_for(device: torch.device, requested: str = "auto", rehearse: bool = False) -> Precision:
    return resolve_precision(requested, device.type, capability(device), rehearse)


def autocast(device: torch.device, precision: Precision):
    if precision.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=precision.autocast_dtype)


def make_grad_scaler(device: torch.device, precision: Precision) -> torch.amp.GradScaler:
    """A scaler that is active only for fp16 (disabled scalers pass values through); on a CPU too."""
    return torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)


def enable_tf32(device: torch.device) -> bool:
    """TF32 matmuls and convolutions on Ampere and newer; returns whether it was enabled."""
    return tf32(device)


def use_fused_adamw(device: torch.device, rehearse: bool = False) -> bool:
    """Fused AdamW runs the whole update in one kernel: on CUDA, and on a CPU rehearsing a GPU
    deploy (torch 2.13 has a CPU kernel too; a plain CPU run keeps the default implementation)."""
    return gpu_like(device, rehearse)


def build_adamw(model: torch.nn.Module, lr: float, weight_decay: float, betas: tuple[float, float],
                device: torch.device, rehearse: bool = False) -> torch.optim.AdamW:
    """AdamW with decay on matrices only (not biases, norms or embeddings-as-vectors)."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=use_fused_adamw(device, rehearse))


def compile_default(setting: bool | None, device: torch.device, rehearse: bool = False) -> bool:
    """`--compile` when given; else on where a GPU deploy turns it on (CUDA, or rehearsing it)."""
    return gpu_like(device, rehearse) if setting is None else setting


def maybe_compile(model, enabled: bool, dynamic: bool | None = None, log=None):
    """`model` compiled when `enabled`, eager where compiling it fails (CompiledOrEager); `dynamic=False`:
    static shapes only (a step padded to one shape, CUDA-graph ready); None: torch's default."""
    return CompiledOrEager(torch.compile(model, dynamic=dynamic), model, log) if enabled else model


class CompiledOrEager:
    """A compiled step that runs eager for the rest of the run when compiling it fails (torch's compiler
    raises BackendCompilerFailed before the graph runs: no state has changed, the call is made again
    eager). A compiler missing or broken on the rented machine (triton, a C compiler, an inductor bug)
    costs speed, said once in the log and in results.json (`compile_error`), not the pod's time: the
    first run of the H200 died at its first step on an error a CPU test could not see. The backward is
    compiled with the forward (AOTAutograd would compile it at the first backward, outside this call).
    Any other error (a recompile refused in the tests, a device fault) is raised as it was."""

    def __init__(self, compiled, eager, log=None, off_flag: str = "--no-compile"):
        import torch._functorch.config
        import torch._inductor.exc

        self.compiled, self.eager, self.log, self.off_flag = compiled, eager, log, off_flag
        self.error: str | None = None
        self.ran_compiled = False  # a compiled call has returned (a run that stepped nothing compiled nothing)
        self.failures = (torch._dynamo.exc.BackendCompilerFailed, torch._inductor.exc.TritonMissing,
                         torch._inductor.exc.GPUTooOldForTriton)  # (the last two reach us unwrapped)
        # torch 2.10 added the option that compiles the backward with the forward, inside this call's fallback;
        # before it, a backward that fails to compile fails at the first backward, outside it (said once)
        self.backward_with_forward = "force_non_lazy_backward_lowering" in torch._functorch.config.get_config_copy()
        if not self.backward_with_forward and log is not None:
            log.info("torch %s compiles the backward at the first backward (force_non_lazy_backward_lowering is "
                     "2.10's): a backward that fails to compile is not caught by the eager fallback", torch.__version__)

    @property
    def is_compiled(self) -> bool:
        return self.error is None

    def __call__(self, *args, **kwargs):
        if self.error is None:
            try:
                with torch._functorch.config.patch(force_non_lazy_backward_lowering=True) if \
                        self.backward_with_forward else contextlib.nullcontext():
                    out = self.compiled(*args, **kwargs)
                self.ran_compiled = True
                return out
            except self.failures as exc:
                self.fall_back(str(exc))
        return self.eager(*args, **kwargs)

    def fall_back(self, error: str) -> None:
        """Eager from here on, for `error` (said once in the log)."""
        self.error = " ".join(error.split())[:300]
        if self.log is not None:
            self.log.warning("torch.compile failed; training eager from here (%s skips the try): %s",
                             self.off_flag, self.error)


def compile_facts(step, ctx=None) -> dict:
    """results.json's record of a step maybe_compile made: compiled (a compiled call ran, none failed) or not,
    and why not when it failed. Collective with `ctx` (a DistContext): each rank falls back on its own, so the
    run counts as compiled only where every rank's step is, and the error says which ranks fell back."""
    tried = isinstance(step, CompiledOrEager)
    mine = {"compiled": tried and step.is_compiled and step.ran_compiled, "compile_error": step.error if tried else None}
    if ctx is None:
        return mine
    from trainers.runtime.dist import all_gather_object

    every = all_gather_object(ctx, mine)
    failed = [rank for rank, facts in enumerate(every) if facts["compile_error"]]
    error = every[failed[0]]["compile_error"] if failed else None
    if failed and len(every) > 1:
        error = f"rank{'s' * (len(failed) > 1)} {', '.join(map(str, failed))} of {len(every)}: {error}"
    return {"compiled": all(facts["compiled"] for facts in every), "compile_error": error}
