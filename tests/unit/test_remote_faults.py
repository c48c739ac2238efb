"""The remote mirror's failure modes (issue 65), in process and on mounted-volume remotes (file://): another
run's push, a store emptied mid-run, a bucket holding garbage metas, remotes that cannot keep a run, leases
that cannot be judged, and refusals that must write nothing. Every refusal here is checked by listing the run
folder and the remote before and after it."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import subprocess
import sys
import tarfile
import time
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.remote import Mirror
from trainers.runtime.remote_pull import pull_run, restore_from_remote
from trainers.runtime.remote_store import (
    LEASE,
    Lease,
    check_remote_url,
    checkpoint_problem,
    machine_identity,
    open_remote,
)
from trainers.runtime.rundir import single_process_context

LOG = logging.getLogger("test-remote-faults")


def listing(*folders: Path) -> dict[str, str]:
    """Every file under the folders, with its bytes' SHA-256 (what a refusal must leave exactly as it was)."""
    out = {}
    for folder in folders:
        for p in sorted(Path(folder).rglob("*")) if Path(folder).exists() else []:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def make_run(run_dir: Path, steps=(4, 8, 12), config: dict | None = None) -> dict:
    """A run folder as a trainer leaves it: config.json and complete checkpoints of `steps` (real files); and the
    folder a mounted volume's remote goes in beside it (tmp/bucket)."""
    run_dir.mkdir(parents=True)
    (run_dir.parent / "bucket").mkdir(exist_ok=True)
    config = config or {"trainer": "gnn", "seed": 0, "lr": 0.001}
    (run_dir / "config.json").write_text(json.dumps(config))
    (run_dir / ".lock").write_text("")  # (its training held it)
    manager = CheckpointManager(run_dir / "checkpoints", single_process_context(), 10, LOG)
    for step in steps:
        manager.save(step, {"w": torch.full((4,), float(step))}, {"position": step},
                     {"metric": 1.0 / step, "config": config})
    return config


def mirrored(run_dir: Path, url: str, config: dict) -> None:
    """The run's folder and every checkpoint uploaded, as its training's mirror leaves them."""
    mirror = Mirror(url, run_dir, LOG).start(config=config)
    mirror.sync()
    for meta in sorted((run_dir / "checkpoints").glob("meta_*.json")):
        mirror.checkpoint(int(meta.stem.split("_")[1]))
    assert mirror.close(30)["caught_up"]


# ---- 1. push checks the config, as training does ---------------------------------------------------------------
def test_a_push_of_another_run_to_a_remote_is_refused_and_the_bucket_is_unchanged(tmp_path, capsys):
    from trainers.ops.remote import push

    url = f"file://{tmp_path}/bucket/ppo"
    ppo = make_run(tmp_path / "ppo", config={"trainer": "ppo", "seed": 0, "episodes": 3})
    mirrored(tmp_path / "ppo", url, ppo)
    make_run(tmp_path / "gnn", steps=(20,))
    before = listing(tmp_path / "bucket")
    with pytest.raises(UsageError, match="holds a run with a different config") as refused:
        push(Namespace(remote=url, run_dir=str(tmp_path / "gnn"), state=None, file=[], wait_s=10))
    assert "trainer" in str(refused.value) and "nothing was changed" in str(refused.value)
    assert listing(tmp_path / "bucket") == before
    # the run's own folder pushes to its own remote, and a folder that is no run is refused before the remote
    assert push(Namespace(remote=url, run_dir=str(tmp_path / "ppo"), state=None, file=[], wait_s=10)) == 0
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="holds no config.json"):
        push(Namespace(remote=url, run_dir=str(tmp_path / "empty"), state=None, file=[], wait_s=10))
    with pytest.raises(UsageError, match=r"--state .*missing.state: no such file"):
        push(Namespace(remote=url, run_dir=None, state=str(tmp_path / "missing.state"), file=[], wait_s=10))


