"""Typed dataclass configs on the command line, in the run folder and in every checkpoint.

Each field becomes `--field-name`; its `help` comes from the field's metadata. Fields marked
`resume_safe` (budgets, logging cadence...) may change when a run is resumed; any other difference
between a run folder's saved config and the new one is refused, so a checkpoint is never loaded
into a model or data setup it was not trained for.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import re
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Callable

from trainers.errors import UsageError

# The default ceiling of every number an option takes, unless its field says otherwise (`max=`/`lt=`).
# Integers: a C int, what every library a count or size reaches accepts (torch sizes, NumPy seeds
# (< 2**32), thread and process counts, `struct` fields); a larger one failed deep inside with an
# OverflowError. Floats: the largest float32, the type a learning rate or a scale becomes in a tensor.
INT_MAX = 2**31 - 1
FLOAT_MAX = 3.4028234663852886e38
# Limits of the market-data options every market trainer and `fetch-sp500` share. Dates are pandas
# Timestamps, which start in 1677 and end in 2262: --years counted back from today must stay after
# the first (--years 100000 overflowed deep in the date arithmetic; no source holds 100 years), and a
# synthetic market of business days from 2000-01-03 must end before the second (50,000 days: ~190 years).
MAX_YEARS = 100
SYNTHETIC_MAX_DAYS = 50_000
# The synthetic market is a dozen float64 arrays of tickers x days built at once: 25M cells is about
# 2.4 GB at its peak (10**15 tickers died in NumPy's allocator with a traceback).
SYNTHETIC_MAX_CELLS = 25_000_000
DATE_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$")  # ASCII digits only (\d matches any script's digits)


# Eleven parameters, keywords past the fourth: the declaration of one config field, each a rule its flag checks
# (dataclasses.field's own shape); a field names only the few it needs.
def option(default: Any, help: str, resume_safe: bool = False, choices: tuple | None = None, *,
           min: float | None = None, gt: float | None = None, max: float | None = None,
           lt: float | None = None, aliases: tuple[str, ...] = (), date: bool = False,
           after: str | None = None) -> Any:
    """A config field: its flag's help, whether it may change on resume, and the values it accepts.
    Numbers are checked in one place (`check_values`): floats must be finite, and within
    [min, max] / (gt, lt) where given, below INT_MAX / FLOAT_MAX where no ceiling is given.
    `date`: a YYYY-MM-DD text naming a real day; `after`: another date field this one must come
    after when both are given (an end after its start). `aliases`: other flags for the same field."""
    bounds = {k: v for k, v in (("min", min), ("gt", gt), ("max", max), ("lt", lt)) if v is not None}
    return dataclasses.field(default=default, metadata={"help": help, "resume_safe": resume_safe,
                                                        "choices": choices, "bounds": bounds, "aliases": aliases,
                                                        "date": date or after is not None, "after": after})


def with_ceiling(tp: type, bounds: dict) -> dict:
    """`bounds` with the default ceiling of its type added when it has none (see INT_MAX)."""
    if tp not in (int, float) or "max" in bounds or "lt" in bounds:
        return bounds
    return {**bounds, "max": INT_MAX if tp is int else FLOAT_MAX}


_BOUND_TEXT = {"min": ">= {}", "gt": "> {}", "max": "<= {}", "lt": "< {}"}


def describe_bounds(tp: type, bounds: dict) -> str:
    kind = "an integer" if tp is int else "a finite number"
    parts = [_BOUND_TEXT[k].format(f"{v:g}" if isinstance(v, float) else v) for k, v in bounds.items()]
    return kind + (" " + " and ".join(parts) if parts else "")


def number_problem(value: Any, tp: type, bounds: dict) -> str | None:
    """Why `value` is not an acceptable number of type `tp` within `bounds` (None: it is)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return "is not a number"
    if tp is int and not isinstance(value, int):
        return "is not an integer"
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    tests = {"min": value >= bounds.get("min", value), "gt": "gt" not in bounds or value > bounds["gt"],
             "max": value <= bounds.get("max", value), "lt": "lt" not in bounds or value < bounds["lt"]}
    return None if all(tests.values()) else "is out of range"


