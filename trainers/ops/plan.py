"""`trainers plan`: memory, time and money for a trainer's job on a GPU, before a pod is rented.

Parameters are counted from the trainer's own model built on the meta device (no memory used).
Memory per GPU is itemised for DDP, FSDP2 (sharded over the GPUs) and FSDP2 with activation
checkpointing; a plan says whether each fits (with the headroom) and, when none does, the change
that makes it fit. Time comes from the model's FLOPs per step at an MFU taken from this repository's
committed GPU benchmark for that trainer and GPU when there is one, else a stated default labelled
as an assumption, plus the gradient traffic at the link's bus bandwidth (not assumed overlapped:
an upper bound). Money is device-hours at the price the user gives.

Every trainer describes its job with a `Workload` (its `size.py`: `workload(cfg) -> Workload`).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

from trainers.errors import UsageError
from trainers.ops.devices import DEVICES, TABLE_DATE, Device

GIB = 1 << 30
CONTEXT_BYTES = int(1.0 * GIB)  # CUDA context, cuBLAS/NCCL workspaces
FRAGMENTATION = 0.05  # the caching allocator's slack over what is live
DDP_BUCKETS_BYTES = 2 * 25 * (1 << 20)
DEFAULT_MFU = {"transformer": 0.40, "small": 0.10}  # assumptions when no benchmark of ours says otherwise
STRATEGIES = ("ddp", "ddp+ac", "fsdp", "fsdp+ac")


@dataclass
class Workload:
    """What a plan needs to know about one trainer's job (from `trainers/<name>/size.py`)."""

    trainer: str
    parameters: int
    n_blocks: int  # the repeated blocks FSDP2 shards one at a time
    block_parameters: int  # the largest block
    unit: str  # what an item is: samples, tokens, graphs, env steps
    items_per_micro: int  # per GPU per micro-batch
    grad_accum: int
    flops_per_item: float  # training FLOPs per item (3 x forward)
    activation_bytes: Callable[[int, bool], int]  # (micro-batch items, checkpointing) -> bytes per GPU
    kind: str = "transformer"  # which default MFU applies
    strategies: tuple = ("ddp",)  # what the trainer can run: FSDP2 and checkpointing only where it has them
    items_total: float | None = None  # what the config asks for (epochs x dataset, max tokens ...)
    shape: dict = field(default_factory=dict)  # the trainer's own size fields, for the report
    notes: list[str] = field(default_factory=list)
    extra_bytes: int = 0  # batch-independent memory on the device: datasets, rollout buffers, environments
    jobs_per_gpu: int = 1  # independent jobs (processes) sharing one GPU, each with its own model
    independent: bool = False  # the GPUs run separate jobs: no gradient traffic between them
    min_step_s: float = 0.0  # a floor on the step time (small models are bound by launches, not FLOPs)
    min_micro_step_s: float = 0.0  # the same floor per micro-batch, times the step's accumulation
    min_step_why: str = "ASSUMED: small models are bound by kernel launches and Python, not FLOPs"
    outside_steps_s: float = 0.0  # the job's time outside its steps, one worker's worth of it all (the LSTM's
    #                               per-symbol runs: folder, evaluations, checkpoints, results), shared by the workers
    global_batch_items: int | None = None  # a global batch fixed in items (the GPT's tokens): accumulation follows
    memory_fn: Callable[[str, int, int], dict] | None = None  # the trainer's own estimate (the GPT's size.py)
    # (one GPU's memory in bytes, workers, --items or None) -> the workload as a run sizes itself there: what the
    # trainer leaves to the device (PPO's environment batch, which follows the job's length too; the LSTM's cohorts)
    # follows the planned GPU, the workers sharing it and the items asked for
    for_device: Callable[[int, int, float | None], "Workload"] | None = None
    # a step compiled when the run is long enough for it to pay (the GNN's): steps -> (compiled, why), decided on
    # the plan's own step count (epochs, --items or --hours); a compile's seconds, every worker's own at once
    compiles: Callable[[float], tuple[bool, str]] | None = None
    compile_s: float = 0.0
    # the run's own optimizer steps for items_total, where a step holds fewer items than items_per_micro (the GNN
    # packs whole graphs up to its node budget, and no more steps an epoch than a rank has graphs): the plan's steps
    # and time are then counted in them, at the mean items a step (memory still at the budget)
    steps_total: float | None = None
    # the trainer's own layouts for `gpus` ranks, in its order of preference (None: STRATEGIES' order): the GPT
    # prefers FSDP to recomputation on several ranks, and its options (--activation-checkpointing, tied
    # embeddings) rule some out; the plan once picked ddp+ac where the run would take fsdp
    strategy_order: Callable[[int], tuple[str, ...]] | None = None
    # the trainer's own refusal of a job on `gpus` ranks (a global batch that does not divide, a step larger than
    # the training split): the plan once priced jobs the trainer refuses at its first line
    check_gpus: Callable[[int], None] | None = None
    # the items the run trains when a step holds this many (a --max-steps cap, per walk-forward fold): the
    # plan once counted every epoch of a run that stops at its --max-steps
    capped_items: Callable[[float], float] | None = None
    # the run's own end in time (its --max-hours, --budget-usd at --usd-per-gpu-hour): the plan once said nothing of
    # a GPT run given only --max-hours, and priced every epoch of one it stops sooner
    run_budget: tuple[float | None, float | None, float | None] = (None, None, None)


