"""Pack a run into one tarball with a SHA256SUMS file that `sha256sum -c` accepts."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tarfile
import tempfile
from pathlib import Path

from trainers.errors import CheckFailed, UsageError
from trainers.runtime.checkpoint import CheckpointManager
from trainers.runtime.config import check_folder_writable
from trainers.runtime.files import plain_file_mode, sha256_file
from trainers.runtime.lock import describe_holder, held_by_other
from trainers.runtime.rundir import resolve_checkpoint, single_process_context
from trainers.runtime.written import edited

REQUIRED = ("config.json", "results.json", "model.onnx")
PICTURES = "*.png"  # a report's pictures (the forecaster's loss, IC, equity and decile plots; PPO's equity)
OPTIONAL = ("model.onnx.data", "export.json", "results.md", "report.md", "training.log", "metrics.jsonl", "vocab.json")
# What a tarball may go without: reports and logs, none of which the model, its check or its use needs.
REPORTS = ("results.md", "report.md", "training.log", "metrics.jsonl")


def read_results_quietly(run_dir: Path) -> dict:
    """results.json as a dict, or {} when it is missing or unreadable (the caller has its own error)."""
    try:
        got = json.loads((run_dir / "results.json").read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def job_runs(run_dir: Path) -> dict[str, str] | None:
    """A job of many runs (the lstm trainer: one per symbol) lists its finished ones in results.json
    under "runs" (name -> folder inside the job); None for a single run."""
    runs = read_results_quietly(run_dir).get("runs")
    return runs if isinstance(runs, dict) else None


def job_files(run_dir: Path, runs: dict[str, str]) -> list[Path]:
    """The job's own files, then each finished run's files (as for a single run) under its folder."""
    missing = [name for name in ("config.json", "results.json") if not (run_dir / name).is_file()]
    if missing:
        raise UsageError(f"--run-dir {run_dir} lacks {', '.join(missing)}")
    if not runs:
        raise UsageError(f"--run-dir {run_dir} is a job with no finished run yet; nothing to package")
    files = [Path(n) for n in ("config.json", "results.json", "results.md", "training.log") if (run_dir / n).is_file()]
    for name, folder in sorted(runs.items()):
        sub = (run_dir / folder).resolve()
        if not sub.is_relative_to(run_dir.resolve()) or not sub.is_dir():
            raise UsageError(f"--run-dir {run_dir}: run {name!r} points at {folder!r}, not a folder inside the job")
        files += [Path(folder) / f for f in package_files(sub)]
    return files


def package_files(run_dir: Path) -> list[Path]:
    """Files of the run that go into the tarball, relative to run_dir."""
    runs = job_runs(run_dir)
    if runs is not None:
        return job_files(run_dir, runs)
    missing = [name for name in REQUIRED if not (run_dir / name).is_file()]
    if missing and (run_dir / "fold_0").is_dir() and "walk_forward" in read_results_quietly(run_dir):
        raise UsageError(f"--run-dir {run_dir} is a walk-forward (one run per fold_<k> folder): export and package "
                         f"a fold, e.g. --run-dir {run_dir / 'fold_0'}")
    if missing:
        hint = " (run `trainers <trainer> export --run-dir ...` first)" if "model.onnx" in missing else ""
        raise UsageError(f"--run-dir {run_dir} lacks {', '.join(missing)}{hint}")
    ckpt = CheckpointManager(run_dir / "checkpoints", single_process_context(), 1, logging.getLogger("package"))
    step = resolve_checkpoint(ckpt, "best")
    problem = ckpt.verify(step)
    if problem:
        raise CheckFailed(f"will not pack {ckpt.dir}: {problem}; pick a good checkpoint (`trainers <trainer> export "
                          f"--checkpoint STEP`) or retrain")
    verify_onnx(run_dir)
    files = [Path(n) for n in REQUIRED + OPTIONAL if (run_dir / n).is_file()]
    files += sorted(p.relative_to(run_dir) for p in run_dir.glob(PICTURES) if p.is_file())
    files += [ckpt.model_path(step).relative_to(run_dir), ckpt.meta_path(step).relative_to(run_dir)]
    if ckpt.consolidated_path(step).name in ckpt.read_meta(step)["files"]:  # a sharded (FSDP) run's weights
        files.append(ckpt.consolidated_path(step).relative_to(run_dir))
    tb = run_dir / "tensorboard"
    if tb.is_dir():
        files += sorted(p.relative_to(run_dir) for p in tb.rglob("*") if p.is_file())
    return files


def verify_onnx(run_dir: Path) -> None:
    """model.onnx must be the bytes its export checked (export.json records their SHA-256)."""
    try:
        record = json.loads((run_dir / "export.json").read_text())
    except (OSError, ValueError) as exc:
        raise CheckFailed(f"will not pack {run_dir / 'model.onnx'}: its export record export.json is missing or "
                          f"unreadable ({exc}); run `trainers <trainer> export` again") from None
    expected = record.get("sha256") if isinstance(record, dict) else None
    if expected is None or sha256_file(run_dir / "model.onnx") != expected:
        raise CheckFailed(f"will not pack {run_dir / 'model.onnx'}: it is not the file its export checked "
                          f"(SHA-256 differs from export.json); run `trainers <trainer> export` again")


def step_mismatch(results: dict) -> str | None:
    """A warning when model.onnx was exported from another checkpoint than the one the evaluation
    (results, report) describes: the tarball would pair a model with another model's numbers."""
    exported = (results.get("export") or {}).get("checkpoint_step") if isinstance(results.get("export"), dict) else None
    evaluated = (results.get("evaluation") or {}).get("checkpoint_step") if isinstance(
        results.get("evaluation"), dict) else None
    if exported is None or evaluated is None or exported == evaluated:
        return None
    return (f"model.onnx is from checkpoint step {exported} but the evaluation in results.json is of step {evaluated}: "
            f"run `export --checkpoint {evaluated}` (or `evaluate --checkpoint {exported}`) for a matching pair")


