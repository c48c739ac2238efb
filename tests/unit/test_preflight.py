import os
import shutil
import subprocess
import sys

import pytest

from conftest import FAKES
from trainers.ops import preflight
from trainers.ops.preflight import (
    FAIL,
    PASS,
    WARN,
    check_nccl,
    check_shm,
    checkpoint_bytes,
    model_parameters,
    run_preflight,
)
from trainers.registry import trainer_config


@pytest.fixture
def fake_gpus(monkeypatch, tmp_path):
    d = tmp_path / "bin"
    d.mkdir()
    shutil.copy(FAKES / "nvidia-smi", d / "nvidia-smi")
    monkeypatch.setenv("PATH", f"{d}:{os.environ['PATH']}")

    def set_count(n, topo="nvlink"):
        monkeypatch.setenv("FAKE_GPUS", str(n))
        monkeypatch.setenv("FAKE_TOPO", topo)
    return set_count


def test_nvidia_smi_parsing_and_link_type(fake_gpus):
    fake_gpus(8)
    gpus, driver, cuda = preflight.query_nvidia_smi()
    assert len(gpus) == 8 and gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_mib == 81559
    assert driver == "550.54.15" and cuda == "12.4"
    assert preflight.link_type() == "nvlink"
    fake_gpus(2, "pcie")
    assert preflight.link_type() == "pcie"


def test_gpu_count_against_expectation(fake_gpus, capsys, tmp_path):
    fake_gpus(4)
    rc = run_preflight(8, str(tmp_path), 1 << 20, False, [8], str(tmp_path / "p.json"))
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL  gpu count      expected 8, found 4" in out
    report = (tmp_path / "p.json").read_text()
    assert '"verdict": "FAIL"' in report


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="checks the CPU-only torch branch")
def test_gpus_present_but_cpu_only_torch_fails_with_the_fix(fake_gpus, capsys, tmp_path):
    fake_gpus(8)
    rc = run_preflight(8, str(tmp_path), 1 << 20, True, [8], None)
    out = capsys.readouterr().out
    assert rc == 1 and "PASS  gpus           8 x NVIDIA H100" in out
    assert "FAIL  torch" in out and "install a CUDA build of torch" in out
    assert "nccl" not in out  # no all-reduce without a usable torch


def test_no_gpu_fails_fast_with_demo_hint(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    proc = subprocess.run([sys.executable, "-m", "trainers", "preflight", "--json", str(tmp_path / "r.json")],
                          capture_output=True, text=True, env=dict(os.environ, PATH="/usr/bin:/bin"), timeout=60)
    assert proc.returncode == 1 and "deploy_8gpu.sh --demo" in proc.stdout
    assert '"verdict": "FAIL"' in (tmp_path / "r.json").read_text()


def test_small_shm_fails_with_the_docker_fix(monkeypatch):
    real = os.statvfs

    class Small:
        f_blocks, f_frsize = 64 * 1024 * 1024 // 4096, 4096

    monkeypatch.setattr(os, "statvfs", lambda p: Small() if p == "/dev/shm" else real(p))
    c = check_shm("/dev/shm")
    assert c.status == FAIL and "0.06 GiB" in c.detail and "--ipc=host" in c.fix


def test_disk_estimate_comes_from_the_trainer_being_deployed():
    big = model_parameters("forecast", trainer_config("forecast", ["--preset", "151m"]))
    tiny = model_parameters("forecast", trainer_config("forecast", ["--preset", "tiny"]))
    gnn = model_parameters("gnn", trainer_config("gnn", ["--hidden", "64"]))
    assert 150e6 < big < 153e6 and tiny < 1e5 and gnn < 1e6
    assert checkpoint_bytes(big, 3) > 151e6 * 12 * 5
    assert checkpoint_bytes(big, 5) > checkpoint_bytes(big, 3) > checkpoint_bytes(tiny, 3)
    c = preflight.check_disk("/nonexistent/deep/out", 10**18)
    assert c.status == FAIL and "bigger volume" in c.fix


def test_a_forecaster_without_an_encoder_is_preflighted(fake_gpus, capsys):
    """`deploy_8gpu.sh --trainer forecast -- --encoder none --linear-skip` could not start: the plan of a
    model without Transformer blocks raised (issue 34)."""
    from trainers.cli import main

    fake_gpus(2)
    rc = main(["preflight", "--trainer", "forecast", "--", "--encoder", "none", "--linear-skip"])
    out = capsys.readouterr().out
    assert rc in (0, 1) and "fit" in out and "Traceback" not in out


def test_trainer_options_after_the_separator_are_checked(capsys):
    from trainers.cli import main

    assert main(["preflight", "--trainer", "gnn", "--", "--bogus"]) == 2
    assert "--bogus: not `trainers gnn train` options" in capsys.readouterr().err
    assert main(["preflight", "--trainer", "nope"]) == 2
    assert "--trainer 'nope' is not one of: forecast, gnn" in capsys.readouterr().err


@pytest.mark.slow
def test_all_reduce_check_runs_under_torchrun_and_judges_bandwidth():
    c = check_nccl(2, "gloo", [1, 4], expected_gbps=None)
    assert c.status == PASS and [r["mb"] for r in c.data["sizes"]] == [1, 4]
    assert all(r["busbw_gbps"] > 0 for r in c.data["sizes"])
    slow = check_nccl(2, "gloo", [1], expected_gbps=1e6)
    assert slow.status == WARN and "expected about 1000000" in slow.detail


def test_the_fit_line_says_assumed_for_an_mfu_carried_from_another_card():
    """The planner's source for a card with no measurement of its own reads "ASSUMED: ... as measured on h200": the
    fit line called it measured (it looked for the word anywhere). An H200's own measured MFU stays measured."""
    from trainers.ops.commands import load_workload
    from trainers.ops.preflight import GpuInfo, check_fit

    w = load_workload("ppo", ["--num-stocks", "4", "--window", "6", "--hidden", "16", "--num-envs", "4096"])
    on_a100 = check_fit(w, [GpuInfo(0, "NVIDIA A100-SXM4-80GB", 81920, "580")], 2.0, None)
    assert on_a100.data["mfu"]["source"].startswith("ASSUMED") and "(assumed)" in on_a100.detail, on_a100.detail
    on_h200 = check_fit(w, [GpuInfo(0, "NVIDIA H200", 143771, "580")], 2.0, None)
    assert on_h200.data["mfu"]["source"].startswith("measured") and "(measured)" in on_h200.detail, on_h200.detail


def test_preflight_plans_the_runs_own_time_budget(fake_gpus, capsys):
    """Preflight built its plan without the run's --max-hours: a GPT run given only its hours got no estimate,
    where `trainers plan` gave one (the fourth review)."""
    from trainers.cli import main

    fake_gpus(8)
    main(["preflight", "--trainer", "gpt", "--", "--max-hours", "2", "--usd-per-gpu-hour", "3"])
    fit = [line for line in capsys.readouterr().out.splitlines() if " fit" in line or line.startswith("fit")]
    assert fit and "about 2.00 h, $48.00" in fit[0], fit
