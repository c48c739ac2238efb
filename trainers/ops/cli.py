"""`trainers preflight`, `status`, `plan`, `remote`, `nodes` and `package`: flags only (the work: `commands.py` for plan and
package, `preflight.py` and `status.py` for theirs)."""

from __future__ import annotations

import argparse

from trainers.ops.nodes import add_command as add_nodes_command  # light: torch when the verb runs
from trainers.ops.preflight import add_args as add_preflight_args  # light: no torch at import
from trainers.runtime.config import number


def _preflight(args) -> int:
    from trainers.ops.preflight import main

    return main(args)


def _status(args) -> int:
    from trainers.ops.status import main

    return main(args)


def _plan(args) -> int:
    from trainers.ops.commands import plan_command

    return plan_command(args)


def _package(args) -> int:
    from trainers.ops.commands import package_command

    return package_command(args)


def _remote_push(args) -> int:
    from trainers.ops.remote import push

    return push(args)


def _remote_status(args) -> int:
    from trainers.ops.remote import status

    return status(args)


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="check GPUs, driver, NCCL bandwidth, /dev/shm, disk and memory for a trainer")
    add_preflight_args(p)
    p.set_defaults(func=_preflight)

    p = sub.add_parser("status", help="where a deployed job stands: phase, step, losses, speed, money, GPUs")
    p.add_argument("--out", default="output", help="the deploy's output folder (default: output)")
    p.add_argument("--trainer", default=None, help="which trainer's job (default: every job in --out)")
    p.add_argument("--json", action="store_true", help="one JSON object (a list for several jobs)")
    p.set_defaults(func=_status)

    p = sub.add_parser("plan", help="memory, time and money of a trainer's job on a GPU, before renting one",
                       description="Memory per GPU (DDP, FSDP2, FSDP2 + checkpointing), time and cost of a job. "
                                   "Any other option is the trainer's own, as `trainers <trainer> train` takes it "
                                   "(e.g. --depth 64, --preset 151m, --batch-size 4).")
    p.add_argument("--trainer", default="forecast", help="which trainer (default: forecast)")
    p.add_argument("--gpus", type=number(int, min=1), default=8, help="GPUs (default: 8)")
    p.add_argument("--gpu", default="h100-sxm", help="GPU kind (see --list-gpus; default: h100-sxm)")
    p.add_argument("--list-gpus", action="store_true", help="print the known GPUs and exit")
    p.add_argument("--parallel", default="auto", choices=("auto", "ddp", "ddp+ac", "fsdp", "fsdp+ac"),
                   help="auto: the first layout the trainer runs that fits; or one to check")
    p.add_argument("--usd-per-gpu-hour", type=number(float, gt=0), default=None, help="price of one GPU-hour")
    p.add_argument("--items", "--tokens", dest="items", type=number(float, gt=0), default=None,
                   help="what to train on, in the trainer's unit: tokens (gpt), samples (forecast, lstm), nodes "
                        "(gnn: graphs x their nodes), env steps (ppo) (default: what the trainer's options ask for)")
    p.add_argument("--hours", type=number(float, gt=0), default=None, help="how long: what it buys")
    p.add_argument("--budget-usd", type=number(float, gt=0), default=None, help="how much money: what it buys")
    p.add_argument("--mfu", type=number(float, gt=0, max=1), default=None, help="override the MFU (0-1)")
    p.add_argument("--compare", action="store_true", help="the same job on every known GPU, cheapest first")
    p.add_argument("--prices", default=None, help="JSON {gpu: USD per GPU-hour} for --compare")
    p.add_argument("--json", default=None, help="also write the plan here as JSON")
    p.set_defaults(func=_plan, accepts_extra=True)

    p = sub.add_parser("remote", help="a run folder and its --remote copy: push files to it, or the job's status "
                                      "read from it (from any machine)")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="verb")
    v = verbs.add_parser("push", help="upload the run folder's files (and --file ones under package/), then wait")
    v.add_argument("--run-dir", default=None)
    v.add_argument("--remote", required=True, help="the run's --remote URL")
    v.add_argument("--file", action="append", default=[], help="also upload this file to <remote>/package/")
    v.add_argument("--state", default=None, help="only this deploy state file, as <remote>/deploy.state")
    v.add_argument("--wait-s", type=number(float, min=0), default=300.0, help="wait at most this long (default 300)")
    v.set_defaults(func=_remote_push)
    v = verbs.add_parser("status", help="phase, step, newest checkpoint and its age, heartbeat, mirror lag")
    v.add_argument("--remote", required=True, help="the run's --remote URL")
    v.add_argument("--json", action="store_true", help="one JSON object")
    v.set_defaults(func=_remote_status)

    add_nodes_command(sub)

    p = sub.add_parser("package", help="tarball of a run with SHA256SUMS and the best checkpoint")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--output", default=None, help="tarball path (default: <run-dir>.tar.gz beside the run)")
    p.add_argument("--allow-edited", action="store_true",
                   help="pack result files that differ from what the run wrote (edited since: refused without it); "
                        "the tarball's EDITED.json lists them")
    p.set_defaults(func=_package)
