"""A run folder mirrored to object storage as it is written (`--remote URL`).

Any fsspec URL: s3://bucket/prefix (AWS, or an S3-compatible store through the standard AWS_ENDPOINT_URL,
AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), gs://, hf://, or file:///mnt/volume/run for a mounted volume.
fsspec and its backends (s3fs for S3) are an optional extra (`pip install 'trainers[remote]'`); credentials
come from the backends' own environment and config files, and a URL is logged and recorded without any
user:password part. The remote holds the run folder's layout, readable by hand:

    checkpoints/   each committed checkpoint, behind the loop (a thread of its own, never a stall on the step):
                   its data files first, each checked against the meta's SHA-256 as read back from the remote,
                   then its meta last (a reader never sees a half checkpoint as complete); then the remote is
                   pruned to the local keep set, metas first
    the rest       config, data record and the trainer's own files at the start; heartbeat.json (with the
                   mirror's lag) at each beat; metrics, logs and results as they change; results.json last
    LEASE.json     who writes this remote (host, pid, folder) and when it last said so: a second writer is
                   refused while it is fresh (LEASE_STALE_S), or while its process lives on this machine

An unreachable remote does not stop training: uploads retry with backoff, the log and the heartbeat (so
`status`) show the lag, and the run's end waits at most `--remote-wait-s` for the mirror, then records in
results.json what is still missing. A fresh machine resumes from the remote: trainers.runtime.remote_pull.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import socket
import threading
import time
import uuid
from pathlib import Path

from trainers.errors import UsageError
from trainers.runtime.files import atomic_write

LEASE = "LEASE.json"
LEASE_STALE_S = 120.0  # a holder silent this long has gone (its machine was lost): the lease may be taken over
LEASE_REFRESH_S = 30.0
SIGNAL_WAIT_S = 20.0  # after a SIGTERM the platform's SIGKILL follows in about 30 s: the mirror gets this long
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0
META_RE = re.compile(r"^meta_(\d{8})\.json$")
FAULT_ENV = "TRAINERS_FAULT_REMOTE"  # tests: "kill-before-meta@stepN" SIGKILLs the process between data and meta


def redact(url: str) -> str:
    """The URL without a user:password part (s3://KEY:SECRET@bucket/x -> s3://bucket/x)."""
    return re.sub(r"^([a-z0-9+.-]+://)[^/@]*@", r"\1", url, flags=re.I)


def open_remote(url: str):
    """(filesystem, root path) of a remote URL; one line naming what is missing when it cannot be used."""
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"--remote {redact(url)} needs fsspec and the backend for its scheme: pip install "
                         f"'trainers[remote]' (fsspec, s3fs); gcsfs for gs://, huggingface_hub for hf://") from None
    if "://" not in url:
        raise UsageError(f"--remote {url!r} is not a URL: give s3://bucket/prefix, gs://bucket/prefix or "
                         f"file:///mounted/volume/run")
    try:
        fs, root = fsspec.core.url_to_fs(url)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"--remote {redact(url)}: {str(exc).splitlines()[0]} (install the backend for its scheme: "
                         f"s3fs for s3://, gcsfs for gs://)") from None
    return fs, root.rstrip("/")


def put_bytes(fs, path: str, data: bytes) -> None:
    """One object/file of the remote, all or nothing: an object store's put is atomic; on a mounted
    volume (file://) the bytes go to a temp name first, then are renamed into place."""
    if "file" in _protocols(fs):
        local = Path(fs._strip_protocol(path))
        local.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(local, lambda f: f.write(data))
    else:
        fs.pipe_file(path, data)


