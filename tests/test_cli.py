import hashlib
from pathlib import Path

import pytest

from conftest import TINY_DATA, run_cli
from trainers.cli import main


@pytest.mark.parametrize("command,flag", [("forecast", "--run-dir"), ("evaluate", "--run-dir"), ("export", "--run-dir"),
                                          ("package", "--run-dir"), ("fetch-sp500", "--cache-dir"),
                                          ("refresh-universe", "--url")])
def test_every_command_has_help(command, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0 and flag in capsys.readouterr().out


def test_console_entry_point_runs():
    proc = run_cli(["--help"])
    assert proc.returncode == 0 and "forecast" in proc.stdout


@pytest.mark.parametrize("args,needle", [
    (["--preset", "huge"], "--preset 'huge' is not one of: tiny, small, base, 151m"),
    (["--window", "5000"], "--window 5000"),
    (["--horizon", "0"], "--horizon 0 must be > 0"),
    (["--horizon", "-3"], "--horizon -3 must be > 0"),
    (["--max-hours", "0"], "--max-hours 0.0 must be > 0"),
    (["--budget-usd", "-1", "--usd-per-gpu-hour", "2"], "--budget-usd -1.0 must be > 0"),
    (["--budget-usd", "5"], "--budget-usd needs --usd-per-gpu-hour"),
    (["--synthetic-days", "300"], "300 trading dates cannot hold train/val/test"),
    (["--source", "nasdaq"], "--source 'nasdaq' is not one of"),
    (["--precision", "fp8"], "--precision 'fp8' is not one of"),
])
def test_bad_input_is_one_line_nonzero_and_writes_nothing(tmp_path, args, needle, capsys):
    run_dir = tmp_path / "run"
    assert main(["forecast", "--run-dir", str(run_dir), *args]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], err
    assert not run_dir.exists()


def tree_digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_run_dir_of_a_different_config_is_refused_untouched(tmp_path):
    run_dir = tmp_path / "run"
    run_cli(["forecast", "--run-dir", str(run_dir), *TINY_DATA, "--epochs", "1", "--log-every", "5"], check=True)
    before = tree_digest(run_dir)
    proc = run_cli(["forecast", "--run-dir", str(run_dir), *TINY_DATA, "--epochs", "1", "--preset", "small"])
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "different config" in lines[0] and "preset: saved 'tiny', now 'small'" in lines[0]
    assert tree_digest(run_dir) == before
    # package and export on a folder that is not a run: clear errors too
    proc = run_cli(["export", "--run-dir", str(tmp_path)])
    assert proc.returncode == 2 and "holds no config.json" in proc.stderr
    proc = run_cli(["package", "--run-dir", str(run_dir)])
    assert proc.returncode == 2 and "lacks model.onnx" in proc.stderr
