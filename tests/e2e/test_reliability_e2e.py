"""One job per run folder, across processes: a second writer is refused in one line; workers end
when their torchrun agent is killed, so no orphan keeps writing."""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import GPT_TINY, ROOT, TINY_DATA, read_results, run_cli, run_torchrun, torchrun_cmd, wait_for
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.lock import held_by_other
from trainers.runtime.rundir import single_process_context

pytestmark = pytest.mark.slow

LONG = ["forecast", "train", *TINY_DATA, "--epochs", "500", "--batch-size", "64", "--patience", "0",
        "--ckpt-every", "3"]


def env() -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1")
    e.pop("TRAINERS_FAULT", None)
    return e


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_a_second_training_on_a_busy_folder_is_refused_and_the_first_is_unharmed(tmp_path):
    run_dir = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "trainers", *LONG, "--run-dir", str(run_dir)],
                             stderr=subprocess.PIPE, text=True, env=env())
    try:
        wait_for(lambda: list((run_dir / "checkpoints").glob("meta_*.json")), 120, first)
        second = run_cli([*LONG, "--run-dir", str(run_dir)])
        lines = second.stderr.strip().splitlines()
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert f"is in use by pid {first.pid}" in lines[0]
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=30) == 0, first.stderr.read()[-2000:]
    finally:
        first.kill()
    assert read_results(run_dir)["training"]["stop_reason"] == "signal"
    assert "checksum mismatch" not in (run_dir / "training.log").read_text()


def test_killing_the_torchrun_agent_ends_its_workers_with_a_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    agent = subprocess.Popen(torchrun_cmd([*LONG, "--run-dir", str(run_dir)]), stderr=subprocess.PIPE, text=True,
                             env=env(), start_new_session=True)
    try:
        wait_for(lambda: list((run_dir / "checkpoints").glob("meta_*.json")), 120, agent)
        workers = children(agent.pid)
        assert len(workers) == 2
        os.kill(agent.pid, signal.SIGKILL)  # what `kill -9` of the launcher does
        agent.wait()
        deadline = time.monotonic() + 30
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(w) for w in workers), "orphaned workers kept running"
    finally:
        os.killpg(agent.pid, signal.SIGKILL) if agent.poll() is None else None
    assert held_by_other(run_dir) is None  # nobody writes the folder any more: a relaunch may take it
    proc = run_cli([*LONG, "--run-dir", str(run_dir), "--max-hours", "1e-9"], check=True)
    assert "resumed from checkpoint" in (run_dir / "training.log").read_text(), proc.stderr[-2000:]


def worker_traceback(stderr: str) -> bool:
    """A traceback through the kit's code (torchrun prints its own ChildFailedError when workers exit
    non-zero: that one is how it reports a failed job, not a crash of ours)."""
    # the package's own folder: a clone named trainers (the README's `cd trainers`) holds torch's files under
    # .venv inside it, and a traceback through torchrun's own code there is not ours (seen in a fresh clone)
    return re.search(r'File "' + re.escape(str(ROOT / "trainers")) + r'/', stderr) is not None


@pytest.fixture
def small_volume(tmp_path):
    """A 3 MiB tmpfs: a real full disk (what torch.save says then is not an OSError but a RuntimeError
    "unexpected pos"). Needs root and mount(2), as on the CI machine; skipped elsewhere."""
    where = tmp_path / "small"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()[:80]})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_ends_the_run_once_as_disk_full_non_zero_and_no_restart_trains(small_volume):
    """A full disk was a traceback, torchrun restarted the job twice, the deploy made 4 attempts and
    never said "disk full". Now every rank agrees on it at the failing save and results.json says disk_full;
    torchrun exits non-zero (its workers did: a script chaining on it sees the failure), and each restart
    torchrun makes ends at once without training (the ending is in torchrun's store, the disk being full);
    earlier checkpoints verify."""
    run_dir = small_volume / "run"
    proc = run_torchrun(["gpt", "train", *GPT_TINY, "--batch-tokens", "512", "--device", "cpu", "--run-dir",
                         str(run_dir), "--max-steps", "500", "--ckpt-every", "1", "--keep-last", "1000",
                         "--eval-every", "1000", "--sample-chars", "0"], extra=["--max-restarts=3"], check=False,
                        timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "error: the disk filled up at step" in proc.stderr and not worker_traceback(proc.stderr)
    # each of the 3 restarts says so: its first rank at least (the agent stops the other once one has exited;
    # a worker now exits the moment it has said it, runtime/leave.py), each rank at most
    said = proc.stderr.count("error: an earlier attempt of this job ended for good, so this restart does not "
                             "train: the disk filled up at step")
    assert 3 <= said <= 2 * 3, said
    t = read_results(run_dir)["training"]  # written by the first attempt only: no restart trained or wrote
    assert t["stop_reason"] == "disk_full" and t["restarts"] == 0 and 1 <= t["steps"] < 500
    ckpt = CheckpointManager(run_dir / "checkpoints", single_process_context(), 1, logging.getLogger("test"))
    steps = ckpt.complete_steps()
    assert steps and all(ckpt.verify(s) is None for s in steps)


@pytest.mark.parametrize("verb", ["gpt", "gnn"])
def test_a_data_verb_onto_a_full_volume_is_one_line_and_leaves_nothing_half_written(verb, small_volume, tmp_path):
    """`trainers gpt data` onto a full volume was numpy's OSError traceback ("N requested and M written", no
    errno), and `gnn data` the same ("not enough free space"): one line naming the folder, non-zero, and no
    staging folder left behind."""
    if verb == "gpt":
        text = tmp_path / "corpus.txt"
        text.write_text("".join("abcdefgh \n"[(i * 7919) % 10] for i in range(4_000_000)))  # more than the 3 MiB
        proc = run_cli(["gpt", "data", "--data", str(text), "--cache-dir", str(small_volume / "cache")])
    else:
        proc = run_cli(["gnn", "data", "--out", str(small_volume / "graphs"), "--train", "5000", "--val", "50",
                        "--no-progress"])
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert lines[0].startswith("error: ") and "no space left on the volume" in lines[0]
    left = [p.name for p in small_volume.rglob("*") if not p.name.endswith(".lock") and p.name != "cache"]
    assert left == [], left  # nothing half-written: the staging folder is gone


def test_a_diverged_run_exits_non_zero_from_torchrun_and_no_restart_trains(tmp_path):
    """A two-worker run that diverged exited 0 from torchrun (the workers did, so that torchrun would not
    relaunch them): a script chaining on torchrun recorded a success. Now it exits 1 and torchrun's two
    restarts end at once, before building anything: no step, no checkpoint, no log line after the stop."""
    run_dir = tmp_path / "run"
    proc = run_torchrun(["gpt", "train", *GPT_TINY, "--batch-tokens", "1024", "--device", "cpu", "--run-dir",
                         str(run_dir), "--max-steps", "30", "--lr", "1e30"], extra=["--max-restarts=2"], check=False,
                        timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    # every rank stops at the agreed step and says why; the agent may stop the slower one once the first exits
    assert 1 <= proc.stderr.count("error: training diverged") <= 2 and not worker_traceback(proc.stderr)
    said = proc.stderr.count("this restart does not train: training diverged")
    assert 2 <= said <= 2 * 2, said  # each restart's first rank at least, each rank at most (see the disk test)
    t = read_results(run_dir)["training"]
    assert t["stop_reason"] == "diverged" and t["restarts"] == 0 and t["steps"] < 30
    log = (run_dir / "training.log").read_text()
    assert log.count("training stopped: diverged") == 1 and "resumed" not in log
