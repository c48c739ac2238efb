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

import contextlib
import itertools
import json
import logging
import os
import queue
import re
import threading
import time
from pathlib import Path

from trainers.errors import UsageError
from trainers.runtime.remote_store import (
    LEASE,
    LEASE_REFRESH_S,
    LEASE_STALE_S,
    META_RE,
    Lease,
    bounded,
    check_remote_place,
    check_remote_run,
    newest_local_step,
    open_remote,
    put_bytes,
    redact,
    sha256_bytes,
)

SIGNAL_WAIT_S = 20.0  # after a SIGTERM the platform's SIGKILL follows in about 30 s: the mirror gets this long
FINAL_CALL_S = 5.0  # the last direct calls (results.json, the lease): a store that hangs is not waited for longer
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 60.0
FAULT_ENV = "TRAINERS_FAULT_REMOTE"  # tests: "kill-before-meta@stepN" SIGKILLs the process between data and meta


class Mirror:
    """Rank 0's uploader: a queue of jobs worked by one thread, each retried with backoff until it is
    done or the run ends (`close`)."""

    def __init__(self, url: str, run_dir: Path, log: logging.Logger):
        self.url, self.run_dir, self.log = redact(url), Path(run_dir), log
        self.fs, self.root = open_remote(url)
        check_remote_place(self.fs, self.root, url, self.run_dir, volume=False)  # (pull, check and push: the volume)
        self.lease = Lease(self.fs, self.root, self.run_dir, self.url)
        self._jobs, self._lock, self._stop = queue.Queue(), threading.Lock(), threading.Event()
        self._pending, self._oldest = 0, {}  # jobs not done yet, and when each was queued
        self.mirrored_step, self.uploaded_files, self.failures, self.last_error = None, 0, 0, None
        self._thread, self._closed, self._ids = None, False, itertools.count()
        self.lost_lease = False  # another writer took the remote over: nothing more is uploaded
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
        manager.mirror = self  # (its checkpoint and forget_checkpoints)
        self.sync()

    def finish(self, wait_s: float, merged: dict | None, results_lock=contextlib.nullcontext) -> dict | None:
        """The end of the run: the folder synced, at most `wait_s` for the mirror to catch up, then its
        state in results.json (uploaded last). The merged results. `results_lock`: held while results.json is
        read and rewritten, where another process may rewrite it too (an LSTM job's late worker)."""
        from trainers.runtime.results import merge_results

        self.sync()
        lag = self.close(wait_s)
        with results_lock():
            merged = merge_results(self.run_dir, {"remote": lag}, self.log.warning)
        self.put_now("results.json")
        return merged

    def start(self, cfg=None, config: dict | None = None) -> "Mirror":
        """Refuse a remote that holds another run (another config, or checkpoints newer than this folder's:
        its history would be overwritten), or another live writer; then start uploading. `cfg`: the run's
        options (a training run); `config`: the folder's config.json as written (`trainers remote push`)."""
        check_remote_run(self.fs, self.root, self.url, self.run_dir, cfg, config)
        self.lease.take()  # refuses a second writer before anything is uploaded
        self._thread = threading.Thread(target=self._work, name="remote-mirror", daemon=True)
        self._thread.start()
        threading.Thread(target=self._keep_lease, name="remote-lease", daemon=True).start()
        return self

    def sync(self) -> None:
        """Upload every file of the run folder but the checkpoints that changed since its last upload
        (config, data record, the trainer's own files, metrics, logs, heartbeat, results, exports)."""
        self._put("sync", None)

    def checkpoint(self, step: int) -> None:
        """Upload a committed checkpoint (data, verified, then meta), then prune the remote."""
        self._put("checkpoint", step)

    def lag(self) -> dict:
        with self._lock:
            oldest = min(self._oldest.values()) if self._oldest else None
            return {"url": self.url, "pending_uploads": self._pending,
                    "oldest_pending_s": None if oldest is None else round(time.monotonic() - oldest, 1),
                    "mirrored_step": self.mirrored_step, "failures": self.failures, "last_error": self.last_error,
                    **({"lost_lease": True} if self.lost_lease else {})}

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
            if not bounded(self.lease.release, FINAL_CALL_S):
                self.log.warning("remote: could not release %s; it goes stale in %.0f s", LEASE, LEASE_STALE_S)
        else:
            self.log.warning("remote %s is behind: %d upload(s) not done after waiting %.0f s (last error: %s); the "
                             "local folder has everything", self.url, lag["pending_uploads"], wait_s, lag["last_error"])
        return lag

    def forget_checkpoints(self) -> None:
        """--restart (CheckpointManager.set_aside): the remote's checkpoints removed (the local ones are set aside,
        kept) before the new run's first upload (the jobs run in order). Kept, they were the old run's and of higher
        steps than the new run's: a pod lost in the new run resumed the old run's newest from there."""
        self._put("forget", None)

    def put_now(self, name: str) -> None:
        """One direct upload of a file of the run folder, after `close` (its final version), at most
        FINAL_CALL_S long (a store that hangs must not hold the process after a SIGTERM); a failure is
        logged, not raised (the local folder has it)."""
        if self.lost_lease or not bounded(lambda: put_bytes(self.fs, f"{self.root}/{name}",
                                                            (self.run_dir / name).read_bytes()), FINAL_CALL_S):
            self.log.warning("remote %s: the final %s was not uploaded (the local folder has it)", self.url, name)

    def _put(self, kind: str, arg) -> None:
        job = (next(self._ids), kind, arg)
        with self._lock:
            self._pending += 1
            self._oldest[job[0]] = time.monotonic()
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
                self._oldest.pop(job[0], None)

    def _keep_lease(self) -> None:
        """Its own thread: the lease refreshed every LEASE_REFRESH_S whatever the uploads are doing (a long
        upload must not let it go stale); a lease another writer took over stops the uploads."""
        while not self._stop.wait(LEASE_REFRESH_S):
            try:
                if not self.lease.still_mine():
                    self.lost_lease = True
                    self.log.error("remote %s was taken over by another writer (this one was silent for over %.0f s): "
                                   "nothing more is uploaded; the local folder has everything", self.url, LEASE_STALE_S)
                    return
                self.lease.refresh()
            except Exception as exc:  # noqa: BLE001 - retried at the next refresh
                self.last_error = f"lease: {type(exc).__name__}: {exc}"[:300]

    def _do(self, job) -> None:
        _id, kind, arg = job
        if self.lost_lease:
            return
        if kind == "sync":
            self._sync()
        elif kind == "forget":
            self._forget_checkpoints()
        else:  # (the rest of the folder follows at the next heartbeat: a sync per checkpoint re-sent the
            self._upload_checkpoint(arg)  # growing metrics and logs every few steps, for nothing)

    def _sync(self) -> None:
        lost = self._remote_lost_files()
        if lost:
            self.log.warning("remote %s lost %s (a store emptied or restarted?): uploading the run again", self.url,
                             lost)
            self._synced.clear()
            self.mirrored_step = None
        for path in sorted(self.run_dir.rglob("*")):
            name = path.relative_to(self.run_dir).as_posix()
            if not path.is_file() or _not_mirrored(name):
                continue
            try:
                st = path.stat()
                if self._synced.get(name) == (st.st_size, st.st_mtime_ns):
                    continue
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # replaced or removed meanwhile: the next sync takes the new one
            put_bytes(self.fs, f"{self.root}/{name}", data)
            self._synced[name] = (st.st_size, st.st_mtime_ns)
            self.uploaded_files += 1
        if lost:  # the newest checkpoint again (a resume needs one); the older ones were pruned locally or follow
            newest = newest_local_step(self.run_dir)
            if newest >= 0:
                self._upload_checkpoint(newest)

    def _remote_lost_files(self) -> str | None:
        """What the remote no longer holds of what this mirror uploaded: config.json, or the meta of the newest
        checkpoint mirrored (two existence checks a sync; a sync comes at each heartbeat)."""
        if "config.json" in self._synced and not self.fs.exists(f"{self.root}/config.json"):
            return "config.json"
        if self.mirrored_step is not None and \
                not self.fs.exists(f"{self.root}/checkpoints/meta_{self.mirrored_step:08d}.json"):
            return f"checkpoint step {self.mirrored_step}"
        return None

    def _upload_checkpoint(self, step: int) -> None:
        folder = self.run_dir / "checkpoints"
        meta_path = folder / f"meta_{step:08d}.json"
        try:
            meta_bytes = meta_path.read_bytes()
            record = json.loads(meta_bytes)
            for name in record["files"]:
                (folder / name).stat()
        except FileNotFoundError:  # pruned locally before its turn came: a newer one follows
            self.log.info("remote %s: checkpoint step %d was pruned here before its upload (the mirror is behind); "
                          "the next one follows", self.url, step)
            return
        for name, expected in record["files"].items():
            try:
                data = (folder / name).read_bytes()
            except FileNotFoundError:  # pruned meanwhile: its uploaded files are orphans the next prune removes
                self.log.info("remote %s: checkpoint step %d was pruned here during its upload", self.url, step)
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
        self._prune_remote(step, {int(m.group(1)) for p in folder.iterdir() if (m := META_RE.match(p.name))})

    def _forget_checkpoints(self) -> None:
        """Every remote checkpoint, the metas first (never a complete-looking half)."""
        if not self.fs.exists(f"{self.root}/checkpoints"):
            return
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.root}/checkpoints", detail=False)]
        for n in sorted(names, key=lambda n: not META_RE.match(n)):
            self.fs.rm(f"{self.root}/checkpoints/{n}", recursive=True)

    def _prune_remote(self, uploaded: int, keep: set[int]) -> None:
        """Remote checkpoints older than the one just uploaded and not kept locally, the meta first (never a
        complete-looking half), then their data; data files left without a meta by a step pruned during its
        upload, too. Never the one just uploaded, nor anything newer."""
        names = [p.rsplit("/", 1)[-1] for p in self.fs.ls(f"{self.root}/checkpoints", detail=False)]
        metas = {int(m.group(1)) for n in names if (m := META_RE.match(n))}
        for step in sorted(s for s in metas if s < uploaded and s not in keep):
            self.fs.rm_file(f"{self.root}/checkpoints/meta_{step:08d}.json")
            metas.discard(step)
        for n in names:
            m = re.match(r"^(?:(?:model|rank\d{3}|consolidated)_(\d{8})\.pt|shards_(\d{8}))$", n)
            if m and int(m.group(1) or m.group(2)) < uploaded and int(m.group(1) or m.group(2)) not in metas:
                self.fs.rm(f"{self.root}/checkpoints/{n}", recursive=n.startswith("shards_"))