def _protocols(fs) -> tuple:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Lease:
    """Who writes a remote run: one machine at a time (taken over only when the holder is silent)."""

    def __init__(self, fs, root: str, run_dir: Path, url: str):
        self.fs, self.path, self.url = fs, f"{root}/{LEASE}", url
        self.me = {"host": socket.gethostname(), "pid": os.getpid(), "run_dir": str(run_dir),
                   "token": uuid.uuid4().hex[:12]}

    def take(self) -> None:
        held = self.read()
        if held is not None and held.get("token") != self.me["token"] and not self._holder_gone(held):
            age = time.time() - float(held.get("time") or 0)
            if age < LEASE_STALE_S:
                raise UsageError(f"--remote {self.url} is being written by {held.get('host')} "
                                 f"(pid {held.get('pid')}, {held.get('run_dir')}), which said so {age:.0f} s ago: "
                                 f"stop that run first, or wait {LEASE_STALE_S - age:.0f} s for its lease to go stale "
                                 f"(its machine was lost)")
        self.refresh()

    @staticmethod
    def _holder_gone(held: dict) -> bool:
        """A holder on this very machine whose process has ended (killed, crashed): no need to wait."""
        if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int):
            return False
        try:
            os.kill(held["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # alive, another user's
            pass
        return False

    def read(self) -> dict | None:
        try:
            return json.loads(self.fs.cat_file(self.path))
        except (FileNotFoundError, ValueError, UnicodeDecodeError):  # none, or garbled: it holds nothing
            return None

    def refresh(self) -> None:
        put_bytes(self.fs, self.path, json.dumps({**self.me, "time": time.time()}).encode())

    def release(self) -> None:
        held = self.read()
        if held is not None and held.get("token") == self.me["token"]:
            self.fs.rm_file(self.path)


class Mirror:
    """Rank 0's uploader: a queue of jobs worked by one thread, each retried with backoff until it is
    done or the run ends (`close`)."""

    def __init__(self, url: str, run_dir: Path, log: logging.Logger):
        self.url, self.run_dir, self.log = redact(url), Path(run_dir), log
        self.fs, self.root = open_remote(url)
        self.lease = Lease(self.fs, self.root, self.run_dir, self.url)
        self._jobs, self._lock, self._stop = queue.Queue(), threading.Lock(), threading.Event()
        self._pending, self._oldest = 0, {}  # jobs not done yet, and when each was queued
        self.mirrored_step, self.uploaded_files, self.failures, self.last_error = None, 0, 0, None
        self._thread, self._lease_at, self._closed = None, 0.0, False
        self._synced: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) as last uploaded

    # ---- the run's side -----------------------------------------------------------------------------
    def __enter__(self) -> "Mirror":
        return self

    def __exit__(self, *exc) -> None:  # a run that failed: what can be uploaded in a moment, then stop
        if not self._closed:
            self.sync()
            self.close(SIGNAL_WAIT_S)

    def attach(self, log: logging.Logger, manager) -> None:
        """Log to the run's log, upload each checkpoint `manager` commits, and the folder as it is now."""
        self.log = log
        manager.on_commit = self.checkpoint
        self.sync()

    def finish(self, wait_s: float, merged: dict | None) -> dict | None:
        """The end of the run: the folder synced, at most `wait_s` for the mirror to catch up, then its
        state in results.json (uploaded last). The merged results."""
        from trainers.runtime.results import merge_results

        self.sync()
        lag = self.close(wait_s)
        merged = merge_results(self.run_dir, {"remote": lag}, self.log.warning)
        self.put_now("results.json")
        return merged

    def start(self) -> "Mirror":
        self.lease.take()  # refuses a second writer before anything is uploaded
        self._lease_at = time.monotonic()
        self._thread = threading.Thread(target=self._work, name="remote-mirror", daemon=True)
        self._thread.start()
        return self

    def sync(self) -> None:
        """Upload every file of the run folder but the checkpoints that changed since its last upload
        (config, data record, the trainer's own files, metrics, logs, heartbeat, results, exports)."""
        self._put(("sync", None))

    def checkpoint(self, step: int) -> None:
        """Upload a committed checkpoint (data, verified, then meta), then prune the remote."""
        self._put(("checkpoint", step))

    def lag(self) -> dict:
        with self._lock:
            oldest = min(self._oldest.values()) if self._oldest else None
            return {"url": self.url, "pending_uploads": self._pending,
                    "oldest_pending_s": None if oldest is None else round(time.monotonic() - oldest, 1),
                    "mirrored_step": self.mirrored_step, "failures": self.failures, "last_error": self.last_error}

    def close(self, wait_s: float) -> dict:
        """Wait at most `wait_s` for the queue to drain, stop the thread, release the lease (only when
        everything was uploaded: a run whose mirror is behind keeps its claim until the lease goes stale)."""
        self._closed = True
        deadline = time.monotonic() + wait_s
        while self._pending and time.monotonic() < deadline and self._thread is not None and self._thread.is_alive():
            time.sleep(0.05)
        self._stop.set()
        self._jobs.put(None)
        if self._thread is not None:
            self._thread.join(timeout=5)
        lag = self.lag()
        lag["caught_up"] = lag["pending_uploads"] == 0
        if lag["caught_up"]:
            try:
                self.lease.release()
            except Exception as exc:  # noqa: BLE001 - the lease goes stale on its own
                self.log.warning("remote: could not release %s (%s); it goes stale in %.0f s", LEASE, exc,
                                 LEASE_STALE_S)
        else:
            self.log.warning("remote %s is behind: %d upload(s) not done after waiting %.0f s (last error: %s); the "
                             "local folder has everything", self.url, lag["pending_uploads"], wait_s, lag["last_error"])
        return lag

    def put_now(self, name: str) -> None:
        """One direct upload of a file of the run folder, after `close` (its final version); a failure is
        logged, not raised (the local folder has it)."""
        try:
            put_bytes(self.fs, f"{self.root}/{name}", (self.run_dir / name).read_bytes())
        except Exception as exc:  # noqa: BLE001 - storage errors of every backend
            self.log.warning("remote %s: could not upload the final %s (%s: %s)", self.url, name, type(exc).__name__, exc)

    def _put(self, job) -> None:
        with self._lock:
            self._pending += 1
            self._oldest[id(job)] = time.monotonic()
        self._jobs.put(job)

    # ---- the thread --------------------------------------------------------------------------------
    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            delay = RETRY_FIRST_S
            while True:
                try:
                    self._do(job)
                    break
                except Exception as exc:  # noqa: BLE001 - any storage error: retried, reported in the lag
                    self.failures += 1
                    self.last_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]
                    if self.failures == 1 or self.failures % 10 == 0:
                        self.log.warning("remote %s: upload failed (%s); retrying in %.0f s", self.url,
                                         self.last_error, delay)
                    if self._stop.wait(delay):
                        return  # the run ended: what is left is reported by close()
                    delay = min(delay * 2, RETRY_MAX_S)
            with self._lock:
                self._pending -= 1
                self._oldest.pop(id(job), None)
            if time.monotonic() - self._lease_at > LEASE_REFRESH_S:
                self._refresh_lease()

    def _refresh_lease(self) -> None:
        try:
            self.lease.refresh()
            self._lease_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - retried at the next job
            self.last_error = f"lease: {type(exc).__name__}: {exc}"[:300]

    def _do(self, job) -> None:
        kind, arg = job
        if kind == "sync":
            self._sync()
        else:
            self._upload_checkpoint(arg)
            self._sync()  # the metrics and log up to this checkpoint beside it

    def _sync(self) -> None:
        for path in sorted(self.run_dir.rglob("*")):
            name = path.relative_to(self.run_dir).as_posix()
            if not path.is_file() or _not_mirrored(name):
                continue
            try:
                st = path.stat()
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # replaced or removed meanwhile: the next sync takes the new one
            if self._synced.get(name) == (st.st_size, st.st_mtime_ns):
                continue
            put_bytes(self.fs, f"{self.root}/{name}", data)
            self._synced[name] = (st.st_size, st.st_mtime_ns)
            self.uploaded_files += 1

    def _upload_checkpoint(self, step: int) -> None:
        folder = self.run_dir / "checkpoints"
        meta_path = folder / f"meta_{step:08d}.json"
        try:
            meta_bytes = meta_path.read_bytes()
        except FileNotFoundError:
            return  # pruned locally before its turn came (the mirror fell behind): a newer one follows
        record = json.loads(meta_bytes)
        for name, expected in record["files"].items():
            try:
                data = (folder / name).read_bytes()
            except FileNotFoundError:
                return
            if sha256_bytes(data) != expected:
                raise OSError(f"local {name} does not match its meta (changed since the commit)")
            remote = f"{self.root}/checkpoints/{name}"
            put_bytes(self.fs, remote, data)
            if sha256_bytes(self.fs.cat_file(remote)) != expected:  # read back: what a resume will read
                raise OSError(f"remote {name} does not match its SHA-256 after the upload")
        _fault_before_meta(step)
        put_bytes(self.fs, f"{self.root}/checkpoints/{meta_path.name}", meta_bytes)  # complete on the remote now
        self.mirrored_step = step if self.mirrored_step is None else max(self.mirrored_step, step)
        self._prune_remote({int(m.group(1)) for p in folder.iterdir() if (m := META_RE.match(p.name))})

    def _prune_remote(self, keep: set[int]) -> None:
        """Remote checkpoints not kept locally: the meta first (never a complete-looking half), then data."""
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.root}/checkpoints", detail=False)]
        doomed = {int(m.group(1)) for n in names if (m := META_RE.match(n)) and int(m.group(1)) not in keep}
        if not doomed:
            return
        for step in sorted(doomed):
            self.fs.rm_file(f"{self.root}/checkpoints/meta_{step:08d}.json")
        for n in names:
            m = re.match(r"^(?:(?:model|rank\d{3}|consolidated)_(\d{8})\.pt|shards_(\d{8}))$", n)
            if m and int(m.group(1) or m.group(2)) in doomed:
                self.fs.rm(f"{self.root}/checkpoints/{n}", recursive=n.startswith("shards_"))


