"""K direction models of one shape trained as one (the LSTM trainer's cohorts). Imports torch and model.py only.

`StackedLSTM` holds the K models' parameters with a leading model dimension, in nn.LSTM's own layout
(gates i, f, g, o; weight_ih [4H, F], weight_hh [4H, H], both biases), and runs every time step of all
K models as one batched matmul: on a GPU the kernels a step launches no longer grow with the number of
models. Model k of the stack computes what `DirectionLSTM` with model k's weights computes (the same
math, summed in another order: equal to about 1e-6).

`StackedAdamW` is torch's AdamW (the single-tensor algorithm, op for op) on the stacked parameters, each
model with its own step count, and an `active` mask: a model that finished (stopped early, ran out of
steps) is left exactly as it was, its moments too, while the others go on. Gradients are clipped per
model (`clip_per_model`), as `clip_grad_norm_` clips one model's.

Dropout masks come from each model's own stream, a pure function of (its seed, its step): a model's
training does not depend on which models share its stack, nor on a resume.
"""

from __future__ import annotations

import torch
from torch import nn

from trainers.lstm.model import DirectionLSTM


def parameter_names(layers: int) -> list[str]:
    """A DirectionLSTM's parameters in model.parameters() order: what its state dicts and AdamW's ids follow."""
    names = []
    for layer in range(layers):
        names += [f"lstm.weight_ih_l{layer}", f"lstm.weight_hh_l{layer}", f"lstm.bias_ih_l{layer}",
                  f"lstm.bias_hh_l{layer}"]
    return names + ["head.weight", "head.bias"]