def linked_part(run_dir: Path, relative: Path) -> Path | None:
    """The first part of run_dir/relative that is a symbolic link (the file itself, or a folder on
    its way, such as a linked checkpoints/), or None."""
    path = run_dir
    for part in relative.parts:
        path = path / part
        if path.is_symlink():
            return path
    return None


def without_links(run_dir: Path, files: list[Path]) -> tuple[list[Path], list[str]]:
    """The tarball holds the run's own files, never what a symbolic link points at: the link may lead
    anywhere on this machine (/etc/passwd was packed, its checksum listed), and unpacked it would
    point elsewhere on the downloader's. A linked report, log, picture or TensorBoard file is left
    out with a warning; a linked file the tarball vouches for (config, results, the model, its
    export record and vocabulary, the checkpoint) is refused: the package would not be the run."""
    kept, warnings = [], []
    for f in files:
        link = linked_part(run_dir, f)
        if link is None:
            kept.append(f)
            continue
        where = f"{link.relative_to(run_dir)} -> {os.readlink(link)}"
        if f.name in REPORTS or f.match(PICTURES) or "tensorboard" in f.parts:
            warnings.append(f"left out {f.as_posix()}: it is reached through a symbolic link ({where}); the "
                            f"tarball holds only the run's own files")
            continue
        raise UsageError(f"will not pack {f.as_posix()}: it is reached through a symbolic link ({where}), and the "
                         f"tarball holds only the run's own files; copy the file into {run_dir} in place of the link")
    return kept, warnings


EDITED = "EDITED.json"  # in a tarball packed with --allow-edited: the files that are not as the run wrote them


