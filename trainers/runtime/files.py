"""Files we write that must never be seen half-written: temp file, fsync, rename, fsync the folder.

No torch here: the market data cache and the CLI use these without importing it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import stat
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


LOW_SPACE_BYTES = 1 << 20  # a volume with less than this free cannot take even a results file
# numpy's tofile/save on a volume too small: "Not enough free space to write N bytes after offset M" (it asks
# for the space first) or "N requested and M written" (a short write), as OSErrors without an errno
NUMPY_NO_SPACE = re.compile(r"Not enough free space to write|\d+ requested and \d+ written")


class DiskFull(OSError):
    """A write failed because its volume is full (or over quota), whatever library raised it."""

    def __init__(self, path: Path, cause: BaseException | None = None):
        detail = f" ({type(cause).__name__}: {str(cause).splitlines()[0][:160]})" if cause and str(cause) else ""
        super().__init__(errno.ENOSPC, f"no space left on the volume of {path}{detail}", str(path))


def is_disk_full(exc: BaseException, path: Path) -> bool:
    """Whether a failed write into `path` was the disk filling up: an OSError ENOSPC or EDQUOT, or
    any other error (torch.save's zip writer says "unexpected pos", PIL, pandas...) raised while
    the volume has (almost) no space left."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if isinstance(exc, OSError) and exc.errno is None and NUMPY_NO_SPACE.search(str(exc)):
        return True  # numpy's own words, without an errno; it checks before writing, so the volume is not full
    try:
        st = os.statvfs(Path(path).parent)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < LOW_SPACE_BYTES


@contextlib.contextmanager
def full_disk_named(path: Path):
    """Writes into `path` (a folder being built) inside: a failure while its volume is full raises DiskFull
    naming it, whatever raised it (numpy's tofile says "3000000 requested and 1044480 written", with no
    errno, and was a traceback); the caller's clean-up still runs."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as exc:
        volume = Path(path)
        while not volume.exists() and volume != volume.parent:  # the folder, or where it would have been
            volume = volume.parent
        if is_disk_full(exc, volume / "_"):
            raise DiskFull(path, exc) from exc
        raise


def process_umask() -> int:
    """This process's umask: read where Linux shows it (/proc/self/status), else set to 0 and put back (a moment
    in which a file another thread creates would get every permission)."""
    status = Path("/proc/self/status")
    for line in status.read_text().splitlines() if status.is_file() else []:
        if line.startswith("Umask:"):
            return int(line.split()[1], 8)
    umask = os.umask(0)
    os.umask(umask)
    return umask


def plain_file_mode(path: Path) -> int:
    """The permissions a plain open() leaves `path` with: an existing file's own, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~process_umask()


def atomic_write(path: Path, write: Callable[[Any], None], mode: str = "wb") -> None:
    """Write through `write(fileobj)` into a temp file beside `path`, fsync, then rename over it. A
    full disk raises DiskFull, whatever `write` raised (the old file is untouched). The file gets the
    permissions a plain write would give it (`plain_file_mode`): mkstemp's 0600 made every JSON, checkpoint
    and dataset record the kit wrote unreadable to anyone else, in a folder a team shares."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            os.fchmod(f.fileno(), plain_file_mode(path))
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(exc, Exception) and not isinstance(exc, DiskFull) and is_disk_full(exc, path):
            raise DiskFull(path, exc) from exc
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
