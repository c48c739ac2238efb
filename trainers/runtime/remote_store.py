"""The remote store behind `--remote`: URLs checked and opened through fsspec, one object written all or
nothing, and the lease that keeps a remote run to one writer (trainers.runtime.remote mirrors a run with them).
"""

from __future__ import annotations

import hashlib
import json
import math
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


PROCESS_LOCAL = ("memory",)  # fsspec stores that live in the process: nothing on them outlives a lost pod
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
    if scheme in PROCESS_LOCAL:  # (the mirror would say "caught up" to a store that dies with the process)
        raise UsageError(f"--remote {url!r}: {scheme}:// lives in this process's memory and is gone when it ends, so "
                         f"it cannot keep a run; {URL_HELP}")
    if "//" in rest.rstrip("/")[1 if scheme == "file" else 0:]:  # s3://b//run: stores and fsspec disagree on it
        raise UsageError(f"--remote {url!r} has an empty part ('//') in its path, which object stores and fsspec "
                         f"read differently; write each part once, e.g. {scheme}://{authority}/run")


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


def mounted_folder(fs, root: str) -> Path | None:
    """The local folder of a file:// remote (a mounted volume), else None."""
    return Path(fs._strip_protocol(root)).resolve() if "file" in _protocols(fs) else None


def check_remote_place(fs, root: str, url: str, run_dir: Path, volume: bool = True) -> None:
    """A file:// remote must be a folder of its own on a volume that is there: not the run folder, inside it or
    above it (the mirror would copy itself into itself, one level deeper each sync), not inside another run's
    folder, and (`volume`: where the user's URL enters, a pull, a check, a push) not on a path whose parent folder
    is missing (an unmounted volume: the run would be "mirrored" to the local disk it was meant to outlive)."""
    local = mounted_folder(fs, root)
    if local is None:
        return
    run = Path(run_dir).resolve()
    if local == run or local.is_relative_to(run) or run.is_relative_to(local):
        where = "the run folder" if local == run else "inside the run folder" if local.is_relative_to(run) else \
            "a folder above the run folder"
        raise UsageError(f"--remote {redact(url)} is {where} {run_dir}: a mirror must be a folder of its own, e.g. "
                         f"file:///mnt/volume/{run.name}")
    if (local / ".lock").is_file():  # (a mirror holds no lock file: only a run folder does)
        raise UsageError(f"--remote {redact(url)} is another run's folder: give the remote a folder of its own")
    for parent in local.parents:
        if (parent / "config.json").is_file() and ((parent / "checkpoints").is_dir() or (parent / ".lock").is_file()):
            raise UsageError(f"--remote {redact(url)} lies inside {parent}, another run's folder: give the remote a "
                             f"folder of its own")
    if volume and not local.exists() and not local.parent.is_dir():  # (volume=False: a nested run's mirror, whose
        # parents its job's mirror makes: the job's own entry checked the volume)
        raise UsageError(f"--remote {redact(url)}: {local.parent} does not exist (is the volume mounted?); "
                         f"mount it, or create the folder yourself if a local folder is what you want")


def checkpoint_problem(step: int, record) -> str | None:
    """Why a checkpoint's meta (as read from a remote) does not describe a complete checkpoint of `step`, or
    None: a JSON object of that step whose files are named for that step, with a SHA-256 each, including the
    shared model file, one file per rank of its world size, and the shards' .metadata when it was sharded.
    (A hash check of the files themselves comes after: this says only whether there is anything to check.)"""
    if not isinstance(record, dict):
        return "its meta is not a JSON object"
    files, world = record.get("files"), record.get("world_size")
    if record.get("step") != step:
        return f"its meta is of step {record.get('step')!r}, not {step}"
    if not isinstance(files, dict) or not files:
        return "its meta lists no files"
    if not isinstance(world, int) or isinstance(world, bool) or world < 1:
        return f"its meta gives no world size ({world!r})"
    tag = f"{step:08d}"
    for name, digest in files.items():
        if not isinstance(name, str) or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            return f"its meta lists {str(name)[:60]!r} without a SHA-256"
        m = re.fullmatch(r"(?:model|rank\d{3}|consolidated)_(\d{8})\.pt|shards_(\d{8})/[^/]+", name)
        if not m or (m.group(1) or m.group(2)) != tag:
            return f"its meta lists {name[:60]!r}, which is not a file of step {step}"
    needed = [f"model_{tag}.pt", *(f"rank{r:03d}_{tag}.pt" for r in range(world))]
    if record.get("sharded"):
        needed.append(f"shards_{tag}/.metadata")
    missing = [n for n in needed if n not in files]
    if missing:
        return f"its meta leaves out {', '.join(missing[:3])}"
    return None


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
                   "token": uuid.uuid4().hex[:12], **machine_identity()}

    def take(self) -> None:
        self.refuse_if_held()
        self.refresh()

    def refuse_if_held(self) -> None:
        """A UsageError while another writer holds the lease (fresh, and not a dead process of this machine);
        reads only (a pull checks this before it writes anything)."""
        held = self.read()
        if held is None or held.get("token") == self.me["token"] or self._holder_gone(held):
            return
        age = self.age_s(held)
        if age < LEASE_STALE_S:
            raise UsageError(f"--remote {self.url} is being written by {held.get('host')} "
                             f"(pid {held.get('pid')}, {held.get('run_dir')}), which said so {max(age, 0):.0f} s "
                             f"ago: stop that run first, or wait {LEASE_STALE_S - max(age, 0):.0f} s for its lease "
                             f"to go stale (its machine was lost)")

    def age_s(self, held: dict) -> float:
        """How long ago the holder last wrote the lease. The store's own clock (the object's modification time)
        where the store gives one, when it is the older: a holder whose clock runs ahead, or a lease edited to 1e18,
        would otherwise look fresh forever; else the holder's own time."""
        try:
            info = self.fs.info(self.path)
        except (FileNotFoundError, OSError):
            info = {}
        modified = info.get("LastModified") or info.get("mtime") or info.get("created")
        stamp = modified.timestamp() if hasattr(modified, "timestamp") else modified
        said = held["time"]
        if isinstance(stamp, (int, float)) and math.isfinite(stamp) and stamp > 0:
            said = min(said, float(stamp))  # (the older of the two: a time written ahead never outlives the write)
        return max(time.time() - said, 0.0)

    def still_mine(self) -> bool:
        """False once another writer took the lease over (ours went stale: an outage longer than
        LEASE_STALE_S): this writer must stop uploading."""
        held = self.read()
        return held is None or held.get("token") == self.me["token"]

    @staticmethod
    def _holder_gone(held: dict) -> bool:
        """A holder on this very machine whose process has ended (killed, crashed): no need to wait. The same
        machine is the same kernel boot and pid namespace, not only the same hostname (containers on different
        hosts share hostnames; a pid means nothing in another namespace)."""
        if held.get("host") != socket.gethostname() or not isinstance(held.get("pid"), int) or \
                isinstance(held.get("pid"), bool) or held["pid"] <= 0:
            return False
        mine = machine_identity()
        if not mine or any(held.get(k) != v for k, v in mine.items()):
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
                not isinstance(held.get("time"), (int, float)) or not math.isfinite(held["time"]):
            return None
        return held

    def refresh(self) -> None:
        put_bytes(self.fs, self.path, json.dumps({**self.me, "time": time.time()}).encode())

    def release(self) -> None:
        held = self.read()
        if held is not None and held.get("token") == self.me["token"]:
            self.fs.rm_file(self.path)


