"""One job per folder: an exclusive lock held for the job's life, naming its holder.

`fcntl.flock` on `<folder>/.lock`: the kernel drops the lock when the holder dies, however it dies
(SIGKILL included), so a dead job never blocks the next one. The file's content names the holder
(host, pid, start time, command); it is emptied on a clean release, so a note found under a free
lock means the last holder died without releasing: it is taken over, with a warning. Two jobs
started a second apart can no longer both write one run folder: the second is refused in one line.
On shared storage flock works across nodes with NFSv4; only one process per job (rank 0) locks.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from trainers.errors import UsageError

LOCK_NAME = ".lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def describe_holder(note: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(note.get("started", 0)))
    return f"pid {note.get('pid')} on {note.get('host')} since {since} ({note.get('command', '?')})"


class FolderLock:
    def __init__(self, folder: Path, what: str = "--run-dir", hint: str = "", lock_name: str = LOCK_NAME,
                 shown: Path | None = None):
        self.folder = Path(folder)
        self.shown = Path(shown) if shown else self.folder  # the path messages name
        self.what = what
        self.hint = hint
        self.path = self.folder / lock_name
        self._fd: int | None = None

    def read_note(self) -> dict:
        try:
            text = self.path.read_text()
            note = json.loads(text) if text.strip() else {}
            return note if isinstance(note, dict) else {}
        except (OSError, ValueError):
            return {}

    def acquire(self, warn=None) -> "FolderLock":
        """Take the lock or raise a UsageError naming who holds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            note = self.read_note()
            holder = describe_holder(note) if note else "another process"
            raise UsageError(f"{self.what} {self.shown} is in use by {holder}; wait for that job to end or "
                             f"stop it{self.hint}, or use another folder") from None
        stale = self.read_note()
        if stale and warn is not None:
            alive = stale.get("host") == socket.gethostname() and _alive(int(stale.get("pid", -1)))
            why = "it is still running but holds no lock" if alive else "it is not running"
            warn(f"{self.what} {self.shown}: taking over the lock left by {describe_holder(stale)}: {why}")
        note = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time(),
                "command": " ".join(sys.argv[:3])[:200]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(note).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)  # an empty note: released cleanly, nothing stale
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "FolderLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def is_locked(path: Path) -> bool:
    """Whether a live process holds an flock on the file at `path` (this FolderLock's, or the
    deploy's `flock` in bash): a shared, non-blocking probe, released at once."""
    if not Path(path).exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def held_by_other(folder: Path) -> dict | None:
    """The holder's note when another live process holds `folder`'s lock; None when it is free."""
    if not is_locked(Path(folder) / LOCK_NAME):
        return None
    return FolderLock(folder).read_note() or {"pid": "?", "host": "?"}
