"""What the kit wrote into a run folder: each result file's SHA-256 as the run last wrote it.

A results.json edited by hand after training was packed, checksummed and shipped as the run's
(issue 34): the tarball vouched for numbers the run never produced. Every result file (results.json,
the reports and their pictures, export.json) is written through `write_result`/`write_result_json`,
which record its hash in <folder>/written.json, beside the checkpoint metas' hashes of the weights;
`trainers package` compares before packing. Logs that only grow (training.log, metrics.jsonl) are not
result files. No torch here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from trainers.runtime.files import atomic_write, atomic_write_json, sha256_file

WRITTEN = "written.json"


def recorded(folder: Path) -> dict[str, str]:
    """{file name: SHA-256} of what the kit wrote into `folder` ({} when nothing was recorded, or the record
    is garbage: nothing can then be told about edits, and nothing is refused for it)."""
    try:
        record = json.loads((Path(folder) / WRITTEN).read_text())
    except (OSError, ValueError):
        return {}
    files = record.get("files") if isinstance(record, dict) else None
    return {k: v for k, v in files.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(files, dict) \
        else {}


def record(path: Path) -> None:
    """`path` (in its folder) is as the kit just wrote it."""
    path = Path(path)
    files = recorded(path.parent)
    files[path.name] = sha256_file(path)
    atomic_write_json(path.parent / WRITTEN, {"files": dict(sorted(files.items()))})


def write_result(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    atomic_write(path, write, mode)
    record(path)


def write_result_json(path: Path, obj: Any) -> None:
    atomic_write_json(path, obj)
    record(path)


def edited(root: Path, files: list[Path]) -> list[str]:
    """Which of `files` (relative to `root`, in any folder below it) differ from what the kit recorded writing
    there; a file without a record (a run from before the record existed) is not listed."""
    known: dict[Path, dict[str, str]] = {}
    out = []
    for f in files:
        folder = Path(root) / f.parent
        record_of = known.setdefault(folder, recorded(folder))
        if f.name in record_of and sha256_file(folder / f.name) != record_of[f.name]:
            out.append(f.as_posix())
    return out
