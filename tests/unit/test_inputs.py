"""One rule for every number: every numeric flag of every command refuses NaN, infinities, values
below its lower bound and values above its ceiling (its own, or the default INT_MAX / FLOAT_MAX that
keeps every number within what the libraries it reaches accept) with one line and exit code 2,
before anything is written."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest

from trainers.cli import build_parser, main
from trainers.registry import TRAINERS, trainer_module
from trainers.runtime.config import FLOAT_MAX, INT_MAX, PATH_SUFFIXES, with_ceiling

# Numeric options that may be negative on purpose (a lower bound below 0; every other one's is 0 or more).
NEGATIVE_ALLOWED = {"--synthetic-momentum"}


def numeric_flags() -> list[tuple[list[str], str, type, dict]]:
    """(command words, flag, int|float, bounds) for every numeric flag of every command."""
    out = []
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        verbs = next((a for a in parser._actions if a.dest == "verb"), None)
        leaves = [([name, v], p) for v, p in verbs.choices.items()] if verbs else [([name], parser)]
        for words, leaf in leaves:
            fields = {}
            if len(words) == 2 and words[0] in TRAINERS:  # a trainer's verb: its config's flags (`remote push`: own)
                cls = trainer_module(words[0], "cli").CONFIG
                fields = {"--" + f.name.replace("_", "-"): f for f in dataclasses.fields(cls)}
            for action in leaf._actions:
                if not action.option_strings or action.type is None:
                    continue
                flag = action.option_strings[0]
                if hasattr(action.type, "bounds"):
                    out.append((words, flag, action.type.kind, action.type.bounds))
                elif action.type in (int, float) and flag in fields:
                    out.append((words, flag, action.type, with_ceiling(action.type,
                                                                       fields[flag].metadata.get("bounds", {}))))
                elif action.type in (int, float):
                    raise AssertionError(f"{' '.join(words)} {flag} is a number without bounds: use runtime.config.number")
    return out


@functools.cache
def required_flags(words: tuple[str, ...]) -> tuple[str, ...]:
    """The command's required options (built once per command: 945 cases each built the whole CLI)."""
    leaf = build_parser()
    for w in words:
        leaf = next(a for a in leaf._actions if a.dest in ("command", "verb")).choices[w]
    return tuple(a.option_strings[0] for a in leaf._actions if a.required and a.option_strings)


def required_args(words: list[str], tmp_path) -> list[str]:
    return [x for flag in required_flags(tuple(words)) for x in (flag, str(tmp_path / "nonexistent"))]


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


FLAGS = numeric_flags()


def test_every_numeric_flag_is_covered():
    flags = {(" ".join(w), f) for w, f, _, _ in FLAGS}
    assert ("forecast train", "--lr") in flags and ("gnn data", "--max-nodes") in flags
    assert ("forecast export", "--tolerance") in flags and ("fetch-sp500", "--years") in flags
    assert all({"min", "gt"} & set(b) for _, _, _, b in FLAGS)  # --synthetic-momentum had none: 1e10 overflowed
    negative = {f for _, f, _, b in FLAGS if b.get("min", b.get("gt")) < 0}
    assert negative == NEGATIVE_ALLOWED


