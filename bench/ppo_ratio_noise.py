"""Benchmark: how far PPO's probability ratio stands from 1 before the policy has moved, under each numeric
format a GPU run could compute its policy in, on the same market and initial weights.

The ratio exp(new - old) compares the log-probability the rollout recorded for a sample with the one the
update recomputes for it. Before the first optimizer step the policy is the rollout's, so the ratio is 1 in
exact arithmetic: whatever departs from 1 is rounding. It departs only where the rollout's batch of
environments and the update's minibatch compute one sample's sums in different orders: on a GPU, cuBLAS and
cuDNN pick their algorithms (tile shapes, split-K) by the batch's shape, and a compiled rollout step runs other
kernels than the eager update. A CPU's kernels here sum a row the same way in any batch (the fp32 and bf16
rows below are 0 on this machine), so on a CPU the GPU's mechanism is emulated: `emulated` rows compute every
matmul themselves (the Linear layers, each LSTM's input and recurrent GEMMs: `torch.lstm` decomposed), the
rollout's with each sum over K in two halves (a split-K GEMM's order), the update's in one, and the formats
differ in what they round:

    fp32             nothing: the sums' order alone (the PPO default, `--precision auto`)
    tf32-nearest     each GEMM's inputs rounded to TF32 (10 mantissa bits), to the nearest; sums in fp32: what
    tf32-truncate    Ampere-and-newer tensor cores do with TF32 on (the kit turns it on for every trainer);
                     the two roundings because which one cuBLAS and cuDNN use is not documented to us
    bf16             `--precision bf16` as autocast runs a GEMM: inputs in bf16, sums in fp32, the output
                     rounded to bf16 (an LSTM's h too: its output is bf16; its cell state stays fp32)

Rows without `emulated` run the device's own kernels: `fp32`, `bf16` (autocast) and, on CUDA, `tf32` (the
card's TF32 switches on) and with `--compiled` the rollout step compiled (`--compile-rollout on`, the GPU
default) against the eager update. A GPU run measures beside them what the emulation stands for.

Per row (`rows.<name>.initial` and `.moved`: the initial weights, and the same moved by `--moved` times a normal
draw, a policy whose means are no longer near 0): the largest |log ratio|, its root mean square, the share of samples whose ratio is not exactly 1,
the share outside the clip range, and the KL estimate PPO reads (the mean of (r - 1) - log r). One rollout of
the default configuration's first agent (untrained), its update's first epoch of minibatches recomputed
without a step.

    python bench/ppo_ratio_noise.py --out bench/results/ppo_ratio_noise_cpu.json
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from record import write_record  # noqa: E402
from torch.overrides import TorchFunctionMode  # noqa: E402

TF32_DROPPED_BITS = 13  # fp32's 23 mantissa bits, TF32's 10


def round_to_tf32(x: torch.Tensor, rounding: str = "nearest") -> torch.Tensor:
    """`x` (float32) with its mantissa cut to TF32's 10 bits: to the nearest (ties to even) or truncated
    (toward zero). The exponent and sign stay; the result is still a float32 tensor."""
    if x.dtype != torch.float32:
        return x
    bits = x.contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF  # the pattern, unsigned
    if rounding == "nearest":
        bits = bits + (1 << (TF32_DROPPED_BITS - 1)) - 1 + ((bits >> TF32_DROPPED_BITS) & 1)
    elif rounding != "truncate":
        raise ValueError(f"rounding {rounding!r}: nearest or truncate")
    bits = bits & (0xFFFFFFFF ^ ((1 << TF32_DROPPED_BITS) - 1))
    bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)  # back to int32's signed range
    rounded = bits.to(torch.int32).view(torch.float32).view(x.shape)
    return torch.where(torch.isnan(x), x, rounded)  # (a NaN's low bits would carry into the exponent or sign)


FORMATS = ("fp32", "tf32-nearest", "tf32-truncate", "bf16")


def gemm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, fmt: str, split_k: int) -> torch.Tensor:
    """a @ b (+ bias) as a GEMM in `fmt` computes it (module docstring), its sum over K in `split_k` parts
    added in fp32 in order; the output float32, or bf16 for bf16 (whose bias is rounded to bf16 too, as
    autocast casts it: then a Linear's output is autocast's to the bit on this CPU)."""
    if fmt == "bf16":
        a, b = a.to(torch.bfloat16).float(), b.to(torch.bfloat16).float()
        bias = None if bias is None else bias.to(torch.bfloat16)
    elif fmt != "fp32":
        rounding = fmt.split("-")[1]
        a, b = round_to_tf32(a.float(), rounding), round_to_tf32(b.float(), rounding)
    a, b = a.float(), b.float()
    k = a.shape[-1]
    # autocast off in here: the bf16 row runs under it (nn.LSTM lets a bf16 input meet fp32 weights only then),
    # and it would round each part of the sum
    bounds = [k * i // split_k for i in range(split_k + 1)]
    out = None
    with torch.autocast(a.device.type, enabled=False):
        for lo, hi in zip(bounds, bounds[1:]):
            part = a[..., lo:hi] @ b[..., lo:hi, :]
            out = part if out is None else out + part
        if bias is not None:
            out = out + bias.float()
    return out.to(torch.bfloat16) if fmt == "bf16" else out


def lstm_decomposed(matmul, input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                    batch_first, keep_h):
    """torch.lstm (nn.LSTM's call on an unpacked input) as cuDNN runs it: each layer's input GEMM over every time
    step, then the recurrent GEMM step by step, both through `matmul(x, w, bias)`; gates and the cell state in
    fp32; h through `keep_h` (bf16 keeps it in bf16, its output's dtype)."""
    if bidirectional:
        raise NotImplementedError("lstm_decomposed: one direction only (the kit's LSTMs)")
    h0, c0 = hx
    x = input.transpose(0, 1) if batch_first else input  # [T, B, F]
    per_layer = 4 if has_biases else 2
    h_out, c_out = [], []
    for layer in range(num_layers):
        w_ih, w_hh, *biases = params[per_layer * layer: per_layer * (layer + 1)]
        gates_in = matmul(x, w_ih, biases[0] + biases[1] if has_biases else None).float()
        h, c = keep_h(h0[layer]), c0[layer].float()
        outs = []
        for t in range(x.shape[0]):
            gates = gates_in[t] + matmul(h, w_hh, None).float()
            i, f, g, o = gates.chunk(4, dim=-1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = keep_h(torch.sigmoid(o) * torch.tanh(c))
            outs.append(h)
        x = torch.stack(outs)
        if dropout and train and layer < num_layers - 1:
            x = torch.nn.functional.dropout(x, dropout, training=True)
        h_out.append(h)
        c_out.append(c)
    out = x.transpose(0, 1) if batch_first else x
    return out, torch.stack(h_out), torch.stack(c_out).to(out.dtype)


class EmulatedGemms(TorchFunctionMode):
    """Every matmul the policy makes computed by `gemm` in `fmt` with its sum in `split_k` parts: F.linear,
    torch.lstm (decomposed), and the plain matmuls. Calls made inside a handler are not intercepted again
    (torch leaves the mode while one runs). `seen`: the functions it computed, for the record."""

    def __init__(self, fmt: str, split_k: int):
        super().__init__()
        if fmt not in FORMATS:
            raise ValueError(f"format {fmt!r}: one of {FORMATS}")
        self.fmt, self.split_k = fmt, split_k
        self.seen: set[str] = set()

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., K] @ weight[N, K].T + bias, as a Linear (an LSTM's two biases summed first: an assumption)."""
        return gemm(x, weight.transpose(0, 1), bias, self.fmt, self.split_k)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name == "linear":
            self.seen.add(name)
            x, weight, *rest = args
            bias = rest[0] if rest else kwargs.get("bias")
            return self.matmul(x, weight, bias)
        if name == "lstm" and len(args) == 9:  # (input, hx, params, ...); the packed form has another arity
            self.seen.add(name)
            keep_h = (lambda h: h.to(torch.bfloat16)) if self.fmt == "bf16" else (lambda h: h.float())
            return lstm_decomposed(self.matmul, *args, keep_h=keep_h)
        if name in ("matmul", "mm", "bmm", "__matmul__"):
            self.seen.add(name)
            return gemm(args[0], args[1], None, self.fmt, self.split_k)
        if name in ("addmm", "baddbmm", "addbmm", "einsum", "conv1d", "conv2d"):
            raise NotImplementedError(f"EmulatedGemms: {name} is not emulated")
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_tf32(on: bool):
    """The card's own TF32 switches set for the block, put back after."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = on
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def first_epoch_log_ratios(cfg, device: torch.device, precision_name: str, compiled: bool, rollout_numerics,
                           update_numerics, moved: float) -> torch.Tensor:
    """Every sample's log ratio in the first update epoch of the first agent's first rollout, before any
    optimizer step: the rollout as training collects it, the minibatches as ppo.update cuts and computes them;
    each inside its `*_numerics()` context. `moved`: each weight moved by that times a standard normal draw
    (seeded), a policy whose action means and log-stds are no longer its initial ones (near 0: the actor's
    last layer starts at a hundredth of the others' scale). Not a trained policy: how far training moves the
    weights is not measured here, which is why the README shows two sizes of move."""
    from trainers.ppo import ppo
    from trainers.ppo.build import AgentSet
    from trainers.ppo.data import env_spec, load_trading_data
    from trainers.ppo.env import DeviceMarket, VecPortfolioEnv
    from trainers.ppo.train import policy_precision
    from trainers.runtime.precision import autocast

    data, _info = load_trading_data(cfg, log=lambda _msg: None)
    market, spec = DeviceMarket(data.close, data.features, device), env_spec(cfg)
    agent = AgentSet(cfg, data.n_stocks, device).agents[0]
    if moved:
        draws = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for param in agent.policy.parameters():
                param.add_(moved * torch.randn(param.shape, generator=draws).to(device))
    precision = policy_precision(device, precision_name)
    env = VecPortfolioEnv(market, spec, cfg.num_envs, data.splits["train"], seed=agent.seed * 7919)
    generator = torch.Generator(device=device).manual_seed(agent.seed)
    obs = env.observe()
    done = torch.zeros(cfg.num_envs, dtype=torch.bool, device=device)
    buf = ppo.Rollout(cfg.rollout_steps, obs, (data.n_stocks,), torch.float32, device)

    def inputs(o):
        t, portfolio = o
        return market.windows(t, cfg.window), portfolio

    step = ppo.rollout_stepper("on" if compiled else "off")
    with rollout_numerics():
        learner = ppo.Learner(agent.policy, agent.policy, agent.norms, inputs, agent.optimizer, None, precision, device)
        ppo.collect(learner, env, buf, obs, done, generator, step=step)
    n = buf.steps * buf.num_envs
    flat_obs = [o.reshape(n, *o.shape[2:]) for o in buf.obs]
    actions, old = buf.actions.reshape(n, -1), buf.log_probs.reshape(n)
    perm = torch.randperm(n, generator=generator, device=device)
    log_ratio = torch.empty(n, device=device)
    # with autograd on, as the update computes them (cuDNN's LSTM runs another forward for training)
    with update_numerics():
        for start in range(0, n, cfg.batch_size):
            idx = perm[start:start + cfg.batch_size]
            with autocast(device, precision):
                new, _entropy, _value = agent.policy(*ppo.normalise(agent.norms, inputs(tuple(o[idx] for o in flat_obs))),
                                                     actions[idx])
            log_ratio[idx] = (new - old[idx]).detach().float()
    return log_ratio


def noise(log_ratio: torch.Tensor, clip: float) -> dict:
    r = log_ratio.double().cpu()
    ratio = r.exp()
    return {"samples": len(r), "max_abs_log_ratio": float(r.abs().max()),
            "rms_log_ratio": float(r.pow(2).mean().sqrt()), "share_not_one": float((r != 0).double().mean()),
            "share_outside_clip": float(((ratio - 1).abs() > clip).double().mean()),
            "approx_kl": float(((ratio - 1) - r).mean())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu, cuda, or auto")
    p.add_argument("--num-envs", type=int, default=None, help="environments (default: the device's PPO default)")
    p.add_argument("--compiled", action="store_true", help="add the fp32 row with the rollout step compiled")
    p.add_argument("--moved", type=float, default=0.3, help="the second policy's weights: the initial ones plus this "
                   "times a standard normal draw (a policy away from its near-zero initial means)")
    p.add_argument("--out", default=None, help="JSON to write")
    args = p.parse_args(argv)
    if not 0 < args.moved <= 10:
        p.error(f"--moved {args.moved}: above 0, at most 10")
    if args.num_envs is not None and not 1 <= args.num_envs <= 65536:
        p.error(f"--num-envs {args.num_envs}: 1 to 65536")

    from trainers.ppo.config import PpoConfig
    from trainers.ppo.size import sized_for_device
    from trainers.runtime.dist import pick_device

    device = pick_device(0, args.device)
    cfg = sized_for_device(PpoConfig(num_envs=args.num_envs), device, 1)
    plain = contextlib.nullcontext
    # (name, --precision, the rollout's numerics, the update's, rollout compiled)
    rows_to_run = [("fp32", "fp32", plain, plain, False), ("bf16", "bf16", plain, plain, False)]
    if device.type == "cuda":
        rows_to_run.append(("tf32", "fp32", lambda: cuda_tf32(True), lambda: cuda_tf32(True), False))
    if args.compiled:
        rows_to_run.append(("fp32-compiled", "fp32", plain, plain, True))
    for fmt in FORMATS:
        rows_to_run.append((f"{fmt}-emulated", "bf16" if fmt == "bf16" else "fp32", lambda fmt=fmt: EmulatedGemms(fmt, 2),
                            lambda fmt=fmt: EmulatedGemms(fmt, 1), False))
    rows = {}
    for (name, precision, rollout_numerics, update_numerics, compiled), moved in itertools.product(
            rows_to_run, (0.0, args.moved)):
        # fp32 is fp32 on a card as well: its TF32 off but in the row that is TF32's own
        with cuda_tf32(False) if device.type == "cuda" else contextlib.nullcontext():
            log_ratio = first_epoch_log_ratios(cfg, device, precision, compiled, rollout_numerics, update_numerics,
                                               moved)
        weights = "moved" if moved else "initial"
        row = rows.setdefault(name, {})[weights] = noise(log_ratio, cfg.clip_coef)
        print(f"{name + ', ' + weights + ' weights':<40} max |log r| {row['max_abs_log_ratio']:.3g}, rms "
              f"{row['rms_log_ratio']:.3g}, not 1: {row['share_not_one']:.1%}, outside the clip: "
              f"{row['share_outside_clip']:.2%}, KL {row['approx_kl']:.3g}")
    for name, by_weights in rows.items():  # each emulated format's noise against fp32's (the sums' order alone)
        if name.endswith("-emulated"):
            for weights, row in by_weights.items():
                order_alone = rows["fp32-emulated"][weights]["rms_log_ratio"]
                row["rms_over_fp32"] = row["rms_log_ratio"] / order_alone if order_alone else None
    write_record({"benchmark": "ppo_ratio_noise", "device": str(device), "num_envs": cfg.num_envs,
                  "rollout_steps": cfg.rollout_steps, "batch_size": cfg.batch_size, "clip_coef": cfg.clip_coef,
                  "encoder": cfg.encoder, "hidden": cfg.hidden, "window": cfg.window,
                  "target_kl": cfg.target_kl, "split_k_emulated": 2, "moved": args.moved, "rows": rows}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
