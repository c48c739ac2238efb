"""The fake accelerator: CUDA's placement rules, and the host syncs CUDA would block on, on a CPU-only machine.

Why: on a CPU-only machine `.to(device)` returns the very tensor it was given, so a reference kept from
before a move, an index on the wrong device or a generator of the other device all work here and crash on
the first GPU. At a09b8e2 the forecaster, the deploy's default, died at its first CUDA step with 1,546 CPU
tests green. `--gpu-defaults` rehearses a GPU's settings; this rehearses where tensors live.

How: the run's device is `torch.device("cpu", i)`, which compares unequal to the host's `cpu`, and every
storage made for it is tagged (a weak map from storage to device index). Tensors still hold host memory,
so values, checkpoints and gloo work as before. Two modes watch every call:

- a TorchFunctionMode answers `x.device` as CUDA would (the fake device for a tagged tensor), makes
  `.to()`/`.cpu()` copy across the boundary as CUDA does (a CPU `.to("cpu")` returns the same tensor, and a
  reference taken before a move would still see the moved data), tags what factories make (`device=` the
  fake device, else host), refuses `.numpy()` of a device tensor and a generator of the other device;
- a TorchDispatchMode (every aten op: forward, backward, the optimizer) raises CUDA's error where an op
  mixes device and host tensors (a 0-dim host tensor excepted: CUDA takes CPU scalars) or indexes a host
  tensor with device indices, tags each op's outputs, and counts what would make the host wait for the GPU:
  `.item()`/`float()`/`bool()` (aten._local_scalar_dense), `.tolist()`, `.cpu()` and other device-to-host
  copies, host-to-device copies from pageable memory (`torch.tensor(..., device=)`, an index or `.to()` of
  a host tensor), and data-dependent shapes (`nonzero`, `masked_select`, boolean indexing, `unique`);
  and where page-locked host memory is allocated (`pins`).

A tensor made outside the modes (before activation, or by C++ code such as DDP's buckets, which allocate
"like" a parameter without a device index) is untagged and mixes with either side: the fake errs towards
silence, never towards a false alarm. `torch.compile` is not watched (inductor's kernels are not aten ops).

Used in-process (`with FakeAccelerator() as acc: ... acc.device`) or for a whole process tree:
`env=fake_env(...)` puts `sitecustomize.py` (beside this file) on PYTHONPATH, which activates it in every
Python process that imports torch when TRAINERS_FAKE_ACCELERATOR=1, and writes each process's syncs and
the run's markers to TRAINERS_FAKE_ACCELERATOR_LOG/<pid>.json at exit.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import sys
import threading
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from after_import import when_imported

HOST = -1
FAKE_MEMORY_BYTES = 16 << 30  # what runtime.device.total_memory answers for a fake device (sizes --cohort auto)
HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
aten = torch.ops.aten

# CUDA's own words for each mistake (torch 2.x), so a failure here reads as it would on the GPU.
MIXED = "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"
HOST_INDEXED = "indices should be either on cpu or on the same device as the indexed tensor (cpu)"
NUMPY = "can't convert {d} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
GENERATOR = "Expected a '{want}' device type for generator but found '{got}'"

DATA_DEPENDENT = {aten.nonzero, aten.masked_select, aten._unique2, aten.unique_dim, aten.unique_consecutive,
                  aten.nonzero_static}
INDEXING = {aten.index, aten._unsafe_index, aten.index_put, aten.index_put_, aten._index_put_impl_}
DATA_FACTORIES = {torch.tensor, torch.as_tensor, torch.asarray}
_DEVICE_ATTR = torch._C.TensorBase.__dict__["device"]
_REAL_GENERATOR = torch.Generator

_storage_tags: "weakref.WeakKeyDictionary[torch.UntypedStorage, int]" = weakref.WeakKeyDictionary()
_generator_tags: "weakref.WeakKeyDictionary[torch.Generator, int]" = weakref.WeakKeyDictionary()
_pinned: "weakref.WeakKeyDictionary[torch.UntypedStorage, bool]" = weakref.WeakKeyDictionary()  # page-locked host
_active: "FakeAccelerator | None" = None


def placement(t: torch.Tensor) -> int | None:
    """The fake device's index for a tagged device tensor, HOST for a tagged host tensor, None if untagged."""
    try:
        return _storage_tags.get(t.untyped_storage())
    except (RuntimeError, NotImplementedError, TypeError):  # a wrapper subclass (DTensor) or a meta tensor
        return None


