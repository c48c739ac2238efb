"""Every trainer the kit knows, by name: its package holds config.py, model.py, train.py, cli.py...

A new trainer joins by adding one line here (and itself to the loop-contract test's list).
Importing this module imports nothing else.
"""

from __future__ import annotations

import importlib

TRAINERS: dict[str, str] = {
    "forecast": "trainers.forecast",
    "gnn": "trainers.gnn",
    "gpt": "trainers.gpt",
    "lstm": "trainers.lstm",
    "ppo": "trainers.ppo",
}

# Commands every trainer shares: module -> it adds its commands with `add_commands(subparsers)`.
SHARED_COMMANDS = ("trainers.market.cli", "trainers.ops.cli")


def trainer_module(name: str, part: str):
    """`trainer_module("gnn", "train")` -> trainers.gnn.train (imported now)."""
    if name not in TRAINERS:
        from trainers.errors import UsageError

        raise UsageError(f"--trainer {name!r} is not one of: {', '.join(TRAINERS)}")
    return importlib.import_module(f"{TRAINERS[name]}.{part}")


def trainer_config(trainer: str, options: list[str]):
    """The trainer's resolved config from the same options its training gets (after `--`)."""
    import argparse

    from trainers.errors import UsageError
    from trainers.runtime import config as cfgmod

    cls = trainer_module(trainer, "cli").CONFIG
    parser = argparse.ArgumentParser(prog=f"trainers {trainer} train", add_help=False, exit_on_error=False)
    cfgmod.add_dataclass_args(parser, cls)
    try:
        args, unknown = parser.parse_known_args(options)
    except argparse.ArgumentError as exc:
        raise UsageError(f"{exc} (in `trainers {trainer} train` options)") from None
    if unknown:
        raise UsageError(f"{' '.join(unknown)}: not `trainers {trainer} train` options")
    return cfgmod.from_args(cls, args)
