"""The remote store behind `--remote`: URLs checked and opened through fsspec, one object written all or
nothing, and the lease that keeps a remote run to one writer (trainers.runtime.remote mirrors a run with them).
"""

from __future__ import annotations

import hashlib
import json
import os
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
META_RE = re.compile(r"^meta_(\d{8})\.json$")  # a checkpoint's meta: what makes it complete, on disk and remote


def redact(url: str) -> str:
    """The URL without a user:password part (s3://KEY:SECRET@bucket/x -> s3://bucket/x; also without a scheme,
    and with an @ in the password: everything up to the authority's last @ goes)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    authority, slash, path = rest.partition("/")
    return f"{scheme}{sep}{authority.rpartition('@')[2]}{slash}{path}"


URL_HELP = "give a URL like s3://bucket/prefix, gs://bucket/prefix or file:///mounted/volume/run"


def check_remote_url(url: str | None) -> None:
    """What a URL must be before anything runs (no fsspec import: every --help stays fast); one line, the
    URL never printed with credentials."""
    if url is None:
        return
    scheme, sep, rest = url.partition("://")
    authority = rest.partition("/")[0]
    if not url.strip():
        raise UsageError(f"--remote is empty: {URL_HELP}, or leave the option out")
    if "@" in (authority if sep else url.partition("/")[0]):
        raise UsageError(f"--remote {redact(url)}: credentials do not go in the URL (they would be written into "
                         f"config.json and the logs); set them in the backend's environment, e.g. AWS_ACCESS_KEY_ID "
                         f"and AWS_SECRET_ACCESS_KEY")
    if not sep or not re.fullmatch(r"[a-z][a-z0-9+.-]*", scheme) or any(c.isspace() for c in url):
        raise UsageError(f"--remote {redact(url)!r} is not a URL: {URL_HELP}")
    if scheme == "file" and (not rest.startswith("/") or not rest.strip("/")):
        raise UsageError(f"--remote {url!r}: a mounted volume is file:///absolute/path (three slashes), not the "
                         f"current folder or the root")
    if scheme != "file" and not authority:
        raise UsageError(f"--remote {url!r} names no bucket: {URL_HELP}")


def open_remote(url: str):
    """(filesystem, root path) of a remote URL; one line naming what is missing when it cannot be used."""
    check_remote_url(url)
    try:
        import fsspec
    except ImportError:
        raise UsageError(f"--remote {redact(url)} needs fsspec and the backend for its scheme: pip install "
                         f"'trainers[remote]' (fsspec, s3fs); gcsfs for gs://, huggingface_hub for hf://") from None
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
            age = time.time() - held["time"]  # (negative: its clock is ahead of ours; fresh all the same)
            if age < LEASE_STALE_S:
                raise UsageError(f"--remote {self.url} is being written by {held.get('host')} "
                                 f"(pid {held.get('pid')}, {held.get('run_dir')}), which said so {max(age, 0):.0f} s "
                                 f"ago: stop that run first, or wait {LEASE_STALE_S - max(age, 0):.0f} s for its lease "
                                 f"to go stale (its machine was lost)")
        self.refresh()

    def still_mine(self) -> bool:
        """False once another writer took the lease over (ours went stale: an outage longer than
        LEASE_STALE_S): this writer must stop uploading."""
        held = self.read()
        return held is None or held.get("token") == self.me["token"]

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
        """The lease, or None when there is none or it is garbled (a lease that says nothing holds nothing)."""
        try:
            held = json.loads(self.fs.cat_file(self.path))
        except (FileNotFoundError, ValueError, UnicodeDecodeError):
            return None
        if not isinstance(held, dict) or isinstance(held.get("time"), bool) or \
                not isinstance(held.get("time"), (int, float)) or held["time"] != held["time"]:
            return None
        return held

    def refresh(self) -> None:
        put_bytes(self.fs, self.path, json.dumps({**self.me, "time": time.time()}).encode())

    def release(self) -> None:
        held = self.read()
        if held is not None and held.get("token") == self.me["token"]:
            self.fs.rm_file(self.path)


def bounded(call, seconds: float) -> bool:
    """Run `call` in a daemon thread for at most `seconds`; whether it finished without an error."""
    done = []

    def run():
        try:
            call()
            done.append(True)
        except Exception:  # noqa: BLE001 - the caller reports a failure in its own words
            done.append(False)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(done and done[0])