# ---- 2. package --output never replaces another file --------------------------------------------------------------
def test_package_output_replaces_only_an_earlier_tarball_of_the_same_run(tmp_path):
    from trainers.ops.package import check_replaceable

    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    other_config = tmp_path / "config.json"
    other_config.write_text('{"trainer": "ppo"}')
    for path in (notes, other_config):
        with pytest.raises(UsageError, match="exists and is not a tarball of the run run"):
            check_replaceable(path, "run")
    assert notes.read_text() == "my notes" and other_config.read_text() == '{"trainer": "ppo"}'

    def tarball(path: Path, root: str) -> Path:
        (tmp_path / "SHA256SUMS").write_text("")
        with tarfile.open(path, "w:gz") as tar:
            tar.add(tmp_path / "SHA256SUMS", arcname=f"{root}/SHA256SUMS")
        return path

    check_replaceable(tarball(tmp_path / "run.tar.gz", "run"), "run")  # a rerun packs its own run again
    with pytest.raises(UsageError, match="not a tarball of the run run"):
        check_replaceable(tarball(tmp_path / "other.tar.gz", "other"), "run")  # another run's tarball
    (tmp_path / "run.tar.gz.sha256").write_text("a shopping list\n")
    with pytest.raises(UsageError, match="is not the checksum line of run.tar.gz"):
        check_replaceable(tmp_path / "run.tar.gz", "run")


