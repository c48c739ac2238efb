"""The bodies of `trainers plan` and `trainers package` (their flags: trainers/ops/cli.py)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from trainers.errors import UsageError
from trainers.ops.devices import DEVICES, TABLE_DATE
from trainers.ops.package import package_run
from trainers.ops.plan import compare, duration, format_plan, plan
from trainers.ops.status import read_capped
from trainers.registry import trainer_config, trainer_module
from trainers.runtime.config import FLOAT_MAX, check_folder_writable
from trainers.runtime.files import atomic_write_json


def load_workload(trainer: str, options: list[str]):
    cfg = trainer_config(trainer, options)
    cfg.validate()  # every value checked (types, ranges, choices) before it is sized
    try:
        trainer_module(trainer, "size")
    except ModuleNotFoundError:
        raise UsageError(f"the {trainer} trainer has no plan yet (no trainers/{trainer}/size.py)") from None
    return workload_of(trainer, cfg)


def workload_of(trainer: str, cfg):
    """The trainer's workload for `cfg`, with the run's own end in time (`trainers plan` and preflight alike)."""
    w = trainer_module(trainer, "size").workload(cfg)
    w.run_budget = (getattr(cfg, "max_hours", None), getattr(cfg, "budget_usd", None),
                    getattr(cfg, "usd_per_gpu_hour", None))
    return w


PRICES_CAP = 64 << 10
MAX_PRICE = FLOAT_MAX  # what --usd-per-gpu-hour accepts (every number option's cap)


def read_prices(path: str | None, fallback: float | None, gpu: str) -> dict[str, float]:
    if path is None:
        return {gpu: fallback} if fallback else {}
    try:  # (/dev/zero or a FIFO would be read without end)
        data = json.loads(read_capped(Path(path), PRICES_CAP, f"--prices {path}", "give a JSON file of GPU -> USD "
                                      "per hour, a few lines"))
    except (OSError, ValueError, RecursionError) as exc:
        raise UsageError(f"--prices {path}: not a readable JSON object of GPU -> USD per hour ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"--prices {path}: not a JSON object of GPU -> USD per hour")
    prices = {}
    for key, value in data.items():
        if key.startswith("_"):
            continue
        if key not in DEVICES:
            raise UsageError(f"--prices {path}: unknown GPU {key!r}; known: {', '.join(DEVICES)}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0 \
                or value > MAX_PRICE:
            raise UsageError(f"--prices {path}: the price of {key} is {value!r}; need a number > 0 and at most "
                             f"{MAX_PRICE:g} (USD per GPU-hour)")
        prices[key] = float(value)
    return prices


def plan_command(args) -> int:
    if args.list_gpus:
        print(f"known GPUs (table of {TABLE_DATE}):")
        for d in DEVICES.values():
            print(f"  {d.key:<11} {d.name:<30} {d.memory_gib:>5g} GiB  {d.peak_tflops:>6g} TFLOP/s  {d.link}")
        return 0
    if args.gpu not in DEVICES:
        raise UsageError(f"--gpu {args.gpu!r} is not one of: {', '.join(DEVICES)}")
    if sum(x is not None for x in (args.items, args.hours, args.budget_usd)) > 1:
        raise UsageError("give one of --items/--tokens, --hours or --budget-usd")
    if args.json:  # before the plan is printed: a refusal after it read as if the plan had failed
        check_folder_writable(Path(args.json).parent, "--json")
        if Path(args.json).is_dir():
            raise UsageError(f"--json {args.json} is a folder; give a file name")
    w = load_workload(args.trainer, args.extra)
    if args.compare:
        prices = read_prices(args.prices, args.usd_per_gpu_hour, args.gpu)
        rows = compare(w, args.gpus, args.parallel, prices, args.items, args.hours, args.mfu)
        print(f"{args.trainer} on {args.gpus} GPUs of each kind ({w.parameters:,} parameters); prices "
              f"{'from ' + args.prices if args.prices else 'given for ' + args.gpu if prices else 'not given'}")
        print(f"{'gpu':<11}{'fits':>6}{'strategy':>10}{'items/s':>14}{'time':>11}{'$/GPU-h':>9}{'cost $':>12}")
        for r in rows:  # a price not given, a cost not known: "-", not 0.00 and nan
            price, usd = r["usd_per_gpu_hour"], r["usd"]
            print(f"{r['device']:<11}{'yes' if r['fits'] else 'NO':>6}{r['strategy'] or '-':>10}"
                  f"{r['items_per_s']:>14,.0f}{duration(r['hours']) if r['hours'] is not None else '-':>11}"
                  f"{f'{price:.2f}' if price is not None else '-':>9}{f'{usd:,.2f}' if usd is not None else '-':>12}")
        out = {"trainer": args.trainer, "gpus": args.gpus, "parameters": w.parameters, "rows": rows,
               "prices_from": args.prices or ("--usd-per-gpu-hour" if prices else None)}
    else:
        p = plan(w, DEVICES[args.gpu], args.gpus, args.parallel, usd_per_gpu_hour=args.usd_per_gpu_hour,
                 items=args.items, hours=args.hours, budget_usd=args.budget_usd, mfu=args.mfu)
        print(format_plan(p, w))
        out = p.to_json()
        optimal = getattr(trainer_module(args.trainer, "size"), "compute_optimal", None)
        if optimal is not None and (args.hours or args.budget_usd):
            out["compute_optimal"] = optimal(p, DEVICES[args.gpu])
            print(out["compute_optimal"]["line"])
    if args.json:  # the torch it ran with: small models' activations are measured on it (plan.saved_bytes), and
        # another release saves other tensors (nn.LSTM: 147 MB at 2.13, 181 MB at 2.7 for the same 500-symbol plan)
        from trainers.runtime.info import kit_commit, versions
        from trainers.versions import installed_release

        # and where the plan was made: the commit of the code that planned it and its versions (issue 66)
        atomic_write_json(Path(args.json), {**out, "measured_with_torch": installed_release("torch", 2),
                                            "run": {"git_commit": kit_commit(), "versions": versions()}})
    return 0


def package_command(args) -> int:
    info = package_run(args.run_dir, args.output, args.allow_edited)
    for warning in info.get("warnings", []):
        print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(info))
    return 0