PLAN_GPU_MEMORY = 80 * 2**30  # the card a workload is sized for until the plan names its GPU (Workload.for_device)


def memory(w: Workload, strategy: str, gpus: int, compute_bytes: int, items_per_micro: int | None = None) -> dict:
    """Bytes per GPU, itemised. AdamW with a bf16/fp16 autocast keeps fp32 weights, fp32 grads and two
    fp32 moments (16 bytes per parameter); FSDP2 shards all of it over the GPUs and gathers one block
    (plus the next, prefetched) in the compute dtype at a time."""
    micro = items_per_micro or w.items_per_micro
    if w.memory_fn is not None:
        return w.memory_fn(strategy, gpus, micro)
    n = w.parameters
    shard = gpus if strategy.startswith("fsdp") else 1
    out = {"weights": 4 * n // shard, "grads": 4 * n // shard, "optimizer": 8 * n // shard}
    if not strategy.startswith("fsdp"):
        out["compute_copies"] = compute_bytes * n if compute_bytes < 4 else 0  # autocast's cast weights
        out["buffers"] = DDP_BUCKETS_BYTES
    else:
        # two blocks unsharded in the compute dtype (current + prefetched), one block's fp32 grads
        out["compute_copies"] = 2 * compute_bytes * w.block_parameters
        out["buffers"] = 4 * w.block_parameters
    out["activations"] = int(w.activation_bytes(micro, strategy.endswith("+ac")))
    out["data_and_buffers"] = w.extra_bytes
    live = sum(out.values())
    out["overhead"] = CONTEXT_BYTES + int(FRAGMENTATION * live)
    if w.jobs_per_gpu > 1:  # K processes on one GPU: K models, K CUDA contexts
        out = {k: v * w.jobs_per_gpu for k, v in out.items()}
    out["total"] = sum(v for k, v in out.items() if k != "total")
    return out


def measured_mfu(trainer: str, device: Device, root: Path | None = None, parameters: int | None = None,
                 items_per_step: int | None = None) -> float | None:
    """The MFU the committed GPU benchmarks of ours measured for this trainer on this device, if any: the median
    of the runs that measured it (`measured_runs`)."""
    runs = measured_runs(trainer, device, root=root, parameters=parameters, items_per_step=items_per_step)
    return statistics.median(runs) if runs else None


def measured_runs(trainer: str, device: Device, root: Path | None = None, parameters: int | None = None,
                  items_per_step: int | None = None) -> list[float]:
    """The runs' MFUs of `measured_configuration` (its docstring)."""
    return measured_configuration(trainer, device, root=root, parameters=parameters, items_per_step=items_per_step)[0]


def measured_configuration(trainer: str, device: Device, root: Path | None = None, parameters: int | None = None,
                           items_per_step: int | None = None) -> tuple[list[float], int | None]:
    """The MFU each committed GPU benchmark run of ours measured for this trainer on this device, one value a
    run (a file), sorted (empty when none did), and the parameters of the model they measured (None where the
    runs do not say).

    A benchmark holds rows of several sizes (presets, GPT depths), and MFU grows with size: given the
    planned model's `parameters`, the rows nearest to it in size (by ratio) decide, not the best row of
    any size, which would promise a small model the MFU of a large one. Among those, given the planned
    step's `items_per_step`, the rows nearest to it in step size decide where rows record theirs (a small
    model is bound by launches: 64 environments a step use the card far less than 1,024, and a plan
    for either must not take the other's MFU). Rows without a size decide only when no row has one.
    A configuration is a size, a step and whether the run compiled (where its record says). Each run (a file)
    of a configuration counts once, with its best row; the configuration's MFU is the median of its runs, and
    the best configuration's runs are returned (the compiled one a GPU deploy runs, where it is the faster).
    The median, not the best run: the same configuration measured on two H200s gave the GNN 8.7 M and 7.6 M
    nodes/s (bench/results/gpu_h200/run_gnn_gpu.runs.json, runs 2 and 3), and the best of them promised every user the
    luckier machine."""
    root = root or Path(__file__).resolve().parents[2] / "bench" / "results"
    rows: list[tuple[float, int | None, int | None, bool | None, tuple]] = []  # (mfu, parameters, items a step,
    # compiled or not, the run: its file and its place in it)
    # in any folder below (a device's folder: bench/results/gpu_h200); a benchmark run in several sessions keeps
    # every run in one `<name>.runs.json` ({"benchmark": "runs", "runs": [record, ...]}), each run counted once
    for path in sorted(root.rglob(f"*{trainer}*gpu*.json")) + sorted(root.rglob("train_gpu*.json")):
        try:
            stored = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(stored, dict):  # a file rewritten on a machine we do not control: skip, never stop
            continue
        runs = stored.get("runs") if stored.get("benchmark") == "runs" else [stored]
        for place, record in enumerate(runs if isinstance(runs, list) else []):
            if isinstance(record, dict):
                rows += _mfu_rows(record, trainer, device, (path, place))
    for given, at in ((parameters, 1), (items_per_step, 2)):
        sized = [r for r in rows if r[at] is not None]
        if given is not None and given > 0 and sized:  # (a size that is not one matches every row)
            nearest = min(abs(math.log(r[at] / given)) for r in sized)
            rows = [r for r in sized if abs(math.log(r[at] / given)) == nearest]
    # a configuration: a size, a step and whether it compiled (a run that does not say joins the compiled runs of its
    # size and step, else the eager ones); each run of it counts once (its best row)
    flagged = {(size, step, compiled) for _value, size, step, compiled, _path in rows if compiled is not None}
    runs: dict[tuple, dict[tuple, float]] = {}
    for value, size, step, compiled, path in rows:
        if compiled is None:
            compiled = True if (size, step, True) in flagged else False if (size, step, False) in flagged else None
        per_run = runs.setdefault((size, step, compiled), {})
        per_run[path] = max(value, per_run.get(path, 0.0))
    medians = {key: statistics.median(values.values()) for key, values in runs.items()}
    best = max(medians, key=medians.get, default=None)
    return (sorted(runs[best].values()), best[0]) if best is not None else ([], None)


def _mfu_rows(record: dict, trainer: str, device: Device, run: tuple) -> list[tuple]:
    """One benchmark run's rows that measured this trainer's MFU on this device: (mfu, parameters, items a step,
    compiled or not, the run)."""
    rows: list[tuple] = []
    name = str(record.get("device", ""))
    if record.get("trainer", trainer) != trainer or device.name.split(" (")[0].upper() not in name.upper():
        return rows
    training = record.get("training") if isinstance(record.get("training"), dict) else {}
    table = record.get("results") or record.get("rows")  # train_throughput's presets; gpt_throughput's runs
    for row in table if isinstance(table, list) else []:
        if not isinstance(row, dict):
            continue
        measured = row.get("kit") if isinstance(row.get("kit"), dict) else row
        value, size = measured.get("mfu"), measured.get("parameters") or row.get("parameters")
        compiled = _compiled(row.get("compile"), record.get("compile"), training.get("compiled"))
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0:
            rows.append((float(value), _positive_int(size), _positive_int(row.get("items_per_step")), compiled, run))
    return rows


def _compiled(*said) -> bool | None:
    """Whether a benchmark run compiled its step, by the first of its record's words that says: a row's `compile`
    (gpt_throughput's "on"/"off"), train_throughput's `compile`, a trainer run's `training.compiled`; None when none
    does."""
    for value in said:
        if isinstance(value, bool):
            return value
        if value in ("on", "off"):
            return value == "on"
    return None


def _positive_int(value) -> int | None:
    """A size a row records (parameters, items a step): a finite number >= 1, else none (a garbled file)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 1
    return int(value) if ok else None


def step_time(w: Workload, strategy: str, gpus: int, device: Device, mfu: float, grad_accum: int | None = None,
              busbw_gbps: float | None = None) -> dict:
    accum = grad_accum or w.grad_accum
    if w.global_batch_items:  # fixed in items: the micro-steps per step follow the number of GPUs
        accum = max(1, w.global_batch_items // (w.items_per_micro * gpus))
    items = w.items_per_micro * accum * gpus * w.jobs_per_gpu
    if w.steps_total and w.items_total:  # a step's items as the run holds them, not its budget (as memory counts)
        items = w.items_total / w.steps_total
    # K small jobs packed on a GPU each get their own share of it (the MFU covers the packing)
    compute = w.flops_per_item * items / (gpus * device.peak_tflops * 1e12 * mfu)
    busbw = (busbw_gbps or device.busbw_gbps) * 1e9
    ring = 2 * (gpus - 1) / gpus if gpus > 1 else 0.0
    if not strategy.startswith("fsdp"):
        traffic = ring * 4 * w.parameters  # fp32 gradients, all-reduced once per step
    else:  # per micro-batch: gather bf16 params for forward and backward, reduce-scatter fp32 grads
        traffic = accum * ring / 2 * (2 * 2 * w.parameters + 4 * w.parameters)
    comm = traffic / busbw if gpus > 1 and not w.independent else 0.0
    if strategy.endswith("+ac"):  # each block's forward runs again in the backward: 4 forwards' FLOPs, not 3
        compute *= 4 / 3
    step = max(compute + comm, w.min_step_s, w.min_micro_step_s * accum)
    return {"items_per_step": items, "compute_s": compute, "communication_s": comm, "step_s": step,
            "launch_bound": step > compute + comm, "items_per_s": items / step}


@dataclass
class Plan:
    trainer: str
    device: str
    gpus: int
    parameters: int
    strategies: dict
    chosen: str | None
    fix: str | None
    time: dict
    money: dict
    mfu: dict
    assumptions: list[str]
    shape: dict

    def to_json(self) -> dict:
        return asdict(self)


def plan(w: Workload, device: Device, gpus: int, parallel: str = "auto", compute_bytes: int | None = None,
         usd_per_gpu_hour: float | None = None, items: float | None = None, hours: float | None = None,
         budget_usd: float | None = None, mfu: float | None = None) -> Plan:
    if gpus < 1:
        raise UsageError(f"--gpus {gpus} must be >= 1")
    if w.check_gpus is not None:
        w.check_gpus(gpus)
    if w.for_device is not None:  # (the run's budget is the command's, not the device's)
        w = replace(w.for_device(int(device.memory_gib * GIB), gpus * w.jobs_per_gpu, items), run_budget=w.run_budget)
    compute_bytes = compute_bytes or 2  # bf16 autocast (fp16 + a scaler on chips without bf16)
    assumptions = [f"device table of {TABLE_DATE}: {device.name}, {device.memory_gib:g} GiB, "
                   f"{device.peak_tflops:g} TFLOP/s dense peak, all-reduce bus bandwidth {device.busbw_gbps:g} GB/s "
                   f"({device.link}; assumed, not measured here)"]
    strategies = {}
    usable = device.memory_gib * GIB
    order = w.strategy_order(gpus) if w.strategy_order else tuple(s for s in STRATEGIES if s in w.strategies)
    if parallel != "auto" and parallel not in order:
        raise UsageError(f"--parallel {parallel}: the {w.trainer} trainer runs {', '.join(order)} here")
    for s in STRATEGIES:
        m = memory(w, s, gpus, compute_bytes)
        strategies[s] = {"memory_bytes": m, "fits": m["total"] <= usable, "supported": s in order,
                         "headroom_bytes": int(usable - m["total"])}
    if parallel == "auto":
        chosen = next((s for s in order if strategies[s]["fits"]), None)
    else:
        chosen = parallel if strategies[parallel]["fits"] else None
    fix = None if chosen else suggest_fix(w, device, gpus, compute_bytes, parallel)
    runs, measured_size = measured_configuration(w.trainer, device, parameters=w.parameters,
                                                 items_per_step=w.items_per_micro)
    measured = statistics.median(runs) if runs else None
    other_size = measured_size and not 0.5 <= measured_size / w.parameters <= 2
    carried = None if mfu or measured or w.kind != "small" else carried_mfu(w, device)
    used_mfu = mfu or measured or (carried[0] if carried else DEFAULT_MFU.get(w.kind, 0.3))
    source = ("given" if mfu else "measured by this repository's GPU benchmark" + _spread(runs) + (
        f", for a model of {measured_size:,} parameters (this one has {w.parameters:,}: ASSUMED to carry over)"
        if other_size else "") if measured else
              f"ASSUMED: {w.unit}/s as measured on {carried[1]} (a small model is bound by launches, not by the "
              f"card's FLOPs)" if carried else
              f"ASSUMED (no GPU benchmark of ours for {w.trainer} on {device.key}; default for {w.kind} models)")
    t = step_time(w, chosen or ("ddp" if parallel == "auto" else parallel), gpus, device, used_mfu)
    t["strategy"] = chosen
    if t["launch_bound"]:
        t["step_floor_why"] = w.min_step_why
    total_items = items if items is not None else w.items_total
    money, timing = {"usd_per_gpu_hour": usd_per_gpu_hour}, dict(t)
    if budget_usd is not None:
        if not usd_per_gpu_hour:
            raise UsageError("--budget-usd needs --usd-per-gpu-hour > 0 to turn money into hours")
        hours = budget_usd / (usd_per_gpu_hour * gpus)
    outside = w.outside_steps_s / (gpus * w.jobs_per_gpu)  # wall seconds of it: the workers share it
    notes = list(w.notes)
    if w.compiles is not None:  # as the run decides, on the steps it would train
        steps = (t["items_per_s"] * max(hours * 3600 - outside, 0.0) if hours is not None else total_items or 0.0) \
            / t["items_per_step"]
        compiled, why = w.compiles(steps)
        notes.append(f"training step {why}" + ("; the compile counted outside the steps" if compiled else ""))
        outside += w.compile_s if compiled else 0.0
    if outside:
        timing["outside_steps_s"] = outside
    max_hours, run_usd, run_price = w.run_budget
    run_hours = min([h for h in (max_hours, run_usd / (run_price * gpus) if run_usd and run_price else None) if h],
                    default=None)
    if run_hours is not None and items is None and (
            (hours is None and (not total_items or total_items / t["items_per_s"] + outside > run_hours * 3600))
            or (hours is not None and hours > run_hours)):
        hours = run_hours  # (the plan's own --hours or --budget-usd: what it asks for, the run stops sooner)
        notes.append(f"the run's own budget (--max-hours, --budget-usd) ends it after {duration(run_hours)}")
    cap = w.capped_items(t["items_per_step"]) if w.capped_items is not None and items is None else None
    if cap is not None and total_items is not None and cap < total_items:
        total_items = cap
        notes.append("the run stops at its own end (--max-steps, or the GPT's --max-tokens), before the rest of "
                     "its epochs")
    if hours is not None and cap is not None and cap < t["items_per_s"] * max(hours * 3600 - outside, 0.0):
        notes.append(f"its own end (--max-steps, --max-tokens) comes after "
                     f"{duration((cap / t['items_per_s'] + outside) / 3600)}, before the {duration(hours)} asked for")
        hours = None
        total_items = cap
    if hours is not None:
        timing["hours"] = hours
        timing["items"] = t["items_per_s"] * max(hours * 3600 - outside, 0.0)
        timing["steps"] = timing["items"] / t["items_per_step"]
    elif total_items:
        timing["items"] = total_items
        timing["hours"] = (total_items / t["items_per_s"] + outside) / 3600
        timing["steps"] = total_items / t["items_per_step"]
    if "hours" in timing:
        money["device_hours"] = timing["hours"] * gpus
        money["usd"] = money["device_hours"] * usd_per_gpu_hour if usd_per_gpu_hour is not None else None
    return Plan(w.trainer, device.key, gpus, w.parameters, strategies, chosen, fix, timing, money,
                {"value": used_mfu, "source": source}, assumptions + notes, w.shape)


def _spread(runs: list[float]) -> str:
    """How far apart the runs behind a measured MFU were (nothing for one run)."""
    if len(runs) < 2:
        return ""
    return f" (the median of {len(runs)} runs: {percent(runs[0], 3)} to {percent(runs[-1], 3)})"


def percent(mfu: float, figures: int = 2) -> str:
    """An MFU in words, to `figures` significant figures (a small model's 0.17 % is not "0%"; 42 % is not 42.00)."""
    value = 100 * mfu
    if not value > 0 or not math.isfinite(value):
        return f"{value:g}%"
    return f"{value:.{max(0, figures - 1 - math.floor(math.log10(value)))}f}%"


def carried_mfu(w: Workload, device: Device) -> tuple[float, str] | None:
    """A small model's rate measured on another card, as this card's MFU: the same items a second (its steps are
    launches and host work, which a card's FLOPs do not speed up), the slowest where several cards have one.
    Its assumed default MFU promised the H100 1.6 M env steps/s of PPO against 79,401 measured there."""
    from trainers.ops.devices import DEVICES

    rates = []
    for other in DEVICES.values():
        if other.name.split(" (")[0] == device.name.split(" (")[0]:
            continue  # its own measurement, had it one, was measured_mfu's
        mfu = measured_mfu(w.trainer, other, parameters=w.parameters, items_per_step=w.items_per_micro)
        if mfu:
            rates.append((mfu * other.peak_tflops, other.key))
    if not rates:
        return None
    rate, key = min(rates)
    return rate / device.peak_tflops, key


def suggest_fix(w: Workload, device: Device, gpus: int, compute_bytes: int, parallel: str) -> str:
    """The smallest change that makes the job fit, in the order a user would try them."""
    usable = device.memory_gib * GIB

    def fits(s, g, micro) -> bool:
        return s in w.strategies and memory(w, s, g, compute_bytes, micro)["total"] <= usable

    if parallel in ("ddp", "auto") and fits("fsdp", gpus, None):
        return "use FSDP2 (--parallel fsdp): weights, grads and optimizer state sharded over the GPUs"
    if parallel in ("ddp", "fsdp") and fits("fsdp+ac", gpus, None):
        return "use FSDP2 with activation checkpointing (--parallel fsdp with checkpointing, or auto)"
    micro = w.items_per_micro
    while micro > 1:
        micro //= 2
        for s in STRATEGIES:
            if fits(s, gpus, micro):
                factor = w.items_per_micro // micro
                return (f"a micro-batch {factor}x smaller with {factor}x gradient accumulation (same global batch) "
                        f"under {s}")
    for more in (2, 4, 8, 16, 32, 64, 128, 256):
        best = next((s for s in reversed(STRATEGIES) if s in w.strategies), "ddp")
        if more > gpus and best != "ddp" and fits(best, more, 1):
            return f"at least {more} GPUs of this kind with {best} at a micro-batch of 1 (a smaller model fits fewer)"
    if "ddp" in w.strategies and w.strategies == ("ddp",):
        return ("a smaller model or a GPU with more memory: this trainer replicates the model on every GPU (DDP), "
                "so more GPUs do not help memory")
    return "a smaller model: even sharded over 256 GPUs with checkpointing it does not fit"


def duration(hours: float) -> str:
    if hours >= 1:
        return f"{hours:,.2f} h"
    seconds = hours * 3600
    return f"{hours * 60:,.1f} min" if seconds >= 60 else f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.2g} s"


COLUMN = 17  # wide enough for "NO, 1,234.5 over" and a space between columns


def format_plan(p: Plan, w: Workload) -> str:
    gib = lambda b: f"{b / GIB:,.1f} GiB"  # noqa: E731
    shown = [s for s in STRATEGIES if p.strategies[s]["supported"]]
    lines = [f"{p.trainer} on {p.gpus} x {DEVICES[p.device].name}: {p.parameters:,} parameters"
             + (f" ({', '.join(f'{k} {v}' for k, v in p.shape.items())})" if p.shape else "")]
    lines.append(f"{'memory per GPU':<18}" + "".join(f"{s:>{COLUMN}}" for s in shown))
    items = [k for k in p.strategies[shown[0]]["memory_bytes"] if k != "total"] + ["total"]
    for item in items:
        lines.append(f"  {item:<16}" + "".join(f"{gib(p.strategies[s]['memory_bytes'][item]):>{COLUMN}}" for s in shown))

    def headroom(s: str) -> str:
        st = p.strategies[s]
        amount = f"{abs(st['headroom_bytes']) / GIB:,.1f}"
        return f"yes, {amount} free" if st["fits"] else f"NO, {amount} over"

    lines.append(f"  {'fits (GiB)':<16}" + "".join(f"{headroom(s):>{COLUMN}}" for s in shown))
    lines.append(f"plan: {p.chosen}" if p.chosen else f"does NOT fit: {p.fix}")
    t = p.time
    lines.append(f"step: {t['items_per_step']:,.0f} {w.unit} (the global batch, over all {p.gpus} GPU(s)), compute {t['compute_s'] * 1e3:,.1f} ms + gradient "
                 f"traffic {t['communication_s'] * 1e3:,.1f} ms at MFU {percent(p.mfu['value'])} ({p.mfu['source']})"
                 + (f", but at least {t['step_s'] * 1e3:.0f} ms a step ({t.get('step_floor_why', w.min_step_why)})"
                    if t.get("launch_bound") else "")
                 + f"; {t['items_per_s']:,.0f} {w.unit}/s")
    if "hours" in t:
        usd = p.money.get("usd")
        lines.append(f"job: {t['items']:,.4g} {w.unit} = {t['steps']:,.0f} steps in {duration(t['hours'])} = "
                     f"{p.money['device_hours']:,.1f} device-hours" + (f" = ${usd:,.2f}" if usd is not None else
                                                                        " (give --usd-per-gpu-hour for the cost)"))
        if t.get("outside_steps_s"):
            lines.append(f"  of which {t['outside_steps_s']:,.0f} s outside the training steps (what the notes "
                         f"below count: per-run set-up, a compile, evaluations, checkpoints, results)")
    for a in p.assumptions:
        lines.append(f"  note: {a}")
    return "\n".join(lines)


def compare(w: Workload, gpus: int, parallel: str, prices: dict[str, float], items: float | None, hours: float | None,
            mfu: float | None) -> list[dict]:
    """The same job on every known GPU that has a price, cheapest first (those that do not fit last)."""
    rows = []
    for key, device in DEVICES.items():
        p = plan(w, device, gpus, parallel, usd_per_gpu_hour=prices.get(key), items=items, hours=hours, mfu=mfu)
        rows.append({"device": key, "fits": p.chosen is not None, "strategy": p.chosen, "fix": p.fix,
                     "items_per_s": p.time["items_per_s"], "hours": p.time.get("hours"),
                     "usd": p.money.get("usd"), "usd_per_gpu_hour": prices.get(key), "mfu": p.mfu})
    # compared at 2 significant figures, as far as a plan is right (its LSTM jobs 0.82x-0.85x of the H200's, the
    # GNN's runs 0.86x-1.12x): cards that differ by less (a launch-bound small model plans within 0.5 % on every
    # card) keep the device table's order, not one that changes with the last bits of a constant
    return sorted(rows, key=lambda r: (not r["fits"], _rounded(r["usd"]), _rounded(r["hours"])))


def _rounded(value: float | None) -> float:
    return float(f"{value:.2g}") if value is not None and math.isfinite(value) else math.inf


# ---- small models: count on the real model, on the CPU, at batch 1 -----------------------------------

def saved_bytes(model, inputs: tuple, autocast_dtype=None) -> int:
    """Bytes autograd saves for backward in one forward of `model` on `inputs` (each tensor once;
    parameters not counted), under CPU autocast to `autocast_dtype` when given."""
    import torch

    params = {p.data_ptr() for p in model.parameters()}
    seen, total = set(), [0]

    def pack(t):
        if t.data_ptr() not in seen and t.data_ptr() not in params:
            seen.add(t.data_ptr())
            total[0] += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if autocast_dtype is None:
            model(*inputs)
        else:
            with torch.autocast("cpu", dtype=autocast_dtype):
                model(*inputs)
    return total[0]


def saved_bytes_per_item(model, make_inputs: Callable[[int], tuple], batches: tuple[int, int] = (32, 96),
                         autocast_dtype=None) -> float:
    """Bytes autograd saves for backward per item of the batch (`saved_bytes`' slope between two
    batch sizes: batch-independent saves, like cast weights, drop out). Activations are linear in
    the batch, so this extrapolates to any micro-batch."""
    small, large = batches
    return (saved_bytes(model, make_inputs(large), autocast_dtype)
            - saved_bytes(model, make_inputs(small), autocast_dtype)) / (large - small)


def forward_flops(model, inputs: tuple) -> float:
    """Matmul FLOPs of one forward: torch's FlopCounterMode, plus the recurrent layers it does not
    count (an LSTM step is 4 gates x 2 x hidden x (input + hidden) per layer)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    extra = [0.0]

    def count_lstm(module, args, _out):
        x = args[0]
        steps = x.shape[0] * x.shape[1] if x.dim() == 3 else x.shape[0]
        h, size_in = module.hidden_size, module.input_size
        for layer in range(module.num_layers):
            extra[0] += steps * 8 * h * ((size_in if layer == 0 else h) + h)

    hooks = [m.register_forward_hook(count_lstm) for m in model.modules() if isinstance(m, torch.nn.LSTM)]
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return float(counter.get_total_flops()) + extra[0]
