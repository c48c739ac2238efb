"""A long job must survive the SSH session: a foreground deploy that loses its terminal (SIGHUP)
stops with a checkpoint; a detached one ignores hang-ups; `status`, `attach` and `stop` work from
another shell; a failed job says where it failed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import FAKES, ROOT, TINY_DATA, read_results

pytestmark = pytest.mark.slow

LONG = [*TINY_DATA, "--epochs", "500", "--patience", "0", "--batch-size", "64", "--ckpt-every", "5"]


def kit_env(tmp_path: Path, gpus: int = 0) -> dict:
    b = tmp_path / "bin"
    b.mkdir(exist_ok=True)
    (b / "nvidia-smi").write_bytes((FAKES / "nvidia-smi").read_bytes())
    (b / "nvidia-smi").chmod(0o755)
    e = {k: v for k, v in os.environ.items() if not k.startswith(("RUNPOD_", "TRAINERS_FAULT", "TMUX"))}
    e.update(PATH=f"{b}:{Path(sys.executable).parent}:/usr/bin:/bin", FAKE_GPUS=str(gpus),
             TRAINERS_PYTHON=sys.executable, OMP_NUM_THREADS="1")
    return e


def kit(*args, env, timeout=120):
    return subprocess.run(["bash", str(ROOT / "deploy_8gpu.sh"), *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def wait_until(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def checkpoints(out: Path) -> list[Path]:
    return list((out / "forecast" / "checkpoints").glob("meta_*.json"))


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in cmdline.read_bytes().decode(errors="replace"):
                pids.append(int(cmdline.parent.name))
        except OSError:
            continue
    return [p for p in pids if p != os.getpid()]


def state(out: Path) -> dict:
    return dict(line.split("=", 1) for line in (out / "deploy-forecast.state").read_text().splitlines() if "=" in line)


def test_a_foreground_deploy_that_loses_its_terminal_stops_with_a_checkpoint(tmp_path):
    env = kit_env(tmp_path)
    out = tmp_path / "out"
    # its own session and process group: what a terminal gives a job (the hang-up goes to that group)
    job = subprocess.Popen(["bash", str(ROOT / "deploy_8gpu.sh"), "--demo", "--foreground", "--out", str(out), "--",
                            *LONG], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                           start_new_session=True)
    wait_until(lambda: checkpoints(out), 120, "a first checkpoint")
    os.killpg(job.pid, signal.SIGHUP)
    assert job.wait(timeout=60) != 0  # the deploy ends (it does not export what was interrupted)
    wait_until(lambda: not processes_mentioning(str(out)), 40, "every process of the job to end")
    t = read_results(out / "forecast")["training"]
    assert t["stop_reason"] == "signal" and t["signal"] == "SIGHUP"
    assert (out / "forecast" / "checkpoints" / f"meta_{t['steps']:08d}.json").exists()
    assert state(out)["state"] == "stopped" and state(out)["stop_signal"] == "SIGHUP"
    assert "training stopped by SIGHUP with a checkpoint" in (out / "deploy-forecast.log").read_text()


def test_a_detached_deploy_outlives_its_terminal_and_is_driven_by_status_attach_stop(tmp_path):
    env = kit_env(tmp_path, gpus=2)
    out = tmp_path / "out"
    t0 = time.monotonic()
    launcher = subprocess.Popen(["bash", str(ROOT / "deploy_8gpu.sh"), "--detach", "--demo", "--out", str(out), "--",
                                 *LONG], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
    said, err = launcher.communicate(timeout=30)
    assert launcher.returncode == 0, err
    assert time.monotonic() - t0 < 15  # the prompt comes back at once
    for needle in ("running in the background", f"run folder  {out}/forecast", f"log         {out}/deploy-forecast.log",
                   "deploy_8gpu.sh status", "deploy_8gpu.sh attach", "deploy_8gpu.sh stop"):
        assert needle in said, said
    # the terminal goes away: its whole session is hung up; the job lives in a session of its own
    try:
        os.killpg(launcher.pid, signal.SIGHUP)
    except ProcessLookupError:
        pass
    wait_until(lambda: checkpoints(out), 120, "a first checkpoint")
    job_pid = int(state(out)["pid"])
    os.kill(job_pid, signal.SIGHUP)  # a stray hang-up straight at the detached deploy: ignored
    time.sleep(2)
    st = json.loads(kit("status", "--out", str(out), "--json", env=env).stdout)
    assert st["alive"] and st["state"] == "running" and st["phase"] == "train" and st["detached"]
    assert st["step"] and st["total_steps"] and st["last_train"]["loss"] > 0 and st["eta_s"] is not None
    assert [g["util_pct"] for g in st["gpus"]] == [97.0, 97.0]  # from (the fake) nvidia-smi
    text = kit("status", "--out", str(out), env=env).stdout
    assert "RUNNING in phase train" in text and "GPU 1: 97% busy" in text

    attach = subprocess.Popen(["bash", str(ROOT / "deploy_8gpu.sh"), "attach", "--out", str(out)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    time.sleep(2)
    attach.send_signal(signal.SIGINT)
    assert attach.wait(timeout=10) == 0 and "following" in attach.stdout.read()
    assert json.loads(kit("status", "--out", str(out), "--json", env=env).stdout)["alive"]  # Ctrl-C left it running

    stopped = kit("stop", "--out", str(out), env=env, timeout=300)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "stopping training" in stopped.stdout and "STOPPED" in stopped.stdout, stopped.stdout
    t = read_results(out / "forecast")["training"]
    assert t["stop_reason"] == "signal" and (out / "forecast.tar.gz").exists()  # export and package still ran
    st = json.loads(kit("status", "--out", str(out), "--json", env=env).stdout)
    # stopped before its end: never "finished" (a restarted container would not resume a finished job), exit 143
    assert st["state"] == "stopped" and st["exit_code"] == 143 and not st["alive"], st
    assert f"training stopped at step {t['steps']} of {t['total_steps']}" in st["reason"], st["reason"]
    assert st["tarball"].endswith("forecast.tar.gz")
    log = (out / "deploy-forecast.log").read_text()
    assert "deploy stopped: training was stopped at step" in log and "deploy finished" not in log
    assert not processes_mentioning(str(out))

    # the same command again resumes it; `stop --no-package` then skips export and package and says so
    tarball_before = (out / "forecast.tar.gz").stat().st_mtime_ns
    again = subprocess.run(["bash", str(ROOT / "deploy_8gpu.sh"), "--detach", "--demo", "--out", str(out), "--",
                            *LONG], capture_output=True, text=True, env=env, timeout=60, start_new_session=True)
    assert again.returncode == 0, again.stderr
    wait_until(lambda: f"resumed from checkpoint step {t['steps']}" in (out / "forecast" / "training.log").read_text()
               and json.loads(kit("status", "--out", str(out), "--json", env=env).stdout)["phase"] == "train",
               180, "the rerun to resume from the stop's checkpoint")
    stopped = kit("stop", "--out", str(out), "--no-package", env=env, timeout=300)
    assert stopped.returncode == 0 and "STOPPED" in stopped.stdout, stopped.stdout + stopped.stderr
    st = json.loads(kit("status", "--out", str(out), "--json", env=env).stdout)
    assert st["state"] == "stopped" and st["exit_code"] == 143, st
    assert (out / "forecast.tar.gz").stat().st_mtime_ns == tarball_before  # not packaged again
    log = (out / "deploy-forecast.log").read_text()
    assert "stop --no-package: skipping export" in log and "export and package were skipped" in log
    assert not processes_mentioning(str(out))


def test_a_failed_job_says_where_it_failed_and_a_busy_folder_refuses_a_detached_second_deploy(tmp_path):
    env = kit_env(tmp_path)
    out = tmp_path / "out"
    proc = kit("--demo", "--foreground", "--out", str(out), "--", "--horizon", "0", env=env)
    assert proc.returncode == 2
    st = json.loads(kit("status", "--out", str(out), "--json", env=env).stdout)
    assert st["state"] == "failed" and st["phase"] == "train" and st["exit_code"] == 2
    assert "FAILED in phase train (exit 2)" in kit("status", "--out", str(out), env=env).stdout
    attach = kit("attach", "--out", str(out), env=env, timeout=20)  # an ended job: it once followed forever
    assert attach.returncode == 0 and "FAILED in phase train" in attach.stdout and "--horizon" in attach.stdout
    holder = subprocess.Popen(["flock", str(out / ".deploy-forecast.lock"), "sleep", "30"])
    try:
        time.sleep(0.5)
        proc = kit("--detach", "--demo", "--out", str(out), env=env)
        assert proc.returncode == 2 and "already running" in proc.stderr
    finally:
        holder.kill()


def test_stop_takes_an_older_kits_state_file_without_a_run_dir_line(tmp_path):
    """A state that says running but has no `run_dir=` (an older kit's, or edited): `stop` exited 1 printing
    nothing (`set -e` on a grep that found no line). It stops the deploy itself; without a `pid=` line
    either it says so in one line."""
    out = tmp_path / "out"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'w'); "
                               "fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(120)",
                               str(out / ".deploy-gpt.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"  # the "deploy" holds the job's lock
        (out / "deploy-gpt.state").write_text(f"trainer=gpt\npid={holder.pid}\nstate=running\nphase=train\n")
        env = kit_env(tmp_path)
        stopped = kit("stop", "--out", str(out), "--trainer", "gpt", "--no-package", env=env, timeout=60)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert f"stopping the deploy (pid {holder.pid}, phase train)" in stopped.stdout
        assert holder.wait(timeout=10) == -signal.SIGTERM
    finally:
        holder.kill()
        holder.wait()
    held = subprocess.Popen(["flock", str(out / ".deploy-gpt.lock"), "sleep", "60"])
    try:
        time.sleep(0.5)
        (out / "deploy-gpt.state").write_text("trainer=gpt\nstate=running\nphase=train\n")
        refused = kit("stop", "--out", str(out), "--trainer", "gpt", env=env, timeout=60)
        assert refused.returncode == 2 and "has no pid= line" in refused.stderr, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr
    finally:
        held.kill()
        held.wait()