@pytest.mark.parametrize("words,flag,kind,bounds", FLAGS, ids=[f"{' '.join(w)} {f}" for w, f, _, _ in FLAGS])
def test_nan_inf_and_out_of_range_are_one_line_exit_2_and_write_nothing(words, flag, kind, bounds, tmp_path, capsys,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = ["nan", "inf", "-inf"]
    low = bounds.get("min", bounds.get("gt"))
    if low is not None:
        bad.append(str(low - 1 if kind is int else (low - 1.5 if low >= 1 or low < 0 else -1.0)))
    if kind is int:
        bad.append("2.5")
    for value in bad:
        argv = [*words, *required_args(words, tmp_path), f"{flag}={value}"]  # = : argparse reads "-inf" as a flag
        assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and flag in err[0] and value in err[0], (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def too_large(kind: type, bounds: dict) -> list[str]:
    """Values just above the flag's ceiling, and far above it (10**20: past int64 and C long)."""
    if kind is int:
        top = bounds["max"] + 1 if "max" in bounds else bounds["lt"]
        return [str(top), str(10**20)]
    top = bounds["max"] * 1.5 + 1 if "max" in bounds else bounds["lt"]
    return [repr(float(top)), "1e308"]


def test_every_numeric_flag_has_a_ceiling():
    assert all({"max", "lt"} & set(b) for _, _, _, b in FLAGS)
    ceilings = {(" ".join(w), f): b.get("max", b.get("lt")) for w, f, _, b in FLAGS}
    assert ceilings[("forecast train", "--epochs")] == INT_MAX and ceilings[("forecast train", "--lr")] == FLOAT_MAX
    assert ceilings[("gpt serve", "--port")] == 65535  # a field's own ceiling wins


@pytest.mark.parametrize("words,flag,kind,bounds", FLAGS, ids=[f"{' '.join(w)} {f}" for w, f, _, _ in FLAGS])
def test_too_large_is_one_line_exit_2_and_writes_nothing(words, flag, kind, bounds, tmp_path, capsys, monkeypatch):
    """--epochs 10**20 trained; --seed 2**70, --workers 10**20 or --hidden 10**20 ended in an
    OverflowError deep inside torch, NumPy or multiprocessing."""
    monkeypatch.chdir(tmp_path)
    for value in too_large(kind, bounds):
        argv = [*words, *required_args(words, tmp_path), f"{flag}={value}"]
        assert run(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and flag in err[0] and "<" in err[0], (argv, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_messages_say_what_would_be_accepted(capsys):
    assert run(["forecast", "train", "--lr", "nan"]) == 2
    assert capsys.readouterr().err.strip() == "error: --lr nan is not allowed: need a finite number > 0 and <= 3.40282e+38"
    assert run(["forecast", "train", "--epochs", str(2**31)]) == 2
    assert capsys.readouterr().err.strip() == ("error: --epochs 2147483648 is not allowed: need an integer >= 1 and <= "
                                               "2147483647")
    assert run(["gnn", "train", "--dropout", "1.0"]) == 2
    assert "need a finite number >= 0 and < 1" in capsys.readouterr().err
    assert run(["forecast", "export", "--run-dir", "x", "--tolerance", "nan"]) == 2
    assert "--tolerance: nan is not allowed: need a finite number > 0" in capsys.readouterr().err
    assert math.isnan(float("nan"))  # (the values above are parsed by Python, which accepts 'nan')


# the probe set's options class beside NaN and the infinities (1e308 and 10**20: test_too_large_is_one_line...)
EDGE_VALUES = {int: [str(2**63), "-0"], float: [str(2**63), "-0.0"]}


def parse_only(words: list[str], flag: str, value: str, tmp_path):
    """What the command would run with: the flag parsed and checked as the CLI does, nothing run."""
    from trainers.runtime import config as cfgmod

    leaf = build_parser()
    for w in words:
        leaf = next(a for a in leaf._actions if a.dest in ("command", "verb")).choices[w]
    action = next(a for a in leaf._actions if flag in a.option_strings)
    if hasattr(action.type, "bounds"):  # a plain flag: its type parses and checks
        return action.type(value)
    args = leaf.parse_known_args([*required_args(words, tmp_path), f"{flag}={value}"])[0]
    return getattr(cfgmod.from_args(trainer_module(words[0], "cli").CONFIG, args), action.dest)


@pytest.mark.parametrize("words,flag,kind,bounds", FLAGS, ids=[f"{' '.join(w)} {f}" for w, f, _, _ in FLAGS])
def test_huge_values_and_negative_zero_are_refused_in_one_line_or_read_as_what_they_say(words, flag, kind, bounds,
                                                                                        tmp_path, capsys, monkeypatch):
    """2**63 and negative zero at every numeric flag: out of range, one line naming the flag and exit 2 before
    anything is written; in range, the number the command runs with (negative zero as 0, never recorded as
    -0.0)."""
    from trainers.errors import UsageError
    from trainers.runtime.config import number_problem

    monkeypatch.chdir(tmp_path)
    for value in EDGE_VALUES[kind]:
        number = kind(value)
        if number_problem(number, kind, bounds):
            argv = [*words, *required_args(words, tmp_path), f"{flag}={value}"]
            assert run(argv) == 2, argv
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and err[0].startswith("error:") and flag in err[0], (argv, err)
            continue
        try:
            parsed = parse_only(words, flag, value, tmp_path)
        except (UsageError, SystemExit) as exc:  # another rule of the command (e.g. a product of two sizes)
            raise AssertionError(f"{flag}={value} passes the number rule but not the parse: {exc}") from None
        assert parsed == number and math.copysign(1.0, parsed) == 1.0, (flag, value, parsed)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def path_flags() -> list[tuple[str, str]]:
    """(trainer, flag) for every option of a trainer's config naming a file or folder."""
    return [(t, "--" + f.name.replace("_", "-")) for t in TRAINERS
            for f in dataclasses.fields(trainer_module(t, "cli").CONFIG) if f.name.endswith(PATH_SUFFIXES)]


@pytest.mark.parametrize("trainer,flag", path_flags(), ids=[f"{t} {f}" for t, f in path_flags()])
def test_an_empty_path_is_one_line_exit_2_and_writes_nothing(trainer, flag, tmp_path, capsys, monkeypatch):
    """`--run-dir ""` once trained into the current folder."""
    monkeypatch.chdir(tmp_path)
    for value in ("", "  "):
        assert run([trainer, "train", f"{flag}={value}"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{flag} {value!r} is empty" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def command_path_flags() -> list[tuple[list[str], str]]:
    """(command words, flag) for every path option of every command (their own argparse options too)."""
    import argparse

    from trainers.runtime.config import PATH_DESTS

    out = []

    def walk(parser, words):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif action.option_strings and action.nargs != 0 and (action.dest.endswith(PATH_SUFFIXES)
                                                                   or action.dest in PATH_DESTS):
                out.append((words, action.option_strings[0]))
    walk(build_parser(), [])
    return out


COMMAND_PATH_FLAGS = command_path_flags()


@pytest.mark.parametrize("words,flag", COMMAND_PATH_FLAGS, ids=[f"{' '.join(w)} {f}" for w, f in COMMAND_PATH_FLAGS])
def test_every_commands_empty_path_is_one_line_exit_2_and_writes_nothing(words, flag, tmp_path, capsys, monkeypatch):
    """`package --run-dir ""` packed the current folder and `fetch-sp500 --cache-dir ""` fetched into it."""
    monkeypatch.chdir(tmp_path)
    assert run([*words, *required_args(words, tmp_path), f"{flag}="]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{flag} '' is empty" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == []
