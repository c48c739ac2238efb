"""Nothing lost, nothing mixed up: one job per folder, tolerant reads of every file we wrote, no
silent restart from step 0, leftovers cleaned, the budget counts lost time, folders that move."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

from toy_trainer import cfg_for, toy_loop
from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.lock import FolderLock, held_by_other
from trainers.runtime.rundir import single_process_context


def ckpts(tmp_path):
    return tmp_path / "run" / "checkpoints"


def test_a_second_job_on_a_held_folder_is_refused_naming_the_holder(tmp_path):
    folder = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom trainers.runtime.lock import FolderLock\n"
                               f"FolderLock({str(folder)!r}).acquire(); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError, match=rf"--run-dir .* is in use by pid {holder.pid} on .* since"):
            toy_loop(cfg_for(tmp_path), total_steps=2)
        assert not (folder / "config.json").exists()  # refused before writing anything
        assert held_by_other(folder)["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    # the holder died without releasing (SIGKILL): the kernel freed the lock; its note is taken over
    assert held_by_other(folder) is None
    warnings = []
    FolderLock(folder).acquire(warn=warnings.append).release()
    assert warnings and f"pid {holder.pid}" in warnings[0] and "not running" in warnings[0]
    warnings.clear()
    FolderLock(folder).acquire(warn=warnings.append).release()
    assert warnings == []  # a clean release leaves nothing stale


def test_an_unreadable_older_meta_never_blocks_resume_save_best_or_evaluation(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=1, keep_last=10, patience=0)
    toy_loop(cfg, total_steps=4)
    (ckpts(tmp_path) / "meta_00000002.json").write_text("{x")
    (ckpts(tmp_path) / "meta_00000001.json").write_text("[]")  # valid JSON, not a record
    results, _ = toy_loop(cfg, total_steps=8, evaluate=lambda: {"ok": True})  # resumes, saves, prunes, finishes
    assert results["training"]["steps"] == 8 and results["evaluation"] == {"ok": True}
    names = {p.name for p in ckpts(tmp_path).iterdir()}
    assert {"meta_00000001.json.unusable", "meta_00000002.json.unusable", "meta_00000008.json"} <= names


def test_every_checkpoint_corrupt_is_refused_in_one_line_and_restart_keeps_the_evidence(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=4)
    for p in ckpts(tmp_path).glob("model_*.pt"):
        p.write_bytes(b"garbage")
    before = sorted(p.name for p in ckpts(tmp_path).iterdir())
    with pytest.raises(UsageError, match=r"every checkpoint in .* is unusable .* add --restart"):
        toy_loop(cfg, total_steps=8)
    with pytest.raises(UsageError, match="every checkpoint"):  # and again: no silent start from step 0
        toy_loop(cfg, total_steps=8)
    assert len(list(ckpts(tmp_path).glob("model_*.pt"))) == len([n for n in before if n.startswith("model_")])
    cfg.restart = True
    results, _ = toy_loop(cfg, total_steps=3)
    assert results["training"]["steps"] == 3 and results["training"]["elapsed_s_all_attempts"] < 60
    aside = list((tmp_path / "run").glob("checkpoints.set-aside-*"))
    assert len(aside) == 1 and sorted(p.name for p in aside[0].iterdir()) == sorted(
        n + ".unusable" if n.startswith("meta_") else n for n in before)


def test_every_meta_deleted_is_refused_too_not_a_silent_start_from_step_0(tmp_path):
    """With every meta_*.json gone (a careless cleanup), a start once began again at step 0 and
    overwrote the old step files; the step files show a run was here."""
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=6)
    for p in ckpts(tmp_path).glob("meta_*.json"):
        p.unlink()
    before = {p.name: p.read_bytes() for p in ckpts(tmp_path).iterdir()}
    with pytest.raises(UsageError, match=r"every checkpoint in .* is unusable \(model_0000000.*add --restart"):
        toy_loop(cfg, total_steps=8)
    assert {p.name: p.read_bytes() for p in ckpts(tmp_path).iterdir()} == before


def test_one_step_written_without_its_meta_is_a_first_write_killed_and_starts_over(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=2)
    (ckpts(tmp_path) / "meta_00000002.json").unlink()  # as if killed before the first meta was written
    results, _ = toy_loop(cfg, total_steps=2)
    assert results["training"]["steps"] == 2 and (ckpts(tmp_path) / "meta_00000002.json").exists()


def test_leftover_temp_files_are_removed_at_the_next_start(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=2)
    (ckpts(tmp_path) / ".model_00000004.pt.abc123.tmp").write_bytes(b"half")
    (tmp_path / "run" / ".results.json.xyz.tmp").write_text("{")
    toy_loop(cfg, total_steps=4)
    assert not list((tmp_path / "run").rglob("*.tmp"))


def test_rank_files_of_an_old_world_size_are_pruned(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=1, keep_last=2, patience=0)
    toy_loop(cfg, total_steps=2)
    for step in (1, 2):  # what a 4-rank run would have left
        for rank in (1, 2, 3):
            torch.save({}, ckpts(tmp_path) / f"rank{rank:03d}_{step:08d}.pt")
    toy_loop(cfg, total_steps=5)
    assert sorted(p.name for p in ckpts(tmp_path).glob("rank*")) == ["rank000_00000004.pt", "rank000_00000005.pt"]


def test_the_budget_counts_time_spent_after_the_last_checkpoint(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=100, patience=0)
    toy_loop(cfg, total_steps=3)
    beat = json.loads((tmp_path / "run" / "heartbeat.json").read_text())
    assert beat["step"] == 3
    # an attempt that ran an hour past its last checkpoint, then crashed
    (tmp_path / "run" / "heartbeat.json").write_text(json.dumps({**beat, "elapsed_s": 3600.0}))
    results, _ = toy_loop(cfg, total_steps=6)
    assert results["training"]["elapsed_s_all_attempts"] >= 3600.0


def test_a_run_folder_moved_or_given_relative_with_a_slash_still_resumes(tmp_path, monkeypatch):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=2)
    shutil.move(tmp_path / "run", tmp_path / "moved")
    monkeypatch.chdir(tmp_path)
    cfg.run_dir = "moved/"
    results, _ = toy_loop(cfg, total_steps=4)
    assert results["training"]["steps"] == 4
    assert "resumed from checkpoint step 2" in (tmp_path / "moved" / "training.log").read_text()


def test_check_only_runs_every_check_and_writes_nothing(tmp_path, monkeypatch):
    from trainers.errors import CheckPassed

    monkeypatch.setenv("TRAINERS_CHECK_ONLY", "1")
    with pytest.raises(CheckPassed):
        toy_loop(cfg_for(tmp_path), total_steps=2)
    assert not (tmp_path / "run").exists()


def test_a_run_folder_that_is_a_file_or_unwritable_is_one_line(tmp_path, monkeypatch):
    from trainers.runtime.config import check_run_dir_compatible

    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_run_dir_compatible(tmp_path / "file", cfg_for(tmp_path))
    with pytest.raises(UsageError, match=r"cannot be written \(/proc: .*\); pick a folder you can write"):
        check_run_dir_compatible("/proc/run", cfg_for(tmp_path))  # not even root can write there


def test_garbage_config_json_is_one_line(tmp_path):
    from trainers.runtime.config import saved_config

    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(UsageError, match="holds a list, not a config"):
        saved_config(tmp_path)
    (tmp_path / "config.json").write_bytes(b"\xff\xfe")
    with pytest.raises(UsageError, match="is not valid JSON"):
        saved_config(tmp_path)


def test_checkpoint_manager_verify_names_the_bad_file(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=2)
    import logging

    m = CheckpointManager(ckpts(tmp_path), single_process_context(), 3, logging.getLogger("t"))
    assert m.verify(2) is None
    path = ckpts(tmp_path) / "model_00000002.pt"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    assert m.verify(2) == "model_00000002.pt fails its SHA-256 check"


def test_a_resume_on_changed_data_is_refused_in_one_line(tmp_path):
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=2, data_fingerprint="a" * 64)
    with pytest.raises(UsageError, match=r"was trained on other data \(fingerprint aaaaaaaaaaaa\.\.\., now bbbb"):
        toy_loop(cfg, total_steps=4, data_fingerprint="b" * 64)
    results, _ = toy_loop(cfg, total_steps=4, data_fingerprint="a" * 64)
    assert results["training"]["steps"] == 4


@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_a_resume_whose_data_record_is_gone_or_unreadable_is_refused(tmp_path, damage):
    """A GPT run whose data.json was deleted or garbled once resumed on different text, exit 0, and
    wrote the new fingerprint over the evidence."""
    cfg = cfg_for(tmp_path, ckpt_every=2, patience=0)
    toy_loop(cfg, total_steps=2, data_fingerprint="a" * 64)
    record = tmp_path / "run" / "data.json"
    record.unlink() if damage == "delete" else record.write_text("{garbage")
    with pytest.raises(UsageError, match="no data.json" if damage == "delete" else "data.json is unreadable"):
        toy_loop(cfg, total_steps=4, data_fingerprint="b" * 64)
    assert not record.exists() if damage == "delete" else record.read_text() == "{garbage"
    cfg.restart = True  # starting over on the new data is allowed, and records it
    toy_loop(cfg, total_steps=2, data_fingerprint="b" * 64)
    assert json.loads(record.read_text())["fingerprint"] == "b" * 64


def test_a_full_disk_during_a_save_is_one_line_and_the_previous_checkpoint_survives(tmp_path, monkeypatch, capsys):
    import errno

    from trainers.cli import main
    from trainers.gnn.graphs import write_dataset

    data = tmp_path / "graphs"
    write_dataset(data, 8, 2, seed=0, min_nodes=10, max_nodes=20, workers=1, progress=False)
    run = tmp_path / "run"
    args = ["gnn", "train", "--data-dir", str(data), "--run-dir", str(run), "--epochs", "2", "--nodes-per-batch", "30",
            "--hidden", "8", "--layers", "1", "--ckpt-every", "2", "--device", "cpu"]
    assert main([*args, "--max-hours", "1e-9"]) == 0  # stops after its first step, with a checkpoint
    good = {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()}
    real = CheckpointManager.write_local

    def full(self, step, *a):
        raise OSError(errno.ENOSPC, "No space left on device", str(self.model_path(step)))

    monkeypatch.setattr(CheckpointManager, "write_local", full)
    assert main(args) == 1  # a plain command; under torchrun 0, so the job is not relaunched (RunEnded)
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: the disk filled up at step ") and "newest complete checkpoint is step 1" in err[-1]
    assert json.loads((run / "results.json").read_text())["training"]["stop_reason"] == "disk_full"
    monkeypatch.setattr(CheckpointManager, "write_local", real)
    assert {p.name: p.read_bytes() for p in (run / "checkpoints").iterdir()} == good


def test_a_write_that_fails_on_a_full_volume_is_disk_full_whatever_raised_it(tmp_path, monkeypatch):
    """torch.save on a full disk raises RuntimeError ("unexpected pos"), not OSError: the atomic
    write still names it DiskFull (so every caller has one disk-full path), and the old file stays."""
    import os

    from trainers.runtime.files import DiskFull, atomic_write

    target = tmp_path / "file.bin"
    target.write_bytes(b"old")

    def torch_like(_f):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    with pytest.raises(RuntimeError, match="unexpected pos") as plain:  # a roomy volume: the error as it is
        atomic_write(target, torch_like)
    assert not isinstance(plain.value, DiskFull)

    class Full:
        f_bavail, f_frsize = 0, 4096

    monkeypatch.setattr(os, "statvfs", lambda _p: Full())
    with pytest.raises(DiskFull, match="no space left on the volume of .*file.bin.*unexpected pos"):
        atomic_write(target, torch_like)
    assert target.read_bytes() == b"old" and not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(DiskFull):  # an OSError ENOSPC is one too, wherever it is raised
        atomic_write(tmp_path / "other", lambda _f: (_ for _ in ()).throw(OSError(28, "No space left on device")))
