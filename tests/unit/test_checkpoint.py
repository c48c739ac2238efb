import json
import logging

import pytest
import torch

from trainers.errors import UsageError
from trainers.runtime.checkpoint import CheckpointManager, atomic_write, sha256_file
from trainers.runtime.rundir import single_process_context


def manager(tmp_path, keep_last=2):
    return CheckpointManager(tmp_path / "ckpt", single_process_context(), keep_last, logging.getLogger("test"))


def save(m, step, metric=None):
    m.save(step, {"model": {"w": torch.full((3,), float(step))}, "step": step},
           {"epoch": 0, "step_in_epoch": step, "rng": {"cpu": torch.get_rng_state()}},
           {"metric": metric, "config": {"a": 1}})


def test_files_are_step_numbered_with_checksums_and_config(tmp_path):
    m = manager(tmp_path)
    save(m, 7, 0.5)
    meta = json.loads((tmp_path / "ckpt" / "meta_00000007.json").read_text())
    assert meta["config"] == {"a": 1} and meta["world_size"] == 1
    for name, digest in meta["files"].items():
        assert sha256_file(tmp_path / "ckpt" / name) == digest
    assert set(meta["files"]) == {"model_00000007.pt", "rank000_00000007.pt"}


def test_keeps_last_k_plus_the_best(tmp_path):
    m = manager(tmp_path, keep_last=2)
    save(m, 1, 0.9)
    save(m, 2, 0.1)  # best
    save(m, 3, 0.5)
    save(m, 4, None)
    save(m, 5, 0.7)
    assert m.complete_steps() == [5, 4, 2]
    assert m.best_step() == 2
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert not [n for n in names if "00000001" in n or "00000003" in n]


def test_resume_takes_the_newest(tmp_path):
    m = manager(tmp_path, keep_last=3)
    save(m, 1)
    save(m, 2)
    got = m.resume(torch.device("cpu"))
    assert got.step == 2 and got.shared["model"]["w"][0] == 2.0 and got.rank_state["step_in_epoch"] == 2


def test_corrupt_newest_falls_back_to_previous_with_a_warning(tmp_path, caplog):
    m = manager(tmp_path, keep_last=3)
    save(m, 1)
    save(m, 2)
    path = tmp_path / "ckpt" / "model_00000002.pt"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        got = m.resume(torch.device("cpu"))
    assert got.step == 1
    assert "checkpoint step 2 is unusable" in caplog.text and "checksum mismatch" in caplog.text
    # the bad one leaves the complete set (kept on disk for a post-mortem), so `latest` cannot pick it
    assert m.complete_steps() == [1] and (tmp_path / "ckpt" / "meta_00000002.json.unusable").exists()
    with pytest.raises(UsageError, match="fails its SHA-256 check"):
        m.meta_path(2).write_text((tmp_path / "ckpt" / "meta_00000002.json.unusable").read_text())
        m.load_verified(2, "cpu")


def test_missing_rank_file_or_meta_is_not_resumed(tmp_path):
    m = manager(tmp_path, keep_last=3)
    save(m, 1)
    save(m, 2)
    save(m, 3)
    (tmp_path / "ckpt" / "rank000_00000003.pt").unlink()
    (tmp_path / "ckpt" / "meta_00000002.json").write_text("{not json")
    assert m.resume(torch.device("cpu")).step == 1


def test_no_checkpoint_resumes_nothing(tmp_path):
    assert manager(tmp_path).resume(torch.device("cpu")) is None


def test_atomic_write_leaves_old_file_when_writer_fails(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")

    def boom(f):
        f.write(b"partial")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        atomic_write(target, boom)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]