def test_package_cli_refuses_an_existing_file_in_one_line_and_keeps_it(tmp_path):
    make_run(tmp_path / "run", steps=(4,))
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    proc = subprocess.run([sys.executable, "-m", "trainers", "package", "--run-dir", str(tmp_path / "run"),
                           "--output", str(notes)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "notes.txt exists" in proc.stderr
    assert notes.read_text() == "my notes" and not (tmp_path / "notes.txt.sha256").exists()


# ---- 4. a store emptied mid-run --------------------------------------------------------------------------------
def test_a_store_emptied_mid_run_gets_the_whole_run_again_and_a_fresh_folder_resumes(tmp_path):
    import shutil

    url = f"file://{tmp_path}/bucket/run"
    config = make_run(tmp_path / "run")
    mirror = Mirror(url, tmp_path / "run", LOG).start(config=config)
    mirror.sync()
    mirror.checkpoint(12)
    deadline = time.monotonic() + 30
    while mirror.lag()["pending_uploads"] and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(tmp_path / "bucket" / "run")  # the store restarted empty (the bucket made again)
    (tmp_path / "bucket" / "run").mkdir()
    mirror.sync()  # the next heartbeat's sync
    lag = mirror.close(30)
    assert lag["caught_up"] and lag["mirrored_step"] == 12
    remote = tmp_path / "bucket" / "run"
    assert (remote / "config.json").is_file() and (remote / "checkpoints" / "meta_00000012.json").is_file()
    said = []
    assert pull_run(url, tmp_path / "fresh", log=said.append)
    assert (tmp_path / "fresh" / "checkpoints" / "meta_00000012.json").is_file()


def test_a_remote_with_checkpoints_but_no_config_resumes_with_the_config_its_meta_records(tmp_path):
    url = f"file://{tmp_path}/bucket/run"
    config = make_run(tmp_path / "run")
    mirrored(tmp_path / "run", url, config)
    (tmp_path / "bucket" / "run" / "config.json").unlink()
    said = []
    assert pull_run(url, tmp_path / "fresh", log=said.append)
    assert json.loads((tmp_path / "fresh" / "config.json").read_text()) == config
    assert any("holds no config.json" in line for line in said), said


def test_a_double_slash_or_a_process_local_store_is_refused_as_a_url():
    for url, says in (("s3://b//gnn", "empty part"), ("file:///mnt//run", "empty part"),
                      ("memory://bucket/run", "gone when it ends")):
        with pytest.raises(UsageError, match=says):
            check_remote_url(url)
    check_remote_url("s3://b/gnn/")  # a trailing slash is no empty part


# ---- 5. a pull chooses the newest checkpoint that verifies completely -----------------------------------------
def test_a_pull_passes_over_metas_that_list_nothing_or_another_steps_files_and_names_them(tmp_path):
    url = f"file://{tmp_path}/bucket/run"
    config = make_run(tmp_path / "run")
    mirrored(tmp_path / "run", url, config)
    remote = tmp_path / "bucket" / "run" / "checkpoints"
    good = json.loads((remote / "meta_00000012.json").read_text())
    (remote / "meta_00000099.json").write_text(json.dumps({**good, "step": 99, "files": {}}))
    (remote / "meta_00000050.json").write_text(json.dumps({**good, "step": 50}))  # step 12's files
    (remote / "meta_00000040.json").write_text(json.dumps(
        {**good, "step": 40, "files": {"model_00000040.pt": "0" * 64}}))  # no rank file of its world
    said = []
    assert "step 12" in pull_run(url, tmp_path / "fresh", log=said.append)
    local = sorted(p.name for p in (tmp_path / "fresh" / "checkpoints").glob("meta_*.json"))
    assert local[-1] == "meta_00000012.json", local
    text = "\n".join(said)
    assert "step 99: its meta lists no files" in text and "step 50" in text and "not a file of step 50" in text
    assert "step 40: its meta leaves out rank000_00000040.pt" in text
    assert {p.name for p in remote.glob("*.unusable")} == {f"meta_{s:08d}.json.unusable" for s in (40, 50, 99)}


def test_a_garbage_meta_on_the_remote_does_not_make_a_local_run_look_behind(tmp_path):
    url = f"file://{tmp_path}/bucket/run"
    config = make_run(tmp_path / "run")
    mirrored(tmp_path / "run", url, config)
    (tmp_path / "bucket" / "run" / "checkpoints" / "meta_99999999.json").write_text('{"files": {}}')
    Mirror(url, tmp_path / "run", LOG).start(config=config).close(10)  # not refused as "holds a newer checkpoint"


def test_checkpoint_problem_names_what_makes_a_meta_incomplete():
    digest = "a" * 64
    ok = {"step": 3, "world_size": 2, "files": {"model_00000003.pt": digest, "rank000_00000003.pt": digest,
                                                "rank001_00000003.pt": digest}}
    assert checkpoint_problem(3, ok) is None
    assert "leaves out rank001" in checkpoint_problem(3, {**ok, "files": {k: v for k, v in ok["files"].items()
                                                                           if not k.startswith("rank001")}})
    assert "without a SHA-256" in checkpoint_problem(3, {**ok, "files": {**ok["files"], "model_00000003.pt": ""}})
    assert "of step 4" in checkpoint_problem(3, {**ok, "step": 4})
    assert "leaves out shards_00000003/.metadata" in checkpoint_problem(3, {**ok, "sharded": ["model"]})
    assert checkpoint_problem(3, ["not", "a", "dict"]) and checkpoint_problem(3, None)


# ---- 7, 8. remotes that cannot keep a run ---------------------------------------------------------------------
def test_a_mounted_remote_inside_a_run_folder_or_on_a_missing_volume_is_refused_and_nothing_is_created(tmp_path):
    config = make_run(tmp_path / "run", steps=(4,))
    make_run(tmp_path / "other", steps=(4,))
    before = listing(tmp_path)
    for url, says in ((f"file://{tmp_path}/run/mirror", "inside the run folder"),
                      (f"file://{tmp_path}/run", "is the run folder|is another run's folder"),
                      (f"file://{tmp_path}", "above the run folder"),
                      (f"file://{tmp_path}/other/mirror", "another run's folder"),
                      (f"file://{tmp_path}/not/mounted/path", "does not exist (is the volume mounted?)")):
        if "mounted" not in says:  # (a run's mirror: its entry, the pull or the check, has checked the volume)
            with pytest.raises(UsageError) as refused:
                Mirror(url, tmp_path / "run", LOG).start(config=config)
            assert any(words in str(refused.value) for words in says.split("|")), (url, refused.value)
        with pytest.raises(UsageError) as refused:
            pull_run(url, tmp_path / "fresh")
        assert "mounted" not in says or says in str(refused.value), refused.value
        assert listing(tmp_path) == before, url
    from trainers.ops.remote import push

    with pytest.raises(UsageError, match=r"is the volume mounted\?"):
        push(Namespace(remote=f"file://{tmp_path}/not/mounted/path", run_dir=str(tmp_path / "run"), state=None,
                       file=[], wait_s=5))
    assert listing(tmp_path) == before


# ---- 10, 11. leases --------------------------------------------------------------------------------------------
def lease_file(tmp_path: Path, **fields) -> tuple[Lease, Path]:
    fs, root = open_remote(f"file://{tmp_path}/bucket/run")
    (tmp_path / "bucket" / "run").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "bucket" / "run" / LEASE
    path.write_text(json.dumps({"host": "elsewhere", "pid": 4242, "run_dir": "/w/run", "token": "t0", **fields}))
    return Lease(fs, root, tmp_path / "run", "file://bucket"), path


def test_a_lease_dated_in_the_future_goes_stale_by_the_stores_clock(tmp_path):
    lease, path = lease_file(tmp_path, time=1e18)
    with pytest.raises(UsageError, match=r"said so 0 s ago: .* wait 120 s"):
        lease.take()
    old = time.time() - 200
    os.utime(path, (old, old))  # the holder has been silent 200 s by the store's clock: taken over
    lease.take()
    assert json.loads(path.read_text())["token"] == lease.me["token"]
    for garbage in ("Infinity", "-Infinity", "NaN"):
        path.write_text('{"host": "elsewhere", "pid": 1, "token": "t0", "time": %s}' % garbage)
        lease.take()  # a time that cannot be judged holds nothing


def test_a_lease_of_a_dead_process_of_this_machine_is_taken_at_once_and_only_on_this_machine(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    me = {"host": socket.gethostname(), "pid": dead.pid, "time": time.time(), **machine_identity()}
    lease, path = lease_file(tmp_path, **me)
    lease.take()  # its process is gone: no need to wait 120 s
    lease, path = lease_file(tmp_path, **{**me, "boot_id": "another-boot"})  # same hostname, another machine
    with pytest.raises(UsageError, match="being written by"):
        lease.take()
    lease, path = lease_file(tmp_path, **{**me, "pid": os.getpid()})  # alive
    with pytest.raises(UsageError, match="being written by"):
        lease.take()


# ---- 12. a check and a refused pull write nothing --------------------------------------------------------------
class Opts:
    """The options restore_from_remote reads of a trainer's config."""

    def __init__(self, restart=False):
        self.restart = restart

    def for_attempt(self, count):
        return self


def test_the_check_phase_pulls_nothing_and_a_second_writer_is_refused_before_the_pull(tmp_path, monkeypatch):
    url = f"file://{tmp_path}/bucket/run"
    config = make_run(tmp_path / "run")
    mirrored(tmp_path / "run", url, config)
    ctx = single_process_context()
    before = listing(tmp_path / "bucket")
    monkeypatch.setenv("TRAINERS_CHECK_ONLY", "1")
    assert "a run to resume" in restore_from_remote(url, tmp_path / "fresh", ctx)
    assert not (tmp_path / "fresh").exists() and listing(tmp_path / "bucket") == before
    monkeypatch.delenv("TRAINERS_CHECK_ONLY")
    held = Mirror(url, tmp_path / "run", LOG).start(config=config)  # a live writer
    with pytest.raises(UsageError, match="being written by"):
        restore_from_remote(url, tmp_path / "second", ctx)
    assert not (tmp_path / "second").exists() and not list(tmp_path.glob(".second.pull-*"))
    held.close(10)


def test_the_check_phase_fails_on_a_remote_that_cannot_be_written(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINERS_CHECK_ONLY", "1")
    with pytest.raises(UsageError, match="cannot be read"):  # /proc takes no new file
        restore_from_remote("file:///proc/trainers-run", tmp_path / "run", single_process_context())
    assert not (tmp_path / "run").exists()
    restore_from_remote(f"file://{tmp_path}/volume", tmp_path / "run", single_process_context())
    assert not (tmp_path / "volume").exists() and not (tmp_path / "run").exists()  # the probe left nothing


# ---- 13. remote status names a bad object instead of blaming the remote ---------------------------------------
def test_remote_status_reads_around_nan_times_wrong_types_and_a_garbage_meta(tmp_path):
    from trainers.ops.remote import remote_status

    url = f"file://{tmp_path}/bucket/run"
    config = make_run(tmp_path / "run")
    mirrored(tmp_path / "run", url, config)
    remote = tmp_path / "bucket" / "run"
    (remote / "heartbeat.json").write_text('{"time": NaN, "step": 3}')
    (remote / LEASE).write_text('{"time": -Infinity, "host": "x"}')
    (remote / "results.json").write_text('{"training": "done", "remote": 7}')
    (remote / "checkpoints" / "meta_99999999.json").write_text("garbage")
    status = remote_status(url)
    assert status["checkpoint"]["step"] == 12  # not the garbage meta
    text = " ".join(status["unreadable"])
    for name in ("heartbeat.json", LEASE, "results.json", "meta_99999999.json"):
        assert name in text, text


# ---- 14, 15. user files read with a bound --------------------------------------------------------------------
def test_plan_prices_from_dev_zero_or_a_fifo_or_past_the_flags_cap_is_one_line(tmp_path):
    from trainers.ops.commands import read_prices

    fifo = tmp_path / "prices.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_text('{"h200": 2.0, "_note": "' + "x" * (70 << 10) + '"}')
    huge = tmp_path / "huge.json"
    huge.write_text('{"h200": 1e308}')
    for path, says in (("/dev/zero", "not a plain file"), (fifo, "not a plain file"), (big, "over 64 KiB"),
                       (huge, r"at most 3.40282e\+38")):
        with pytest.raises(UsageError, match=says):
            read_prices(str(path), None, "h200")


def test_deploy_status_on_an_empty_or_fifo_state_file_is_one_line_and_exit_2(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "deploy-forecast.state").write_text("")
    os.mkfifo(out / "deploy-gpt.state")
    for trainer, says in (("forecast", "holds no key=value line"), ("gpt", "is not a file")):
        proc = subprocess.run([sys.executable, "-m", "trainers", "status", "--out", str(out), "--trainer", trainer],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and says in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "UNKNOWN" not in proc.stdout
    proc = subprocess.run([sys.executable, "-m", "trainers", "status", "--out", str(out)], capture_output=True,
                          text=True, timeout=60)  # every job: each broken one said, none read without end
    assert proc.returncode == 0 and proc.stdout.count("BROKEN STATE FILE") == 2, proc.stdout + proc.stderr


def test_a_training_start_refused_by_its_remote_leaves_no_folder_and_no_lock(tmp_path):
    """A regression: a remote that cannot be written (here /proc, which takes no new file; a missing bucket alike)
    was refused after the run folder and its .lock were made: the refusal wrote them."""
    from conftest import TINY_DATA, run_cli

    run_dir = tmp_path / "new" / "run"
    proc = run_cli(["forecast", "train", *TINY_DATA, "--epochs", "1", "--device", "cpu", "--run-dir", str(run_dir),
                    "--remote", "file:///proc/trainers-remote-check"])
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "cannot be written" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "new").exists(), listing(tmp_path)


@pytest.mark.slow
def test_a_refusal_under_torchrun_is_not_retried_by_its_restarts(tmp_path):
    """A regression: a remote that cannot be written made torchrun run the workers 4 times (--max-restarts 3), each
    failing on the store, for about 2 minutes. A refusal is remembered in torchrun's store like a terminal stop:
    each restart ends at once, before building anything."""
    from conftest import TINY_DATA, run_torchrun

    started = time.monotonic()
    proc = run_torchrun(["forecast", "train", *TINY_DATA, "--epochs", "1", "--device", "cpu", "--run-dir",
                         str(tmp_path / "run"), "--remote", "file:///proc/trainers-remote-check"],
                        extra=["--max-restarts", "3"], check=False)
    took = time.monotonic() - started
    assert proc.returncode != 0
    assert proc.stderr.count("cannot be written") >= 1, proc.stderr[-3000:]
    assert proc.stderr.count("so this restart does not train") >= 3, proc.stderr[-3000:]  # each restart, at once
    assert not (tmp_path / "run").exists()
    print(f"4 attempts in {took:.1f} s")
