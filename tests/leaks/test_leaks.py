"""The leak-mutation tier: every honesty guarantee is broken on purpose, and a test must notice.

For each mutant of leak_mutants.py: copy trainers/ (not the tests) into a temporary folder, apply
the mutant there, and run its guarding tests in a subprocess that imports the copy (the copy's
folder is the subprocess's working directory and first on PYTHONPATH, so the editable install of
the real package is shadowed, in the tests' own subprocesses too; the recorder plugin reports which
package was imported and the test checks it). The mutant is caught only when every guard fails on
an assertion raised outside the package; the guards must pass on an unmutated copy.

Why: a guarantee that no test can see break is only true until the next refactor. The PPO window
and the LSTM backtest were correct but unguarded, and the GPT's floor counted a prediction the
trainer never makes, while every test stayed green. Runs in CI with the rest (`-m "not slow"` skips
the subprocess part).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from leak_mutants import MUTANTS, Mutant

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
GUARANTEES = ("forecaster windows", "causal features / normalisation", "splits, walk-forward",
              "point-in-time universe", "PPO", "LSTM", "GPT", "GNN", "published figures' market",
              "device placement", "remote mirror")
# a failed assert; pytest.fail and "DID NOT RAISE" (pytest's Failed names its module "builtins")
ASSERTION_TYPES = {"builtins.AssertionError", "builtins.Failed", "_pytest.outcomes.Failed"}


def copy_package(dest: Path, mutant: Mutant | None = None) -> Path:
    """trainers/ copied into dest (bytecode left behind), with the mutant applied to the copy."""
    shutil.copytree(ROOT / "trainers", dest / "trainers", ignore=shutil.ignore_patterns("__pycache__"))
    if mutant is not None:
        path = dest / mutant.file
        text = path.read_text()
        for old, new in mutant.edits:
            assert text.count(old) == 1, f"{mutant.name}: {old!r} occurs {text.count(old)} times in {mutant.file}"
            text = text.replace(old, new)
        path.write_text(text)
    return dest


def guard_env(pkg: Path, report: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pkg), str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    env["LEAK_REPORT"] = str(report)
    env.pop("TRAINERS_FAULT", None)
    return env


def run_guards(pkg: Path, guards: tuple[str, ...], report: Path) -> tuple[dict, str]:
    """Run the guards against the package in `pkg`; (the recorder's report, the run's output)."""
    # -n 0: in this process, not xdist's workers (pyproject's addopts): the recorder sees the items it runs
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "leak_recorder",
           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), *(f"{ROOT}/{g}" for g in guards)]
    proc = subprocess.run(cmd, cwd=pkg, env=guard_env(pkg, report), capture_output=True, text=True, timeout=600)
    output = (proc.stdout + proc.stderr)[-6000:]
    assert report.exists(), f"the guards' pytest wrote no report (exit {proc.returncode}):\n{output}"
    return json.loads(report.read_text()), output


def items_of(report: dict, guard: str) -> dict[str, dict]:
    """The test items a guard node id ran (a function id covers all its parameters)."""
    return {k: v for k, v in report["tests"].items() if k == guard or k.startswith(guard + "[")}


def verdict(test: dict, pkg: Path) -> tuple[bool, str]:
    """(caught, how): caught only by an assertion of the test, not by a crash or an assert inside
    the package, and not in setup (a fixture that crashed proves nothing)."""
    call = test["phases"].get("call", {})
    if test["outcome"] == "passed":
        return False, "passed"
    if call.get("outcome") != "failed":
        setup = test["phases"].get("setup", {})
        return False, f"{test['outcome']} outside the test body: {setup.get('exception', {}).get('type')}"
    exc = call["exception"]
    where = Path(exc["raised_in"] or "")
    kind = exc["type"].rsplit(".", 1)[-1]
    if not ASSERTION_TYPES & set(exc["mro"]):
        return False, f"crashed with {exc['type']} in {where.name}: {exc['message']}"
    if where.is_relative_to(pkg / "trainers"):
        return False, f"{kind} raised inside the package ({where.relative_to(pkg)}), not by the test"
    if where == ROOT / "tests" / "conftest.py":
        return False, f"{kind} from a conftest helper (a crashed subprocess): {exc['message']}"
    shown = where.relative_to(ROOT) if where.is_relative_to(ROOT) else where.name
    return True, f"{kind} in {shown}: {exc['message'][:120]}"


def check_imported_copy(report: dict, pkg: Path) -> None:
    imported = Path(report["trainers_file"]).resolve()
    assert imported.is_relative_to(pkg.resolve()), f"the guards imported {imported}, not the copy in {pkg}"


# ---- the list itself (fast: runs in the inner loop too) ------------------------------------------
def test_every_mutant_edits_text_that_exists_once_and_names_guards_that_exist():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"[a-z0-9_]+", n) for n in names)
    assert {m.guarantee for m in MUTANTS} == set(GUARANTEES)  # at least one mutant per guarantee
    for m in MUTANTS:
        assert m.file.startswith("trainers/") and m.edits and m.guards, m.name
        text = (ROOT / m.file).read_text()
        for old, new in m.edits:
            # exactly once: a refactor that moves the code fails here, by name, instead of passing silently
            assert text.count(old) == 1, f"{m.name}: {old!r} occurs {text.count(old)} times in {m.file}"
            assert old != new
            text = text.replace(old, new)
        for guard in m.guards:
            path, _, test = guard.partition("::")
            function = test.split("[")[0]
            assert re.search(rf"^def {function}\(", (ROOT / path).read_text(), re.M), f"{m.name}: no {guard}"


# ---- the tier (a subprocess per mutant) --------------------------------------------------------
@pytest.mark.slow
def test_the_unmutated_package_passes_every_guard_and_the_guards_import_the_copy(tmp_path):
    pkg = copy_package(tmp_path / "pkg")
    # the copy shadows the editable install for any process started with this environment, in any folder
    probe = subprocess.run([sys.executable, "-c", "import trainers; print(trainers.__file__)"], cwd=tmp_path,
                           env=guard_env(pkg, tmp_path / "unused.json"), capture_output=True, text=True, check=True)
    print("a subprocess imports", probe.stdout.strip())
    assert Path(probe.stdout.strip()).is_relative_to(pkg)
    guards = tuple(dict.fromkeys(g for m in MUTANTS for g in m.guards))
    report, output = run_guards(pkg, guards, tmp_path / "report.json")
    print("the guards imported", report["trainers_file"])
    check_imported_copy(report, pkg)
    for guard in guards:
        items = items_of(report, guard)
        assert items, f"{guard} was not collected:\n{output}"
        bad = {k: t["outcome"] for k, t in items.items() if t["outcome"] != "passed"}
        assert not bad, f"guards fail on the unmutated code: {bad}\n{output}"


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_the_guards_catch_the_mutant(mutant, tmp_path):
    pkg = copy_package(tmp_path / "pkg", mutant)
    report, output = run_guards(pkg, mutant.guards, tmp_path / "report.json")
    check_imported_copy(report, pkg)
    lines, missed = [], []
    for guard in mutant.guards:
        items = items_of(report, guard)
        assert items, f"{guard} was not collected:\n{output}"
        for nodeid, test in items.items():
            caught, how = verdict(test, pkg)
            lines.append(f"  {'caught' if caught else 'MISSED'}  {nodeid}: {how}")
            if not caught:
                missed.append(nodeid)
    print(f"{mutant.name} ({mutant.file}): {mutant.breaks}\n" + "\n".join(lines))
    assert not missed, f"{mutant.name} ({mutant.breaks}) is not caught:\n" + "\n".join(lines) + f"\n{output}"
