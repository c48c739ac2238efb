"""`trainers preflight` and `trainers package`: flags only (the work: preflight.py, package.py)."""

from __future__ import annotations

import argparse
import json

from trainers.ops.preflight import (
    add_args as add_preflight_args,  # light: no torch at import
)


def _preflight(args) -> int:
    from trainers.ops.preflight import main

    return main(args)


def _status(args) -> int:
    from trainers.ops.status import main

    return main(args)


def _package(args) -> int:
    from trainers.ops.package import package_run

    print(json.dumps(package_run(args.run_dir, args.output)))
    return 0


def add_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("preflight", help="check GPUs, driver, NCCL bandwidth, /dev/shm, disk and memory for a trainer")
    add_preflight_args(p)
    p.set_defaults(func=_preflight)

    p = sub.add_parser("status", help="where a deployed job stands: phase, step, losses, speed, money, GPUs")
    p.add_argument("--out", default="output", help="the deploy's output folder (default: output)")
    p.add_argument("--trainer", default=None, help="which trainer's job (default: every job in --out)")
    p.add_argument("--json", action="store_true", help="one JSON object (a list for several jobs)")
    p.set_defaults(func=_status)

    p = sub.add_parser("package", help="tarball of a run with SHA256SUMS and the best checkpoint")
    p.add_argument("--run-dir", required=True)
    p.add_argument("--output", default=None, help="tarball path (default: <run-dir>.tar.gz beside the run)")
    p.set_defaults(func=_package)