def _aliases(t: torch.Tensor, tensors: list[torch.Tensor]) -> bool:
    try:
        storage = t.untyped_storage()
        return any(x.untyped_storage() is storage for x in tensors)
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def _tag(tree, index: int, overwrite: bool = False) -> None:
    for t in pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError, TypeError):
                continue
            if overwrite or storage not in _storage_tags:
                _storage_tags[storage] = index


def pinned(t) -> bool:
    try:
        return isinstance(t, torch.Tensor) and t.untyped_storage() in _pinned
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def _pin(tree) -> None:
    for t in pytree.tree_leaves(tree):
        if isinstance(t, torch.Tensor):
            _pinned[t.untyped_storage()] = True
            _storage_tags[t.untyped_storage()] = HOST


def _name(index: int) -> str:
    return "cpu" if index == HOST else f"cuda:{index}"


def _target_index(device) -> int | None:
    """The tag a `device=` argument asks for: the fake device's index, HOST for the host, None for others."""
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cpu":
        return None
    return HOST if device.index is None else device.index


def _where() -> str:
    """The first frame of ours (the package, bench/ or tests/) that led to the current op."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(str(REPO)) and not path.startswith(str(HERE)) and "site-packages" not in path:
            return f"{os.path.relpath(path, REPO)}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "?"


@dataclass
class Sync:
    kind: str  # item | tolist | device->host | host->device | data-dependent shape | synchronize
    op: str
    where: str
    label: str  # what the run was doing (see instrument_run): "body 5", "agree 5", "evaluation 0"...
    thread: str
    run: int  # which Run of the process (the LSTM trains one per symbol): counted at each resume


class _FunctionMode(TorchFunctionMode):
    def __init__(self, acc: "FakeAccelerator"):
        super().__init__()
        self.acc = acc

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_ATTR:  # x.device
            where = placement(args[0])
            return torch.device("cpu", where) if where not in (None, HOST) else func(*args, **kwargs)
        if func is torch.Tensor.get_device:
            where = placement(args[0])
            return where if where not in (None, HOST) else func(*args, **kwargs)
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and self.acc.on_device(args[0]):
            raise TypeError(NUMPY.format(d=_name(placement(args[0]))))
        if func is torch.Tensor.tolist and self.acc.on_device(args[0]):
            self.acc.sync("tolist", "Tensor.tolist")
        if func is torch.Tensor.pin_memory:  # (a CPU-only torch cannot pin: a copy that remembers it was asked)
            out = args[0].clone()
            _pin(out)
            self.acc.pins.append(_where())
            return out
        if func is torch.Tensor.is_pinned:
            return pinned(args[0])
        if kwargs.get("pin_memory"):
            out = func(*args, **{**kwargs, "pin_memory": False})
            _pin(out)
            self.acc.pins.append(_where())
            return out
        if func is torch.Tensor.cpu:
            return self._move(args[0], HOST, args[1:], kwargs) if self.acc.on_device(args[0]) else func(*args, **kwargs)
        if func is torch.Tensor.to:
            return self._to(func, args, kwargs)
        if kwargs.get("generator") is not None:
            self._check_generator(func, kwargs["generator"], args, kwargs)
        out = func(*args, **kwargs)
        asked = _target_index(kwargs.get("device"))
        if asked is not None:
            _tag(out, asked, overwrite=True)
            if asked != HOST and func in DATA_FACTORIES:
                self.acc.sync("host->device", getattr(func, "__name__", str(func)))
        elif not any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves((args, kwargs))):
            _tag(out, HOST)  # a factory without a device: the host, as on CUDA
        return out

    def _move(self, t: torch.Tensor, index: int, args, kwargs, non_blocking: bool = False) -> torch.Tensor:
        """A copy of `t` on the other side (dtype changes as asked), counted as the copy CUDA makes: every
        one but a non-blocking copy from pinned memory to the device."""
        kind = "device->host" if index == HOST else "host->device"
        if not (index != HOST and non_blocking and pinned(t)):
            self.acc.sync(kind, "Tensor.to" if args or kwargs else "Tensor.cpu")
        dtype = kwargs.get("dtype") or next((a for a in args if isinstance(a, torch.dtype)), None)
        out = t.to(dtype=dtype or t.dtype, copy=True)
        _tag(out, index, overwrite=True)
        return out

    def _to(self, func, args, kwargs):
        t, rest = args[0], args[1:]
        non_blocking = False
        if rest and isinstance(rest[0], torch.Tensor):  # .to(other): other's device as CUDA would say it
            other = placement(rest[0])
            target = other if other is not None else HOST
            dtype = rest[0].dtype
            rest, kwargs = (), {**kwargs, "dtype": dtype}
        else:
            device, dtype, non_blocking, _fmt = torch._C._nn._parse_to(*rest, **kwargs)
            target = _target_index(device)
            if device is not None and target is None:
                return func(*args, **kwargs)  # meta and other real devices: as they are
        if target is None:
            return func(t, *rest, **kwargs)
        here = placement(t)
        on_device_now = here not in (None, HOST)
        if (target == HOST and not on_device_now) or (target != HOST and here == target):
            return t if dtype in (None, t.dtype) else t.to(dtype=dtype)  # already there: no copy, as on CUDA
        return self._move(t, target, (), {"dtype": dtype}, non_blocking)

    def _check_generator(self, func, gen, args, kwargs) -> None:
        gen_index = _generator_tags.get(gen, HOST) if isinstance(gen, _REAL_GENERATOR) else HOST
        asked = _target_index(kwargs.get("device"))
        if asked is None:
            first = next((t for t in pytree.tree_leaves(args) if isinstance(t, torch.Tensor)), None)
            if first is not None and placement(first) is None:
                return  # a tensor of unknown side (made below the modes: a DTensor's shard): no false alarm
            asked = HOST if first is None else placement(first)
        if (gen_index == HOST) != (asked == HOST):
            raise RuntimeError(GENERATOR.format(want="cpu" if asked == HOST else "cuda",
                                                got="cpu" if gen_index == HOST else "cuda"))


class _DispatchMode(TorchDispatchMode):
    def __init__(self, acc: "FakeAccelerator"):
        super().__init__()
        self.acc = acc

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunction():
            packet = func.overloadpacket
            tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            places = [placement(t) for t in tensors]
            devices = sorted({p for p in places if p not in (None, HOST)})
            hosts = [t for t, p in zip(tensors, places) if p == HOST and t.dim() > 0]
            if packet is aten._local_scalar_dense:
                if devices:
                    self.acc.sync("item", str(func))
            elif packet in DATA_DEPENDENT or (packet in (aten.index, aten.index_put, aten.index_put_)
                                              and any(i is not None and i.dtype in (torch.bool, torch.uint8)
                                                      for i in args[1])):
                if devices:
                    self.acc.sync("data-dependent shape", str(func))
            if packet in INDEXING:
                self._check_index(func, args)
            elif packet is aten.copy_:
                non_blocking = (args[2] if len(args) > 2 else kwargs.get("non_blocking", False)) and \
                    (pinned(args[0]) or pinned(args[1]))
                if not non_blocking:
                    self._count_copy(func, placement(args[0]), placement(args[1]))
            elif packet is aten._to_copy:
                self._count_copy(func, _target_index(kwargs.get("device")), placement(args[0]))
            elif len(devices) > 1 or (devices and hosts):
                a, b = _name(devices[0]), _name(devices[1] if len(devices) > 1 else HOST)
                inputs = ", ".join(f"{tuple(t.shape)} on {'?' if p is None else _name(p)}" for t, p in zip(tensors, places))
                raise RuntimeError(MIXED.format(a=a, b=b) + f" (fake accelerator: {func}; inputs {inputs})")
            out = func(*args, **kwargs)
            asked = _target_index(kwargs.get("device"))
            if asked is not None and asked != HOST:
                _tag(out, asked, overwrite=packet is aten._to_copy)
            elif asked is None:  # (a dtype change, _to_copy without device=, stays where it was)
                # an output that is an input (in-place, copy_) or a view of one stays where that input is
                made = [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor) and not _aliases(t, tensors)]
                if devices:
                    _tag(made, devices[0])
                elif any(p == HOST for p in places):
                    _tag(made, HOST)
            return out

    def _check_index(self, func, args) -> None:
        self_place = placement(args[0])
        indices = [i for i in args[1] if i is not None]
        index_places = [placement(i) for i in indices]
        if self_place in (None, HOST):
            if self_place == HOST and any(p not in (None, HOST) for p in index_places):
                raise RuntimeError(HOST_INDEXED + f" (fake accelerator: {func})")
        elif any(p == HOST for p in index_places):
            self.acc.sync("host->device", f"{func} with host indices")
        values = args[2] if len(args) > 2 and isinstance(args[2], torch.Tensor) else None
        if values is not None and values.dim() > 0:
            v = placement(values)
            if None not in (v, self_place) and (v == HOST) != (self_place == HOST):
                raise RuntimeError(MIXED.format(a=_name(max(v, self_place)), b="cpu") + f" (fake accelerator: {func})")

    def _count_copy(self, func, dst: int | None, src: int | None) -> None:
        if dst is None or src is None or (dst == HOST) == (src == HOST):
            return
        self.acc.sync("device->host" if dst == HOST else "host->device", str(func))


class _GeneratorMeta(type(_REAL_GENERATOR)):
    def __instancecheck__(cls, obj):
        return isinstance(obj, _REAL_GENERATOR)

    def __subclasscheck__(cls, sub):
        return issubclass(sub, _REAL_GENERATOR)


class _Generator(_REAL_GENERATOR, metaclass=_GeneratorMeta):
    """torch.Generator while the fake is active: one made for the fake device says so (`.device`) and is
    refused where CUDA would refuse a CUDA generator."""

    def __new__(cls, device="cpu"):
        index = _target_index(device)
        gen = _REAL_GENERATOR.__new__(cls, device="cpu" if index is not None else device)
        if index is not None and index != HOST:
            _generator_tags[gen] = index
        return gen

    def __init__(self, device="cpu"):
        pass

    @property
    def device(self):
        index = _generator_tags.get(self)
        return torch.device("cpu", index) if index is not None else _REAL_GENERATOR.device.__get__(self)


class FakeAccelerator:
    """Active while entered (in this thread and in the threads started meanwhile)."""

    def __init__(self, index: int = 0):
        self.device = torch.device("cpu", index)
        self.syncs: list[Sync] = []
        # where page-locked host memory was allocated: CUDA's caching host allocator reuses a block once it is
        # freed, but each buffer held (a checkpoint's copy behind the loop) is a cudaHostAlloc of its own
        self.pins: list[str] = []
        self.markers: list[dict] = []
        self.label = "setup"
        self.run = 0
        self._patches: list[tuple[object, str, object]] = []
        self._local = threading.local()

    # -- what tests read ------------------------------------------------------------------------------
    def on_device(self, t) -> bool:
        return isinstance(t, torch.Tensor) and placement(t) not in (None, HOST)

    def is_host(self, t) -> bool:
        return isinstance(t, torch.Tensor) and placement(t) == HOST

    def sync(self, kind: str, op: str) -> None:
        self.syncs.append(Sync(kind, op, _where(), self.label, threading.current_thread().name, self.run))

    def mark(self, what: str, step: int | None = None) -> None:
        self.markers.append({"marker": what, "step": step, "run": self.run, "syncs_before": len(self.syncs)})

    def counted(self, label_prefix: str | None = None) -> list[Sync]:
        return [s for s in self.syncs if label_prefix is None or s.label.startswith(label_prefix)]

    # -- activation -------------------------------------------------------------------------------------
    def _patch(self, owner, name: str, value) -> None:
        self._patches.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    def _enter_modes(self) -> list:
        modes = [_FunctionMode(self), _DispatchMode(self)]
        for m in modes:
            m.__enter__()
        self._local.modes = modes
        return modes

    def _exit_modes(self) -> None:
        for m in reversed(getattr(self._local, "modes", [])):
            m.__exit__(None, None, None)
        self._local.modes = []

    @contextlib.contextmanager
    def suspended(self):
        """This thread without the modes: for torch.export (the ONNX exporter), which traces with modes of
        its own and refuses ours."""
        self._exit_modes()
        try:
            yield
        finally:
            self._enter_modes()

    def _same_side(self, what: str, tensors) -> None:
        """Raise CUDA's error if `tensors` are not all on one side (what exporting a model half on the GPU
        with inputs on the host does)."""
        sides = {placement(t) for t in tensors if isinstance(t, torch.Tensor)} - {None}
        if len(sides) > 1:
            a, b = sorted(sides, reverse=True)[:2]
            raise RuntimeError(MIXED.format(a=_name(a), b=_name(b)) + f" (fake accelerator: {what})")

    def __enter__(self) -> "FakeAccelerator":
        global _active
        if _active is not None:
            raise RuntimeError("a fake accelerator is already active")
        _active = self
        acc = self
        real_from_numpy, real_load, real_export = torch.from_numpy, torch.load, torch.onnx.export
        real_group, real_bootstrap = torch._C._group_tensors_by_device_and_dtype, threading.Thread._bootstrap_inner

        def from_numpy(array):  # not an overridable function: no mode sees it
            out = real_from_numpy(array)
            _tag(out, HOST)
            return out

        def load(f, map_location=None, **kw):  # storages are rebuilt below the modes; CPU cannot map to cpu:0
            index = _target_index(map_location) if isinstance(map_location, (str, torch.device)) else None
            out = real_load(f, map_location="cpu" if index is not None else map_location, **kw)
            if index is not None and index != HOST:  # asked for on the device: there. Loaded to the host: left
                _tag(out, index, overwrite=True)  # untagged (DCP reads into its targets' storage, device or not)
            return out

        def group(tensorlistlist, with_indices=False):  # torch's foreach grouping (optimizers, clip_grad_norm_)
            grouped = {}  # keyed by the device CUDA would name: clip_grad_norm_ moves its coefficient .to(key)
            for (dev, dtype), value in real_group(tensorlistlist, with_indices).items():
                first = next((t for ts in value[0] for t in ts if isinstance(t, torch.Tensor)), None)
                where = placement(first) if first is not None else None
                grouped[(torch.device("cpu", where) if where not in (None, HOST) else dev, dtype)] = value
            return grouped

        def onnx_export(model, args=(), *a, **k):  # the exporter traces outside the modes; its inputs are checked
            acc._same_side("torch.onnx.export", [*model.parameters(), *model.buffers(), *pytree.tree_leaves(args)])
            with acc.suspended():
                return real_export(model, args, *a, **k)

        def bootstrap(thread):  # threads started while active (checkpoint writers, servers) are watched too
            if _active is acc:
                acc._enter_modes()
            try:
                real_bootstrap(thread)
            finally:
                acc._exit_modes()

        self._patch(torch, "Generator", _Generator)
        self._patch(torch, "from_numpy", from_numpy)
        self._patch(torch, "load", load)
        self._patch(torch._C, "_group_tensors_by_device_and_dtype", group)
        self._patch(torch.onnx, "export", onnx_export)
        self._patch(threading.Thread, "_bootstrap_inner", bootstrap)
        self._patch_device_seam()
        self._enter_modes()
        return self

    def _patch_device_seam(self) -> None:
        """The package asks runtime.device whether an accelerator is there and which one a rank gets
        (patched as soon as that module exists: a process may import torch long before it)."""
        def patch(device_mod):
            if _active is self:
                self._patch(device_mod, "accelerator_available", lambda: True)
                self._patch(device_mod, "accelerator", lambda index=0: torch.device("cpu", index))
                self._patch(device_mod, "pinnable", lambda device: _target_index(device) not in (None, HOST))
                real_memory = device_mod.total_memory
                self._patch(device_mod, "total_memory", lambda device: FAKE_MEMORY_BYTES
                            if _target_index(device) not in (None, HOST) else real_memory(device))
                real_synchronize = device_mod.synchronize

                def synchronize(device=None):  # a wait on purpose (a phase's edge): counted like any other
                    if device is None or _target_index(device) not in (None, HOST):
                        self.sync("synchronize", "runtime.device.synchronize")
                    real_synchronize(device)

                self._patch(device_mod, "synchronize", synchronize)

        when_imported("trainers.runtime.device", patch)

        def fsdp_device(module):  # FSDP2 on a "cpu" mesh keeps its shards on the host; on CUDA, on the rank's GPU
            real = module._get_device_from_mesh

            def device_from_mesh(mesh):
                return self.device if mesh.device_type == "cpu" and _active is self else real(mesh)

            self._patch(module, "_get_device_from_mesh", device_from_mesh)

        when_imported("torch.distributed.fsdp._fully_shard._fully_shard", fsdp_device)

    def __exit__(self, *exc) -> None:
        global _active
        self._exit_modes()
        for owner, name, value in reversed(self._patches):
            setattr(owner, name, value)
        self._patches.clear()
        _active = None

    # -- a whole process (sitecustomize) ---------------------------------------------------------------
    def write_log(self, folder: str) -> None:
        path = Path(folder) / f"{os.getpid()}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"pid": os.getpid(), "rank": int(os.environ.get("RANK", "0")), "argv": sys.argv,
                  "syncs": [asdict(s) for s in self.syncs], "markers": self.markers}
        path.write_text(json.dumps(record))


def instrument_run(acc: FakeAccelerator) -> None:
    """Label what the run boundary is doing (as soon as trainers.runtime.run exists); see _instrument."""
    when_imported("trainers.runtime.run", lambda _module: _instrument(acc))


def _instrument(acc: FakeAccelerator) -> None:
    """Label what the run boundary is doing, so a sync can be told from a step's body (never allowed in a
    steady step) from the points where the loop waits on purpose: logging, evaluation, the stop agreement,
    checkpoints, the start and the end."""
    from trainers.runtime import run as run_mod
    from trainers.runtime import stops

    Run, Agreement = run_mod.Run, stops.StopAgreement
    real = {name: getattr(Run, name) for name in ("resume", "should_log", "should_eval", "step_done", "_save",
                                                  "finish", "timing", "restore_best")}
    real_agree = Agreement.agree

    def resume(self, *a, **k):
        acc.run += 1
        acc.label = "resume"
        start = real["resume"](self, *a, **k)
        acc.label = f"body {start.step + 1}"
        acc.mark("resume", start.step)
        return start

    def should_log(self, step, *a, **k):
        due = real["should_log"](self, step, *a, **k)
        if due:
            acc.label = self._fake_waits = f"log {step}"
        return due

    def should_eval(self, step, *a, **k):
        due = real["should_eval"](self, step, *a, **k)
        if due:
            acc.label = self._fake_waits = f"evaluation {step}"
        return due

    def step_done(self, step, *a, **k):
        # a log or evaluation step waits on purpose; asked of the run itself (an LSTM cohort's runs take
        # their steps in turn, so the last label set may be another run's)
        waits = getattr(self, "_fake_waits", None)
        acc.label = waits if waits in (f"log {step}", f"evaluation {step}") else f"step_done {step}"
        reason = real["step_done"](self, step, *a, **k)
        acc.label = f"body {step + 1}"
        acc.mark("step_done", step)
        return reason

    def labelled(name, label):
        def wrapper(self, *a, **k):
            before, acc.label = acc.label, label(self)
            try:
                return real[name](self, *a, **k)
            finally:
                acc.label = before
        return wrapper

    def agree(self, *a, **k):
        before = acc.label
        acc.label = "agree " + before.split(" ")[-1]
        acc.mark("agree", int(before.split(" ")[-1]) if before.split(" ")[-1].isdigit() else None)
        try:
            return real_agree(self, *a, **k)
        finally:
            acc.label = before

    def timing(self, phase):  # inside a step's body: the step it belongs to (Run.step is the last one done)
        acc.label = f"{phase} {acc.label.split(' ')[-1]}"
        return real["timing"](self, phase)

    acc._patch(Run, "resume", resume)
    acc._patch(Run, "should_log", should_log)
    acc._patch(Run, "should_eval", should_eval)
    acc._patch(Run, "step_done", step_done)
    acc._patch(Run, "_save", labelled("_save", lambda self: f"save {self.step}"))
    acc._patch(Run, "finish", labelled("finish", lambda self: "finish"))
    acc._patch(Run, "restore_best", labelled("restore_best", lambda self: "finish"))
    acc._patch(Run, "timing", timing)
    acc._patch(Agreement, "agree", agree)


def steady_step_syncs(record: dict | FakeAccelerator, first_steady: int = 2) -> list[dict]:
    """The syncs a steady step made: in the training thread, in the body of a step that completed (its
    step_done was reached) or in step_done outside the agreement and the saves, from step `first_steady`
    of each run on. `record`: a process's log (read_logs) or the accelerator itself."""
    if isinstance(record, FakeAccelerator):
        record = {"syncs": [asdict(s) for s in record.syncs], "markers": record.markers}
    completed = {(m["run"], m["step"]) for m in record["markers"] if m["marker"] == "step_done"}
    out = []
    for s in record["syncs"]:
        phase, _, step = s["label"].partition(" ")
        if phase in ("body", "step_done") and step.isdigit() and int(step) >= first_steady \
                and (s["run"], int(step)) in completed and s["thread"] == "MainThread":
            out.append(s)
    return out