def date_problem(text: Any) -> str | None:
    """Why `text` is not a YYYY-MM-DD date of the calendar (None: it is)."""
    if not isinstance(text, str) or not DATE_RE.match(text):
        return "is not a date like 2020-01-31 (YYYY-MM-DD)"
    try:
        dt.date.fromisoformat(text)
    except ValueError as exc:  # 2020-13-45, 2021-02-29
        return f"is not a day of the calendar ({exc})"
    return None


def date_text(text: str) -> str:
    """An argparse `type=` for plain date flags (`--start`, `--end`): the same rule as `date` fields."""
    problem = date_problem(text)
    if problem:
        raise argparse.ArgumentTypeError(f"{text!r} {problem}")
    return text


def number(tp: type = float, **bounds) -> Callable[[str], Any]:
    """An argparse `type=` for plain (non-dataclass) flags: parses, then applies the same rules
    (the default ceiling included)."""
    bounds = with_ceiling(tp, bounds)

    def parse(text: str):
        try:
            value = tp(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {describe_bounds(tp, bounds)}") from None
        if number_problem(value, tp, bounds):
            raise argparse.ArgumentTypeError(f"{text} is not allowed: need {describe_bounds(tp, bounds)}")
        return value + 0.0 if tp is float else value  # -0.0 is 0.0: no '-0.0' in what a run records
    parse.__name__ = tp.__name__  # argparse names the type in its messages
    parse.kind, parse.bounds = tp, bounds  # for the tests that walk every numeric flag
    return parse


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


PATH_SUFFIXES = ("_dir", "_file", "_path")  # options naming a file or folder (--run-dir, --tickers-file, ...)


def empty_path(flag: str, value) -> str | None:
    """What is wrong with a path option's value when it is empty (else None): it would read or write the current
    folder (`--run-dir ""` trained into it)."""
    if isinstance(value, str) and not value.strip():
        return f"{flag} {value!r} is empty: give a path (an empty one would write into, or read, the current folder)"
    return None


def check_values(cfg: Any) -> None:
    """Every field's value against its type, bounds and choices; the first problem as a UsageError
    naming the flag, the value and what would be accepted (one line)."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        tp, optional = _base_type(hints[f.name])
        if value is None and optional:
            continue
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise UsageError(f"{flag_of(f.name)} {value!r} is not one of: {', '.join(map(str, choices))}")
        if tp in (int, float):
            bounds = with_ceiling(tp, f.metadata.get("bounds", {}))
            if number_problem(value, tp, bounds):
                raise UsageError(f"{flag_of(f.name)} {value} is not allowed: need {describe_bounds(tp, bounds)}")
        problem = empty_path(flag_of(f.name), value) if f.name.endswith(PATH_SUFFIXES) else None
        if problem:
            raise UsageError(problem)
        if f.metadata.get("date"):
            problem = date_problem(value)
            if problem:
                raise UsageError(f"{flag_of(f.name)} {value!r} {problem}")
            first = f.metadata.get("after")
            if first is not None and getattr(cfg, first) is not None and not value > getattr(cfg, first):
                raise UsageError(f"{flag_of(f.name)} {value} is not after {flag_of(first)} {getattr(cfg, first)}: "
                                 f"give an end later than the start (the end is exclusive)")


def check_product(cfg: Any, names: tuple[str, ...], limit: int, what: str) -> None:
    """Options whose product sizes one allocation (tickers x days of a generated market): each is
    within its own bounds, but together they may ask for more memory than any machine has."""
    values = [getattr(cfg, n) for n in names]
    if math.prod(values) > limit:
        flags = " x ".join(f"{flag_of(n)} {v}" for n, v in zip(names, values))
        raise UsageError(f"{flags} = {math.prod(values):,} {what}: more than the {limit:,} allowed; use smaller values")


PATH_DESTS = ("out", "output", "json", "plan_json", "file", "prices")  # the commands' own path options


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`error: argument --lr: ...`) and exit code 2; an empty path is one
    (`package --run-dir ""` packed the current folder, `fetch-sp500 --cache-dir ""` fetched into it)."""

    def parse_known_args(self, args=None, namespace=None):
        parsed, extra = super().parse_known_args(args, namespace)
        for dest, value in vars(parsed).items():
            if dest.endswith(PATH_SUFFIXES) or dest in PATH_DESTS:
                for v in value if isinstance(value, list) else [value]:
                    problem = empty_path(flag_of(dest), v)
                    if problem:
                        self.error(problem)
        return parsed, extra

    def error(self, message: str):
        self.exit(2, f"error: {message} (see `{self.prog} --help`)\n")


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
        meta = f.metadata
        default_text = ("auto" if tp is bool else "off") if f.default is None else f.default
        choices = f"; one of: {', '.join(meta['choices'])}" if meta.get("choices") else ""
        bounds = f"; {describe_bounds(tp, meta['bounds'])}" if meta.get("bounds") else ""
        says_default = "(default:" in meta.get("help", "")  # a default that depends on the device says itself
        help_text = f"{meta.get('help', '')}{choices}{bounds}" + ("" if says_default else f" (default: {default_text})")
        flags = (flag_of(f.name), *meta.get("aliases", ()))
        if tp is bool:
            parser.add_argument(*flags, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=f.default, help=help_text)
        else:
            # Ranges and choices are checked by check_values, which names the bad value in one line.
            parser.add_argument(*flags, dest=f.name, type=tp, default=f.default, help=help_text,
                                metavar=tp.__name__.upper())


def from_args(cls: type, args: argparse.Namespace):
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)}
    values = {k: v + 0.0 if isinstance(v, float) else v for k, v in values.items()}  # -0.0 is 0.0
    cfg = cls(**values)
    check_values(cfg)
    return cfg


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


