"""Every random stream a rank draws from, captured and restored as one piece.

A resumed rank must draw exactly what it would have drawn without the interruption (dropout masks,
random features, environment noise), so each rank saves its own state in its own checkpoint file:
torch's CPU generator, this rank's CUDA generator, NumPy's and Python's global generators.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from trainers.runtime import device as device_mod


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (1 << 32))
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int) -> int:
    """A distinct stream per rank (model init uses `seed` itself, the same on every rank)."""
    return seed + 1_000 * (rank + 1)


def capture(device: torch.device) -> dict:
    """Plain tensors, lists and numbers only, so checkpoints load with `weights_only=True`."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    state = {"torch_cpu": torch.get_rng_state(),
             "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "gauss": float(gauss)},
             "python": {"version": version, "state": list(py_state), "gauss": py_gauss}}
    cuda = device_mod.rng_state(device)
    if cuda is not None:
        state["torch_cuda"] = cuda
    return state


def restore(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch_cpu"])
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["state"]), p["gauss"]))
    device_mod.set_rng_state(state.get("torch_cuda"), device)
