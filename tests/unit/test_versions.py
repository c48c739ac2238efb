"""The tested range of torch and the ONNX stack (trainers/versions.py): a version outside it is refused in one line
with the pip command, by every trainer's train, by preflight and by the deploy's install phase, before anything is
fetched, trained or written. An old torch is simulated by a distribution record placed first on the path (what
importlib.metadata reads): no multi-GB install, and the real torch is never reached, which is the point."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import FAKES, ROOT, run_cli
from trainers.registry import TRAINERS
from trainers.versions import problems, release


def fake_distribution(folder: Path, name: str, version: str) -> Path:
    info = folder / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return folder


def test_release_reads_local_and_dev_versions():
    assert release("2.7.1+cu128") == (2, 7, 1) and release("2.8.0.dev20250101") == (2, 8, 0) and release("x") == ()


@pytest.mark.parametrize("torch, ok", [("2.4.1", False), ("2.6.0+cu124", False), ("2.7.1+cu128", True),
                                       ("2.13.0+cpu", True), ("3.0.0", False)])
def test_the_torch_range(torch, ok):
    found = problems(lambda name: torch if name == "torch" else "99.0")  # (the ONNX stack has no ceiling)
    assert (not found) == ok, found
    if not ok:
        assert found[0].startswith(f"torch {torch} is outside the tested range torch>=2.7,<3")
        assert "pip install --upgrade 'torch>=2.7,<3'" in found[0]


def test_a_missing_onnx_stack_is_named_with_its_install_line():
    found = problems(lambda name: None if name == "onnxscript" else "2.13.0" if name == "torch" else "99.0")
    assert found == ["onnxscript is not installed; the kit needs onnxscript>=0.2 (torch.onnx.export(dynamo=True) "
                     "translates through it): pip install 'onnxscript>=0.2'"]


@pytest.mark.parametrize("trainer", list(TRAINERS))
def test_every_trainers_train_refuses_an_old_torch_in_one_line_and_writes_nothing(trainer, tmp_path):
    site = fake_distribution(tmp_path / "site", "torch", "2.4.1")
    run_dir = tmp_path / "run"
    proc = run_cli([trainer, "train", "--run-dir", str(run_dir)],
                   env={"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "torch 2.4.1 is outside the tested range" in lines[0] and "pip install --upgrade" in lines[0], lines
    assert not run_dir.exists()


def test_preflight_lists_the_old_torch_as_a_failed_check(tmp_path):
    site = fake_distribution(tmp_path / "site", "torch", "2.4.1")
    proc = run_cli(["preflight", "--out", str(tmp_path)],
                   env={"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
                        "PATH": f"{FAKES}:{os.environ['PATH']}"}, timeout=120)
    assert proc.returncode != 0
    assert any(line.startswith("FAIL  versions") and "torch 2.4.1" in line for line in proc.stdout.splitlines()), \
        proc.stdout


def test_the_demo_deploy_stops_in_its_install_phase_on_an_old_torch(tmp_path):
    site = fake_distribution(tmp_path / "site", "torch", "2.4.1")
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TRAINERS_FAULT"))}
    env.update(TRAINERS_PYTHON=sys.executable, PYTHONPATH=os.pathsep.join([str(site), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--out", str(out)], capture_output=True,
                          text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode != 0
    log = (out / "deploy-forecast.log").read_text()
    assert "torch 2.4.1 is outside the tested range torch>=2.7,<3" in log and "FAILED in phase 'install'" in log, log
    assert "Traceback" not in log and not (out / "forecast").exists()