def _not_mirrored(name: str) -> bool:
    """Checkpoints (their own protocol), the lock, temp files of atomic writes, and a nested run's folder
    (an LSTM job's symbols mirror themselves)."""
    base = name.rsplit("/", 1)[-1]
    if re.fullmatch(r"symbols/[^/]+/done\.json", name):  # an LSTM job's marker of a finished symbol: the job's
        return False
    return name.startswith(("checkpoints/", "symbols/")) or "/checkpoints/" in name or base == ".lock" or \
        (base.startswith(".") and base.endswith(".tmp")) or ".set-aside-" in name


def _fault_before_meta(step: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    m = re.fullmatch(r"kill-before-meta@step(\d+)", spec)
    if m and int(m.group(1)) == step:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


# ---- what the run boundary calls --------------------------------------------------------------------------

def start_mirror(url: str | None, run_dir: Path, ctx) -> "Mirror | NoMirror":
    """Collective: rank 0's mirror, its lease taken (a second writer is refused on every rank); every
    other rank, and every run without --remote, gets a mirror that does nothing."""
    from trainers.runtime.dist import broadcast_object

    if not url:
        return NoMirror()
    mirror, problem = NoMirror(), None
    if ctx.is_main:
        try:
            mirror = Mirror(url, run_dir, logging.getLogger("trainers")).start()
        except UsageError as exc:
            problem = str(exc)
        except Exception as exc:  # noqa: BLE001 - unreachable at the start: refused before anything is written
            problem = (f"--remote {redact(url)} cannot be written ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else ''}); check the URL, the endpoint and the "
                       f"credentials")
    problem = broadcast_object(ctx, problem)
    if problem:
        raise UsageError(problem)
    return mirror


class NoMirror:
    """What a run without --remote (and every rank but 0) holds: the mirror's calls, doing nothing."""

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        pass

    def attach(self, log, manager) -> None:
        pass

    def sync(self) -> None:
        pass

    def lag(self) -> None:
        return None

    def finish(self, wait_s: float, merged: dict | None) -> dict | None:
        return merged