class StackedLSTM(nn.Module):
    def __init__(self, k: int, n_features: int, hidden: int, layers: int, dropout: float):
        super().__init__()
        self.k, self.n_features, self.hidden, self.layers, self.dropout = k, n_features, hidden, layers, dropout
        self.weights = nn.ParameterList()
        for layer in range(layers):
            width = n_features if layer == 0 else hidden
            self.weights.extend([nn.Parameter(torch.zeros(k, 4 * hidden, width)),
                                 nn.Parameter(torch.zeros(k, 4 * hidden, hidden)),
                                 nn.Parameter(torch.zeros(k, 4 * hidden)), nn.Parameter(torch.zeros(k, 4 * hidden))])
        self.weights.extend([nn.Parameter(torch.zeros(k, 1, hidden)), nn.Parameter(torch.zeros(k, 1))])

    @staticmethod
    def of(models: list[DirectionLSTM]) -> "StackedLSTM":
        """The stack of `models` (all of one shape), model k's weights in slot k."""
        first = models[0]
        stacked = StackedLSTM(len(models), first.lstm.input_size, first.lstm.hidden_size, first.lstm.num_layers,
                              first.drop.p)
        with torch.no_grad():
            for p, tensors in zip(stacked.weights, zip(*(list(m.parameters()) for m in models))):
                p.copy_(torch.stack(tensors))
        return stacked

    def model_state(self, k: int) -> dict[str, torch.Tensor]:
        """Model k as a DirectionLSTM state dict: host copies (a checkpoint's; `host_rows`)."""
        return dict(zip(parameter_names(self.layers), host_rows(list(self.weights), k)))

    def load_model_state(self, k: int, state: dict[str, torch.Tensor]) -> None:
        with torch.no_grad():
            for name, p in zip(parameter_names(self.layers), self.weights):
                p[k].copy_(state[name])

    def model(self, k: int) -> DirectionLSTM:
        """Model k as the DirectionLSTM it is (for evaluation and export)."""
        model = DirectionLSTM(self.n_features, self.hidden, self.layers, self.dropout).to(self.weights[0].device)
        model.load_state_dict({name: p[k].detach() for name, p in zip(parameter_names(self.layers), self.weights)})
        return model  # (copied on the device: no trip through the host)

    def keep(self, rows: torch.Tensor) -> None:
        """Only the models at `rows` (in that order) stay: the stack shrinks when most have finished. New
        parameters (autograd keeps a parameter's shape from its first use: swapping `.data` breaks backward)."""
        with torch.no_grad():
            self.weights = nn.ParameterList([nn.Parameter(p.index_select(0, rows)) for p in self.weights])
        self.k = len(rows)

    def forward(self, x: torch.Tensor, masks: dict[str, torch.Tensor] | None = None,
                rows: torch.Tensor | None = None) -> torch.Tensor:
        """x [K, B, T, F] -> logits [K, B]; `masks` (training): dropout masks, already scaled by 1/(1-p),
        "layer{l}" [K, B, T, H] after layer l < layers - 1 and "head" [K, B, H] (None: no dropout);
        `rows`: only these models (x then holds theirs)."""
        k, b, t_len, _ = x.shape
        h_size = self.hidden
        weights = list(self.weights) if rows is None else [p.index_select(0, rows) for p in self.weights]
        for layer in range(self.layers):
            w_ih, w_hh, b_ih, b_hh = weights[4 * layer: 4 * layer + 4]
            # the input's part of every gate for every time step at once (both biases in it), then the
            # recurrence step by step
            gates_in = torch.baddbmm((b_ih + b_hh)[:, None, :], x.reshape(k, b * t_len, -1), w_ih.transpose(1, 2))
            # unbind, not gates_in[:, :, t]: the backward of one unbind is one stack, where each of T
            # selects would fill and add a gradient of the whole [K, B, T, 4H] tensor (T^2 memory traffic:
            # 25x the forward's time on a CPU, and the reason cohorts did not pay on the H100)
            steps_in = gates_in.view(k, b, t_len, 4 * h_size).unbind(2)
            h = x.new_zeros(k, b, h_size)
            c = x.new_zeros(k, b, h_size)
            outs = []
            w_hh_t = w_hh.transpose(1, 2)
            for t in range(t_len):
                # a time step in 8 operations (each a kernel launch on a GPU), not 12: the step's input
                # is the matmul's addend, one sigmoid over all four gates (g's quarter unused), c by addcmul
                gates = torch.baddbmm(steps_in[t], h, w_hh_t)
                i, f, _, o = torch.sigmoid(gates).chunk(4, dim=-1)
                c = torch.addcmul(f * c, i, torch.tanh(gates[..., 2 * h_size:3 * h_size]))
                h = o * torch.tanh(c)
                outs.append(h)
            x = torch.stack(outs, dim=2)
            if masks is not None and layer < self.layers - 1:
                x = x * masks[f"layer{layer}"]
        last = x[:, :, -1]
        if masks is not None:
            last = last * masks["head"]
        head_w, head_b = weights[-2], weights[-1]
        return torch.baddbmm(head_b[:, None, :], last, head_w.transpose(1, 2)).squeeze(-1)

    def dropout_masks(self, seeds: list[int], steps: list[int], batch: int, window: int,
                      generator: torch.Generator) -> dict[str, torch.Tensor] | None:
        """Each model's masks for its step, from its own stream (seed, step): the same whatever shares
        the stack. None without dropout."""
        p = self.dropout
        if p == 0:
            return None
        device = self.weights[0].device
        shapes = {f"layer{layer}": (batch, window, self.hidden) for layer in range(self.layers - 1)}
        shapes["head"] = (batch, self.hidden)
        drawn: dict[str, list[torch.Tensor]] = {name: [] for name in shapes}
        for seed, step in zip(seeds, steps):
            generator.manual_seed(stream_seed(seed, step))
            for name, shape in shapes.items():
                keep = torch.rand(shape, generator=generator, device=device) >= p
                drawn[name].append(keep.to(torch.float32) / (1 - p))
        return {name: torch.stack(parts) for name, parts in drawn.items()}


