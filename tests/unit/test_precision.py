import pytest
import torch

from trainers.errors import UsageError
from trainers.runtime.dist import pick_device
from trainers.runtime.precision import (
    build_adamw,
    make_grad_scaler,
    maybe_compile,
    precision_for,
    resolve_precision,
    use_fused_adamw,
)


def test_cpu_is_fp32_without_autocast():
    p = resolve_precision("auto", "cpu", None)
    assert p.name == "fp32" and p.autocast_dtype is None and not p.needs_grad_scaler


@pytest.mark.parametrize("cap,name,dtype,scaler", [((9, 0), "bf16", torch.bfloat16, False),
                                                   ((8, 0), "bf16", torch.bfloat16, False),
                                                   ((7, 5), "fp16", torch.float16, True),
                                                   ((7, 0), "fp16", torch.float16, True)])
def test_auto_precision_by_compute_capability(cap, name, dtype, scaler):
    p = resolve_precision("auto", "cuda", cap)
    assert (p.name, p.autocast_dtype, p.needs_grad_scaler) == (name, dtype, scaler)


def test_impossible_precisions_are_usage_errors():
    with pytest.raises(UsageError, match="bf16 needs compute capability"):
        resolve_precision("bf16", "cuda", (7, 0))
    with pytest.raises(UsageError, match="needs a CUDA GPU"):
        resolve_precision("fp16", "cpu", None)
    with pytest.raises(UsageError, match="'fp8'"):
        resolve_precision("fp8", "cpu", None)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CUDA-absent path")
def test_without_cuda_auto_picks_cpu_and_cuda_request_fails():
    assert pick_device(0, "auto").type == "cpu"
    assert precision_for(torch.device("cpu")).name == "fp32"
    with pytest.raises(UsageError, match="no CUDA GPU"):
        pick_device(0, "cuda")


def test_fused_adamw_only_on_cuda_and_no_decay_on_vectors():
    assert use_fused_adamw(torch.device("cuda", 0)) and not use_fused_adamw(torch.device("cpu"))
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    opt = build_adamw(model, 1e-3, 0.1, (0.9, 0.95), torch.device("cpu"))
    assert opt.defaults["fused"] in (False, None)
    decay, no_decay = opt.param_groups
    assert [p.dim() for p in decay["params"]] == [2] and decay["weight_decay"] == 0.1
    assert all(p.dim() == 1 for p in no_decay["params"]) and no_decay["weight_decay"] == 0.0


def test_grad_scaler_enabled_only_for_fp16():
    assert not make_grad_scaler(torch.device("cpu"), resolve_precision("auto", "cpu", None)).is_enabled()


def test_compile_flag_wraps_the_model():
    model = torch.nn.Linear(2, 2)
    assert maybe_compile(model, False) is model
    assert isinstance(maybe_compile(model, True), torch._dynamo.eval_frame.OptimizedModule)