def machine_identity() -> dict:
    """This kernel's boot id and this process's pid namespace (Linux), or {} where they cannot be read."""
    try:
        return {"boot_id": Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
                "pid_ns": os.readlink("/proc/self/ns/pid")}
    except OSError:
        return {}


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


def check_remote_run(fs, root: str, url: str, run_dir: Path, cfg, config: dict | None) -> None:
    """Refuse a remote that holds another run: another config (`cfg`, a training run's options; `config`, the
    folder's config.json as written, for `trainers remote push`), or a complete checkpoint newer than the folder's
    (its history would be overwritten; a garbage meta is no checkpoint); --restart's old checkpoints are removed."""
    from trainers.runtime import config as cfgmod

    try:
        saved = json.loads(fs.cat_file(f"{root}/config.json"))
    except FileNotFoundError:
        saved = None
    except (ValueError, UnicodeDecodeError):
        saved = {}
    if saved is not None and cfg is not None:
        diffs = cfgmod.incompatible_fields(saved, cfg) if isinstance(saved, dict) else ["not a config"]
    elif saved is not None and config is not None:  # the same run's config.json is the same JSON
        diffs = [f"{k}: remote {saved.get(k)!r}, here {config.get(k)!r}" for k in sorted({*saved, *config})
                 if saved.get(k) != config.get(k)] if isinstance(saved, dict) else ["not a config"]
    else:
        diffs = []
    if diffs:
        raise UsageError(f"--remote {url} holds a run with a different config ({'; '.join(diffs[:3])}); "
                         f"give this run another --remote; nothing was changed")
    if cfg is not None and cfg.restart:
        return  # its checkpoints are the old run's, removed before the first upload (Mirror.forget_checkpoints)
    try:
        listed = [int(m.group(1)) for p in fs.ls(f"{root}/checkpoints", detail=False)
                  if (m := META_RE.match(p.rsplit("/", 1)[-1]))]
    except FileNotFoundError:
        listed = []
    local = newest_local_step(run_dir)
    newer = [step for step in listed if step > local and
             checkpoint_problem(step, read_meta(fs, f"{root}/checkpoints", step)) is None]
    if newer:
        raise UsageError(f"--remote {url} holds a newer checkpoint (step {max(newer)}) than {run_dir} "
                         f"({'step ' + str(local) if local >= 0 else 'none'}): to resume from the remote, start "
                         f"with an empty --run-dir; to go on from this folder, give another --remote; nothing was "
                         f"changed")


def newest_local_step(run_dir: Path) -> int:
    """The newest checkpoint meta's step in a run folder, -1 for none."""
    folder = Path(run_dir) / "checkpoints"
    return max((int(m.group(1)) for p in folder.iterdir() if (m := META_RE.match(p.name))), default=-1) \
        if folder.is_dir() else -1


def read_meta(fs, folder: str, step: int):
    """A remote checkpoint folder's meta of `step` as JSON, or None when it is gone or not JSON (checkpoint_problem
    then says why it is no checkpoint)."""
    try:
        return json.loads(fs.cat_file(f"{folder}/meta_{step:08d}.json"))
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