def stream_seed(seed: int, step: int) -> int:
    """A model's dropout stream at `step`: a pure function of its seed and the step (SplitMix64's mix)."""
    z = (seed * 0x9E3779B97F4A7C15 + step + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def clip_per_model(params: list[nn.Parameter], max_norm: float, active: torch.Tensor) -> None:
    """clip_grad_norm_ of each model of the stack on its own: its gradients' total 2-norm over its
    parameters, scaled down to `max_norm` (0: off). Inactive models' gradients are left as they are."""
    if max_norm <= 0:
        return
    grads = [p.grad for p in params]
    norms = torch.stack([g.flatten(1).norm(2, dim=1) for g in grads])  # [P, K]
    total = norms.norm(2, dim=0)
    coef = (max_norm / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef.view(-1, *([1] * (g.dim() - 1))))


class StackedAdamW:
    """torch.optim.AdamW's single-tensor update on stacked parameters, per model step counts, and an
    `active` mask (module docstring). Its per-model state is what AdamW would hold for that model."""

    def __init__(self, params: list[nn.Parameter], lr: float, weight_decay: float, betas=(0.9, 0.999),
                 eps: float = 1e-8):
        self.params, self.lr, self.weight_decay, self.betas, self.eps = params, lr, weight_decay, betas, eps
        k = params[0].shape[0]
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = torch.zeros(k, dtype=torch.float64, device=params[0].device)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self, active: torch.Tensor) -> None:
        beta1, beta2 = self.betas
        self.steps += active.to(torch.float64)
        t = self.steps.clamp(min=1.0)  # (an inactive model that never stepped: its update is discarded)
        step_size = (self.lr / (1 - beta1 ** t)).to(torch.float32)
        bias2_sqrt = (1 - beta2 ** t).sqrt().to(torch.float32)
        for p, m, v in zip(self.params, self.exp_avg, self.exp_avg_sq):
            shape = (-1, *([1] * (p.dim() - 1)))
            on = active.view(shape)
            g = p.grad
            new_p = p * (1 - self.lr * self.weight_decay)
            new_m = m.lerp(g, 1 - beta1)
            new_v = v.mul(beta2).addcmul_(g, g, value=1 - beta2)
            denom = (new_v.sqrt() / bias2_sqrt.view(shape)).add_(self.eps)
            new_p = new_p - step_size.view(shape) * (new_m / denom)
            p.copy_(torch.where(on, new_p, p))
            m.copy_(torch.where(on, new_m, m))
            v.copy_(torch.where(on, new_v, v))

    def keep(self, rows: torch.Tensor, params: list[nn.Parameter]) -> None:
        """The state of the models at `rows` only, for the stack's new `params` (StackedLSTM.keep)."""
        self.params = params
        self.exp_avg = [m.index_select(0, rows) for m in self.exp_avg]
        self.exp_avg_sq = [v.index_select(0, rows) for v in self.exp_avg_sq]
        self.steps = self.steps.index_select(0, rows)

    def model_state(self, k: int, param_groups: list[dict]) -> dict:
        """Model k's state as torch.optim.AdamW's state_dict for a DirectionLSTM (`param_groups` from one): host
        copies, its step count with them (`host_rows`, in the moments' dtype: float32, the LSTM's only one, exact
        to 2^24 steps; AdamW keeps a step as float32 too)."""
        n = len(self.exp_avg)
        *moments, step = host_rows([*self.exp_avg, *self.exp_avg_sq, self.steps.to(self.exp_avg[0].dtype)], k)
        step = float(step)  # (a tensor per entry, as AdamW's own: it adds to each in place)
        state = {} if step == 0 else {
            i: {"step": torch.tensor(step, dtype=torch.float32), "exp_avg": m, "exp_avg_sq": v}
            for i, (m, v) in enumerate(zip(moments[:n], moments[n:]))}
        return {"state": state, "param_groups": param_groups}

    def load_model_state(self, k: int, saved: dict) -> None:
        state = saved["state"]
        with torch.no_grad():
            for i, (m, v) in enumerate(zip(self.exp_avg, self.exp_avg_sq)):
                entry = state.get(i) or state.get(str(i))
                m[k].copy_(entry["exp_avg"] if entry else torch.zeros_like(m[k]))
                v[k].copy_(entry["exp_avg_sq"] if entry else torch.zeros_like(v[k]))
            first = state.get(0) or state.get("0")
            self.steps[k] = float(first["step"]) if first else 0.0


def host_rows(stacked: list[torch.Tensor], k: int) -> list[torch.Tensor]:
    """Row k of each stacked tensor (all of one dtype) as host copies, brought over in one device-to-host copy.
    Why: a cohort member's checkpoint took, per tensor (about 30 for a model and its AdamW state), a clone on
    the device, a page-locked host buffer (each member its own: a cudaHostAlloc apiece) and a copy. On the H200
    the clones and the buffers were among the largest times cProfile gave the 64-symbol cohort job (its times
    add across threads; bench/results/gpu_h200/profile_lstm_cohort_gpu.runs.json). Now one gather kernel and
    one copy a state, into pageable memory."""
    rows = [t[k].detach() for t in stacked]
    if len({r.dtype for r in rows}) > 1:
        raise ValueError(f"host_rows: one dtype expected, got {sorted({str(r.dtype) for r in rows})}")
    flat = torch.cat([r.reshape(-1) for r in rows]).cpu()
    # each tensor its own storage, as a state dict's: one kept by a loader (AdamW's state on the host, updated in
    # place) holds neither the others nor the whole block
    return [piece.view(r.shape).clone() for piece, r in zip(flat.split([r.numel() for r in rows]), rows)]


def adamw_param_groups(model: DirectionLSTM, lr: float, weight_decay: float) -> list[dict]:
    """The param_groups torch.optim.AdamW's state_dict holds for `model`: a slice's optimizer state has
    the very format a single model's has (a symbol trained in a stack resumes alone, and the reverse)."""
    return torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay).state_dict()["param_groups"]
