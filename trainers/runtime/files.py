"""Files we write that must never be seen half-written: temp file, fsync, rename, fsync the folder.

No torch here: the market data cache and the CLI use these without importing it.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through `write(fileobj)` into a temp file beside `path`, fsync, then rename over it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def finite_json(value: Any) -> Any:
    """A copy where NaN and infinities are None: JSON has no such numbers, and `null` is honest."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    if hasattr(value, "item") and hasattr(value, "dtype"):  # numpy / torch scalars
        return finite_json(value.item())
    return value


def atomic_write_json(path: Path, obj: Any) -> None:
    clean = finite_json(obj)
    atomic_write(path, lambda f: json.dump(clean, f, indent=2, sort_keys=True, allow_nan=False), mode="w")


def remove_stale_temp_files(folder: Path) -> list[Path]:
    """Temp files our atomic writes leave when killed mid-write (`.<name>.<random>.tmp`), in `folder`
    and its checkpoints. Call only while holding the folder's lock (a live writer's temp file is
    never touched)."""
    removed = []
    for where in (Path(folder), Path(folder) / "checkpoints"):
        if where.is_dir():
            for p in where.glob(".*.tmp"):
                p.unlink(missing_ok=True)
                removed.append(p)
    return removed
