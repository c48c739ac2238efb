"""What every benchmark JSON records of where and on what code it ran (issue 66): the device's name, the versions,
the commit and whether the tree was dirty (with the tree's hash), the command line; and a result whose code changed
while it ran is refused rather than recorded under a commit it did not run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import record  # noqa: E402


def git(cwd, *args):
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    repo = tmp_path / "kit"
    (repo / "trainers").mkdir(parents=True)
    (repo / "trainers" / "a.py").write_text("x = 1\n")
    (repo / "bench" / "results").mkdir(parents=True)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    return repo


def test_every_record_names_the_device_the_versions_the_code_and_the_command():
    facts = record.provenance()
    assert facts["device_name"] and facts["versions"]["torch"] and facts["command"].startswith("python ")
    assert len(facts["tree_sha256"]) == 64
    if (ROOT / ".git").exists():
        assert facts["git_commit"] == git(ROOT, "rev-parse", "HEAD") and facts["git_dirty"] in (True, False)


def test_a_dirty_tree_is_said_and_hashed_as_it_was(checkout, monkeypatch):
    monkeypatch.delenv("TRAINERS_GIT_COMMIT", raising=False)
    clean = record.source_state(checkout)
    assert clean["git_commit"] == git(checkout, "rev-parse", "HEAD") and clean["git_dirty"] is False
    (checkout / "bench" / "results" / "r.json").write_text("{}")  # a benchmark's own output: not the code
    assert record.source_state(checkout) == clean
    (checkout / "trainers" / "a.py").write_text("x = 2\n")
    dirty = record.source_state(checkout)
    assert dirty["git_commit"] == clean["git_commit"] and dirty["git_dirty"] is True
    assert dirty["tree_sha256"] != clean["tree_sha256"]
    (checkout / "trainers" / "a.py").write_text("x = 1\n")
    (checkout / "trainers" / "new.py").write_text("y = 1\n")  # a module not yet added runs all the same
    fresh = record.source_state(checkout)
    assert fresh["git_dirty"] is True and fresh["tree_sha256"] != clean["tree_sha256"]
    assert fresh["git_commit_source"] == "git"


def test_a_copy_without_its_git_folder_is_hashed_from_its_files(checkout, monkeypatch):
    monkeypatch.delenv("TRAINERS_GIT_COMMIT", raising=False)
    subprocess.run(["rm", "-rf", str(checkout / ".git")], check=True)
    bare = record.source_state(checkout)
    assert bare["git_commit"] is None and bare["git_dirty"] is None and len(bare["tree_sha256"]) == 64
    assert bare["git_commit_source"] is None
    (checkout / "trainers" / "a.py").write_text("x = 3\n")
    assert record.source_state(checkout)["tree_sha256"] != bare["tree_sha256"]


def test_a_benchmark_whose_code_changed_while_it_ran_records_nothing(tmp_path, capsys):
    started = dict(record.STARTED, tree_sha256="0" * 64)
    with pytest.raises(record.CodeChanged, match="the code changed while the benchmark ran"):
        record.provenance(started)
    out = tmp_path / "r.json"
    original = record.STARTED
    record.STARTED = started
    try:
        with pytest.raises(SystemExit, match="^error: the code changed"):
            record.write_record({"benchmark": "x"}, str(out))
    finally:
        record.STARTED = original
    assert not out.exists()
    record.write_record({"benchmark": "x"}, str(out))
    assert json.loads(out.read_text())["tree_sha256"] == original["tree_sha256"]


def test_a_run_told_to_see_no_gpu_names_the_cpu(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert record.device_name().startswith("CPU")