def _not_mirrored(name: str) -> bool:
    """Checkpoints (their own protocol), the locks (.lock, an LSTM job's .summary.lock), temp files of atomic
    writes, and a nested run's folder (an LSTM job's symbols mirror themselves)."""
    base = name.rsplit("/", 1)[-1]
    if re.fullmatch(r"symbols/[^/]+/(done|device_lost)\.json", name):  # an LSTM job's marker of a finished symbol
        return False  # and its count of broken CUDA contexts: the job's
    return name.startswith(("checkpoints/", "symbols/")) or "/checkpoints/" in name or \
        (base.startswith(".") and base.endswith((".lock", ".tmp"))) or ".set-aside-" in name


def _fault_before_meta(step: int) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    m = re.fullmatch(r"kill-before-meta@step(\d+)", spec)
    if m and int(m.group(1)) == step:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


# ---- what the run boundary calls --------------------------------------------------------------------------

def start_mirror(url: str | None, run_dir: Path, ctx, cfg=None) -> "Mirror | NoMirror":
    """Collective: rank 0's mirror, its lease taken (a second writer is refused on every rank); every
    other rank, and every run without --remote, gets a mirror that does nothing."""
    from trainers.runtime.dist import broadcast_object

    if url is None:
        return NoMirror()
    mirror, problem = NoMirror(), None
    if ctx.is_main:
        try:
            mirror = Mirror(url, run_dir, logging.getLogger("trainers")).start(cfg)
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

    def finish(self, wait_s: float, merged: dict | None, results_lock=None) -> dict | None:
        return merged