def saved_sizes(cfg: Any, saved: dict[str, Any] | None, names: tuple[str, ...]) -> dict[str, int]:
    """The run folder's `saved` sizes for those the user left out (None: the device decides them), to replace them
    with: a resume goes on with the numbers it began with, on another device or number of GPUs too."""
    return {name: saved[name] for name in names
            if getattr(cfg, name) is None and saved and isinstance(saved.get(name), int)}


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path} is not valid JSON ({exc}); move the folder away or pick another --run-dir") from None
    if not isinstance(saved, dict):
        raise UsageError(f"{path} holds a {type(saved).__name__}, not a config; move the folder away or pick "
                         f"another --run-dir")
    return saved


def check_folder_writable(folder: Path, flag: str = "--run-dir") -> None:
    """A folder we are about to create or write: not a file, and creatable by us. Probed for real
    with an unnamed temporary file in its nearest existing folder (nothing visible is left), since
    permission bits do not tell root about read-only volumes or /proc."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {folder} is a file, not a folder; pick a folder path")
    probe = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if probe is None or not probe.is_dir():
        raise UsageError(f"{flag} {folder} cannot be created: {probe} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {folder} cannot be written ({probe}: {exc.strerror}); pick a folder you can "
                         f"write") from None


def check_run_dir_compatible(run_dir: Path, cfg: Any) -> dict[str, Any] | None:
    """Refuse a run folder we cannot write, or one that holds a run of a different config. Returns
    the saved config."""
    check_folder_writable(run_dir)
    saved = saved_config(run_dir)
    if saved is None:
        return None
    diffs = incompatible_fields(saved, cfg)
    if diffs:
        raise UsageError(f"--run-dir {run_dir} holds a run with a different config ({'; '.join(diffs)}); "
                         f"use a new --run-dir or the same settings to resume")
    return saved