def activate_for_process() -> FakeAccelerator:
    """What sitecustomize calls once torch is imported: the fake for the whole process (device index =
    LOCAL_RANK, as CUDA's would be), the run instrumented, the record written at exit."""
    # torch._dynamo's import, on torch below 2.10, maps builtins to tensor methods by calling them and asserts that no
    # torch-function mode took the call (the fake's would): imported first, before the fake's modes are entered
    if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 10):
        importlib.import_module("torch._dynamo")
    acc = FakeAccelerator(int(os.environ.get("LOCAL_RANK", "0"))).__enter__()
    instrument_run(acc)
    folder = os.environ.get("TRAINERS_FAKE_ACCELERATOR_LOG")
    if folder:
        atexit.register(acc.write_log, folder)
        real_exit = os._exit

        def leave(code):  # a program that skips Python's teardown (the GPT) still leaves its record
            acc.write_log(folder)
            real_exit(code)

        os._exit = leave
    return acc


def fake_env(log_dir: Path | None = None, base: dict | None = None) -> dict:
    """Environment for subprocesses (torchrun, the CLI, the deploy kit) that run under the fake accelerator."""
    env = dict(os.environ if base is None else base)
    env["TRAINERS_FAKE_ACCELERATOR"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    if log_dir is not None:
        env["TRAINERS_FAKE_ACCELERATOR_LOG"] = str(log_dir)
    return env


def read_logs(log_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(log_dir).glob("*.json"))]


if os.environ.get("TRAINERS_FAKE_ACCELERATOR") == "1" and getattr(sys.modules.get("sitecustomize"), "DEFERRED", False) \
        and _active is None:  # this module was imported before torch in a process the fake is on for
    activate_for_process()
