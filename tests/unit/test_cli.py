"""One CLI: `trainers <trainer> <verb>`, every --help fast and torch-free, bad input one line."""

import subprocess
import sys
import time

import pytest

from conftest import run_cli
from trainers.cli import build_parser, main
from trainers.registry import TRAINERS

BLOCK_TORCH = "import sys; sys.modules['torch'] = None  # `import torch` now raises ImportError\n"


def every_command() -> list[list[str]]:
    """[trainer, verb] for every trainer's verbs, and [command] for the shared ones."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    out = []
    for name, parser in sub.choices.items():
        verbs = next((a for a in parser._actions if a.dest == "verb"), None)
        out += [[name, v] for v in verbs.choices] if verbs else [[name]]
    return out


def test_every_trainer_is_registered_with_its_verbs():
    commands = every_command()
    assert ["forecast", "train"] in commands and ["forecast", "evaluate"] in commands and ["forecast", "export"] in commands
    assert {tuple(c) for c in commands if c[0] == "gnn"} == {("gnn", "data"), ("gnn", "train"), ("gnn", "evaluate"),
                                                              ("gnn", "export"), ("gnn", "color")}
    assert {c[0] for c in commands} >= set(TRAINERS) | {"fetch-sp500", "refresh-universe", "preflight", "package"}


@pytest.mark.parametrize("command", every_command(), ids=" ".join)
def test_every_command_has_help_without_torch(command):
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH + "from trainers.cli import main\n"
                           f"raise SystemExit(main({[*command, '--help']!r}))"], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0 and "usage: trainers" in proc.stdout, proc.stderr[-2000:]


def test_top_level_help_lists_every_trainer_and_verb_in_under_a_second():
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", BLOCK_TORCH + "from trainers.cli import main\n"
                           "raise SystemExit(main(['--help']))"], capture_output=True, text=True, timeout=30)
    elapsed = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert "forecast           train|evaluate|export" in proc.stdout
    assert "gnn                data|train|evaluate|export|color" in proc.stdout
    assert elapsed < 1.0, f"`trainers --help` took {elapsed:.2f} s"


def test_console_entry_point_runs():
    proc = run_cli(["--help"])
    assert proc.returncode == 0 and "forecast" in proc.stdout


@pytest.mark.parametrize("args,needle", [
    (["--preset", "huge"], "--preset 'huge' is not one of: tiny, small, base, 151m"),
    (["--window", "5000"], "--window 5000"),
    (["--horizon", "0"], "--horizon 0 is not allowed: need an integer >= 1"),
    (["--horizon", "-3"], "--horizon -3 is not allowed: need an integer >= 1"),
    (["--max-hours", "0"], "--max-hours 0.0 is not allowed: need a finite number > 0"),
    (["--budget-usd", "-1", "--usd-per-gpu-hour", "2"], "--budget-usd -1.0 is not allowed: need a finite number > 0"),
    (["--budget-usd", "5"], "--budget-usd needs --usd-per-gpu-hour"),
    (["--synthetic-days", "300"], "300 trading dates cannot hold train/val/test"),
    (["--source", "nasdaq"], "--source 'nasdaq' is not one of"),
    (["--precision", "fp8"], "--precision 'fp8' is not one of"),
])
def test_bad_input_is_one_line_nonzero_and_writes_nothing(tmp_path, args, needle, capsys):
    run_dir = tmp_path / "run"
    assert main(["forecast", "train", "--run-dir", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not run_dir.exists()


def test_export_and_package_of_a_folder_that_is_not_a_run(tmp_path, capsys):
    assert main(["forecast", "export", "--run-dir", str(tmp_path)]) == 2
    assert "holds no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "results.json").write_text("{}")
    assert main(["package", "--run-dir", str(tmp_path)]) == 2
    assert "lacks model.onnx" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "results.json"]  # nothing created
