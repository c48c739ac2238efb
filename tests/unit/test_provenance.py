"""Which commit a result says it was measured at. The first GPU run measured a copy of the kit without its
.git that sat inside another repository: every JSON named that repository's commit (fixed by hand, see
bench/results/gpu_h200/README.md). A tree that is not its own checkout records no commit."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trainers.runtime.info import KIT_ROOT, git_commit

ROOT = Path(__file__).resolve().parents[2]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def outer(tmp_path) -> Path:
    """A repository with one commit and, inside it, a copy of the kit's folder layout without a .git."""
    repo = tmp_path / "outer"
    repo.mkdir()
    git(repo, "init", "-q")
    (repo / "x").write_text("x")
    git(repo, "add", "x")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "outer")
    (repo / "kit").mkdir()
    shutil.copy(ROOT / "kit_lib.sh", repo / "kit" / "kit_lib.sh")
    return repo


def test_the_kit_checkout_records_its_own_commit():
    if not (ROOT / ".git").exists():
        pytest.skip("this tree is not a git checkout")
    assert KIT_ROOT == ROOT
    assert git_commit() == git(ROOT, "rev-parse", "HEAD")


def test_a_copy_inside_another_repository_records_none_or_the_image_commit(outer, monkeypatch):
    monkeypatch.delenv("TRAINERS_GIT_COMMIT", raising=False)
    assert git_commit(outer) == git(outer, "rev-parse", "HEAD")  # a checkout of its own: its commit
    assert git_commit(outer / "kit") is None  # not the outer repository's commit
    monkeypatch.setenv("TRAINERS_GIT_COMMIT", "abc1234")
    assert git_commit(outer / "kit") == "abc1234"


def test_the_deploy_log_names_the_same_commit(outer):
    def kit_commit(repo: Path, env_commit: str = "") -> str:
        script = f'set -euo pipefail; REPO="{repo}"; source "{ROOT}/kit_lib.sh"; kit_commit'
        env = {"PATH": "/usr/bin:/bin", **({"TRAINERS_GIT_COMMIT": env_commit} if env_commit else {})}
        return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, check=True).stdout.strip()

    assert kit_commit(outer) == git(outer, "rev-parse", "--short", "HEAD")
    assert kit_commit(outer / "kit") == "unknown"
    assert kit_commit(outer / "kit", "abc1234") == "abc1234"