def check_replaceable(output: Path, root: str) -> None:
    """An existing --output (and its .sha256) is replaced only when it is this kit's tarball of a run of the same
    name (an earlier package of this run: a rerun packs it again): never another file of the user's."""
    sidecar = Path(f"{output}.sha256")
    if output.exists() or output.is_symlink():
        if not _is_package_of(output, root):
            raise UsageError(f"--output {output} exists and is not a tarball of the run {root} (this kit's, with "
                             f"{root}/SHA256SUMS): nothing was written; move it away or give another --output")
    if sidecar.exists() or sidecar.is_symlink():
        try:
            ok = sidecar.is_file() and not sidecar.is_symlink() and sidecar.stat().st_size < 4096 and \
                re.fullmatch(rf"[0-9a-f]{{64}}  {re.escape(output.name)}\n", sidecar.read_text()) is not None
        except (OSError, UnicodeDecodeError):
            ok = False
        if not ok:
            raise UsageError(f"{sidecar} exists and is not the checksum line of {output.name}: nothing was written; "
                             f"move it away or give another --output")


def _is_package_of(path: Path, root: str) -> bool:
    if path.is_symlink() or not path.is_file():
        return False
    try:
        with tarfile.open(path, "r:gz") as tar:
            names = tar.getnames()
    except (tarfile.TarError, OSError, EOFError):
        return False
    return f"{root}/SHA256SUMS" in names and all(n == root or n.startswith(f"{root}/") for n in names)


def package_run(run_dir: Path, output: Path | None = None, allow_edited: bool = False) -> dict:
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is not a folder")
    output = Path(output) if output else run_dir.parent / f"{run_dir.name}.tar.gz"
    if output.resolve().is_relative_to(run_dir):
        raise UsageError(f"--output {output} is inside the run folder; put the tarball beside it")
    if output.is_dir():
        raise UsageError(f"--output {output} is a folder; give the tarball's file name, e.g. {output / 'run.tar.gz'}")
    check_folder_writable(output.parent, "--output")
    check_replaceable(output, run_dir.name)
    holder = held_by_other(run_dir)
    if holder:
        raise UsageError(f"--run-dir {run_dir} is still being written by {describe_holder(holder)}; package it "
                         f"when that job has ended")
    files, warnings = without_links(run_dir, package_files(run_dir))
    changed = edited(run_dir, files)  # results, reports, export records: as the run wrote them?
    if changed and not allow_edited:
        raise CheckFailed(f"will not pack {changed[0]}{f' (and {len(changed) - 1} more)' if len(changed) > 1 else ''}: "
                          f"it is not the file the run wrote (edited since?); run the verb that writes it again "
                          f"(evaluate, export), or pack it as edited with --allow-edited ({EDITED} in the tarball "
                          f"then lists it)")
    sums = "".join(f"{sha256_file(run_dir / f)}  {f.as_posix()}\n" for f in files)
    root = run_dir.name
    output.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp", dir=output.parent)
    os.close(fd)
    os.chmod(tmp, plain_file_mode(output))  # mkstemp makes 0600: the tarball is for people to download and read
    try:
        with tarfile.open(tmp, "w:gz") as tar:
            for f in files:
                tar.add(run_dir / f, arcname=f"{root}/{f.as_posix()}", recursive=False)
            extra = Path(tempfile.mkdtemp())
            if changed:
                (extra / EDITED).write_text(json.dumps({"edited_after_the_run": changed, "note": (
                    "packed with --allow-edited: these files differ from what the run wrote (written.json)")}, indent=1))
                tar.add(extra / EDITED, arcname=f"{root}/{EDITED}")
                sums += f"{sha256_file(extra / EDITED)}  {EDITED}\n"
            (extra / "SHA256SUMS").write_text(sums)
            tar.add(extra / "SHA256SUMS", arcname=f"{root}/SHA256SUMS")
            shutil.rmtree(extra)
        os.replace(tmp, output)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    digest = sha256_file(output)
    Path(f"{output}.sha256").write_text(f"{digest}  {output.name}\n")
    out = {"path": str(output), "bytes": output.stat().st_size, "sha256": digest,
           "files": len(files) + 1 + bool(changed), "root": root}
    if changed:
        out["edited_after_the_run"] = changed
    warning = step_mismatch(read_results_quietly(run_dir))
    warnings += [warning] if warning else []
    if warnings:
        out["warnings"] = warnings
    return out
