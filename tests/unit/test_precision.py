import os

import pytest
import torch

from trainers.errors import UsageError
from trainers.runtime.dist import pick_device
from trainers.runtime.precision import (
    CompiledOrEager,
    autocast,
    build_adamw,
    compile_default,
    compile_facts,
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
    with pytest.raises(UsageError, match="'fp8'"):
        resolve_precision("fp8", "cpu", None)


@pytest.mark.parametrize("requested,dtype,scaler", [("bf16", torch.bfloat16, False), ("fp16", torch.float16, True)])
def test_bf16_and_fp16_run_on_a_cpu_for_rehearsal(requested, dtype, scaler):
    """--precision bf16 was refused on a CPU ("needs a CUDA GPU") although CPU autocast has it: the
    GPU's numerics could not be tried before renting one. fp16 comes with its gradient scaler."""
    p = resolve_precision(requested, "cpu", None)
    assert (p.autocast_dtype, p.needs_grad_scaler) == (dtype, scaler)
    device = torch.device("cpu")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    opt = build_adamw(model, 1e-2, 0.0, (0.9, 0.95), device, rehearse=True)
    scaler_ = make_grad_scaler(device, p)
    assert scaler_.is_enabled() == scaler
    before = model.weight.detach().clone()
    for _ in range(20):  # fp16: the scaler skips steps whose scaled gradients overflow, and backs off
        with autocast(device, p):
            out = model(torch.randn(16, 8))
        assert out.dtype == dtype
        scaler_.scale(out.float().pow(2).mean()).backward()
        scaler_.step(opt)
        scaler_.update()
        opt.zero_grad()
    assert not torch.equal(before, model.weight) and torch.isfinite(model.weight).all()


def test_a_rehearsal_takes_the_gpu_defaults_on_a_cpu():
    cpu = torch.device("cpu")
    assert resolve_precision("auto", "cpu", None, rehearse=True).name == "bf16"
    assert use_fused_adamw(cpu, rehearse=True) and compile_default(None, cpu, rehearse=True)
    assert not compile_default(None, cpu) and compile_default(False, cpu, rehearse=True) is False
    assert build_adamw(torch.nn.Linear(2, 2), 1e-3, 0.1, (0.9, 0.95), cpu, rehearse=True).defaults["fused"]


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
    step = maybe_compile(model, True)
    assert isinstance(step, CompiledOrEager) and step.eager is model
    assert isinstance(step.compiled, torch._dynamo.eval_frame.OptimizedModule)
    assert compile_facts(step) == {"compiled": False, "compile_error": None}  # nothing has run compiled yet
    step(torch.ones(1, 2))
    assert compile_facts(step) == {"compiled": True, "compile_error": None}
    assert compile_facts(model) == {"compiled": False, "compile_error": None}  # --no-compile


@pytest.mark.parametrize("failure", ["forward", "backward", "triton"])
def test_a_step_whose_compile_fails_runs_eager_from_then_on(failure):
    """A forward or a backward the backend cannot compile, or inductor finding no triton (raised unwrapped):
    the call is made again eager, the reason kept, later calls eager; the gradients are the eager ones."""
    import logging

    import torch._inductor.exc
    from torch._dynamo.backends.common import aot_autograd

    tries = []

    def broken(gm, example_inputs):
        tries.append(1)
        if failure == "triton":
            raise torch._inductor.exc.TritonMissing(None)
        raise RuntimeError("no compiler for this graph")

    def fine(gm, example_inputs):
        return gm.forward

    torch._dynamo.reset()
    backend = broken if failure == "triton" else aot_autograd(fw_compiler=broken if failure == "forward" else fine,
                                                             bw_compiler=broken if failure == "backward" else fine)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    reference = [p.detach().clone() for p in model.parameters()]
    step = CompiledOrEager(torch.compile(model, backend=backend), model, logging.getLogger("test"))
    x = torch.randn(5, 3)
    if failure == "backward" and not step.backward_with_forward:
        # torch below 2.10 compiles the backward at the first backward, outside the call the fallback guards: the
        # failure reaches the caller (said at the start, in the log), as it did before the option existed
        with pytest.raises(Exception, match="no compiler for this graph"):
            step(x).sum().backward()
        return
    step(x).sum().backward()
    assert not step.is_compiled and step.error
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    check = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    with torch.no_grad():
        for p, r in zip(check.parameters(), reference):
            p.copy_(r)
    check(x).sum().backward()
    for g, want in zip(grads, [p.grad for p in check.parameters()]):
        torch.testing.assert_close(g, want)
    assert compile_facts(step) == {"compiled": False, "compile_error": step.error}
    tried = len(tries)
    step(x).sum().backward()  # eager from then on: the compiler is not asked again
    assert len(tries) == tried >= 1


def test_deterministic_kernels_are_on_inside_and_put_back_after(monkeypatch):
    """`--deterministic`: what makes two CUDA runs of the same steps equal to the bit (atomic adds, cuBLAS's
    reductions, cuDNN's algorithm choice), on for the run and put back after it (tests share a process)."""
    import torch

    from trainers.runtime.device import deterministic_kernels

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
              torch.backends.cudnn.benchmark)
    with deterministic_kernels(False):
        assert torch.are_deterministic_algorithms_enabled() == before[0]
    with deterministic_kernels(True):
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark) == before


def test_gpu_defaults_and_deterministic_may_change_on_a_resume():
    """Neither changes what a checkpoint holds (fp32 weights, AdamW's moments): a run started with them
    and resumed without (or the reverse) is not refused. --gpu-defaults was (issue 34)."""
    from trainers.forecast.config import ForecastConfig
    from trainers.runtime.config import incompatible_fields, to_dict

    saved = to_dict(ForecastConfig(gpu_defaults=True, deterministic=True))
    assert incompatible_fields(saved, ForecastConfig()) == []
    assert incompatible_fields(saved, ForecastConfig(window=30)) != []  # a field that does change the run


def test_compile_facts_of_several_ranks_say_which_fell_back(monkeypatch):
    """Each rank falls back on its own: results.json (rank 0's) says compiled only when every rank's step is,
    and names the ranks that run eager, even when rank 0 compiled."""
    import trainers.runtime.dist as dist
    from trainers.runtime.dist import DistContext

    compiled = CompiledOrEager(lambda x: x, lambda x: x)
    fell_back = CompiledOrEager(lambda x: x, lambda x: x)
    compiled(1)
    fell_back.error = "no working compiler on this machine"
    ctx = DistContext(rank=0, local_rank=0, world_size=3, local_world_size=3, device=torch.device("cpu"), backend="gloo")
    others = {"ok": compile_facts(compiled), "failed": compile_facts(fell_back)}
    monkeypatch.setattr(dist, "all_gather_object", lambda _ctx, mine: [mine, others["failed"], others["ok"]])
    assert compile_facts(compiled, ctx) == {"compiled": False,
                                            "compile_error": "rank 1 of 3: no working compiler on this machine"}
    monkeypatch.setattr(dist, "all_gather_object", lambda _ctx, mine: [mine, others["failed"], others["failed"]])
    assert compile_facts(compiled, ctx)["compile_error"].startswith("ranks 1, 2 of 3: no working compiler")
    monkeypatch.setattr(dist, "all_gather_object", lambda _ctx, mine: [mine, others["ok"], others["ok"]])
    assert compile_facts(compiled, ctx) == {"compiled": True, "compile_error": None}
