"""The layout every trainer follows: a folder per trainer with pure model files, shared packages beside
them, and no import cycle between folders."""

import ast
from pathlib import Path

import pytest

from conftest import ROOT
from trainers.registry import TRAINERS

PACKAGE = ROOT / "trainers"
TRAINER_FILES = ("config.py", "model.py", "train.py", "export.py", "cli.py", "deploy.sh")
MODEL_MAY_IMPORT = {"torch", "__future__", "math", "dataclasses", "typing"}


def imports_of(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


@pytest.mark.parametrize("trainer", TRAINERS)
def test_each_trainer_has_its_folder_with_the_usual_files(trainer):
    folder = PACKAGE / trainer
    missing = [f for f in TRAINER_FILES if not (folder / f).is_file()]
    assert not missing, f"trainers/{trainer} lacks {missing}"


@pytest.mark.parametrize("model", sorted(PACKAGE.glob("*/model.py")), ids=lambda p: p.parent.name)
def test_model_files_import_only_torch(model):
    bad = {m for m in imports_of(model) if m.split(".")[0] not in MODEL_MAY_IMPORT}
    assert not bad, f"{model.relative_to(ROOT)} imports {sorted(bad)}"


def folder_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "trainers" or len(parts) < 2:
        return None
    return parts[1] if (PACKAGE / parts[1]).is_dir() else "(top)"


def test_no_import_cycle_between_folders():
    edges: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE)
        src = rel.parts[0] if len(rel.parts) > 1 else "(top)"
        for module in imports_of(path):
            dst = folder_of(module)
            if dst and dst != src and dst != "(top)":
                edges.setdefault(src, set()).add(dst)

    def reaches(a: str, b: str, seen=None) -> bool:
        seen = seen or set()
        for nxt in edges.get(a, ()):
            if nxt == b or (nxt not in seen and reaches(nxt, b, seen | {nxt})):
                return True
        return False

    cycles = sorted((a, b) for a in edges for b in edges[a] if reaches(b, a))
    assert not cycles, f"folders import each other: {cycles} (edges: {edges})"


def test_the_shared_runtime_knows_no_trainer():
    for path in (PACKAGE / "runtime").rglob("*.py"):
        trainer_imports = {m for m in imports_of(path) if folder_of(m) in TRAINERS}
        assert not trainer_imports, f"{path.name} imports {trainer_imports}"


def test_the_old_flat_modules_are_gone():
    for old in ("jobs", "models", "data", "coloring.py", "evaluation.py", "export.py", "onnx_color.py",
                "nccl_check.py", "runfiles.py", "preflight.py", "package.py"):
        assert not (PACKAGE / old).exists(), old


def test_ruff_finds_no_unused_or_undefined_names_and_imports_are_sorted():
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    if not Path(ruff).exists():
        pytest.skip("ruff is in the test extra: pip install -e '.[test]'")
    proc = subprocess.run([ruff, "check", "."], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
