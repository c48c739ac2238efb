"""Typed dataclass configs on the command line, in the run folder and in every checkpoint.

Each field becomes `--field-name`; its `help` comes from the field's metadata. Fields marked
`resume_safe` (budgets, logging cadence...) may change when a run is resumed; any other difference
between a run folder's saved config and the new one is refused, so a checkpoint is never loaded
into a model or data setup it was not trained for.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

from trainers.errors import UsageError


def option(default: Any, help: str, resume_safe: bool = False, choices: tuple | None = None) -> Any:
    return dataclasses.field(default=default, metadata={"help": help, "resume_safe": resume_safe,
                                                        "choices": choices})


def _base_type(tp: Any) -> tuple[type, bool]:
    """(inner type, optional?) for `X` and `X | None`."""
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, optional = _base_type(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        meta = f.metadata
        default_text = "off" if f.default is None else f.default
        choices = f"; one of: {', '.join(meta['choices'])}" if meta.get("choices") else ""
        help_text = f"{meta.get('help', '')}{choices} (default: {default_text})"
        if tp is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                                help=help_text)
        else:
            # Choices are checked by the config's validate(), which names the bad value in one line.
            parser.add_argument(flag, dest=f.name, type=tp, default=f.default, help=help_text,
                                metavar=tp.__name__.upper())


def from_args(cls: type, args: argparse.Namespace):
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    return cls(**values)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def incompatible_fields(saved: dict[str, Any], current: Any) -> list[str]:
    """Names of non-resume-safe fields whose value differs from the saved config."""
    diffs = []
    for f in dataclasses.fields(current):
        if f.metadata.get("resume_safe"):
            continue
        if f.name in saved and saved[f.name] != getattr(current, f.name):
            diffs.append(f"{f.name}: saved {saved[f.name]!r}, now {getattr(current, f.name)!r}")
        elif f.name not in saved:
            diffs.append(f"{f.name}: not in saved config")
    return diffs


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); move the folder away or pick another --run-dir")


def check_run_dir_compatible(run_dir: Path, cfg: Any) -> dict[str, Any] | None:
    """Refuse to reuse a run folder that holds a run of a different config. Returns the saved config."""
    saved = saved_config(run_dir)
    if saved is None:
        return None
    diffs = incompatible_fields(saved, cfg)
    if diffs:
        raise UsageError(f"--run-dir {run_dir} holds a run with a different config ({'; '.join(diffs)}); "
                         f"use a new --run-dir or the same settings to resume")
    return saved
