"""A run resumed from its remote on a fresh machine (`--remote`; the mirror is trainers.runtime.remote).

When the local folder holds no run and the remote does, every file but the checkpoints is copied down,
then the newest checkpoint whose files all match its meta's SHA-256 (and the best one, when older), data
first and meta last; the run then resumes from the local copy under the usual checks (config, data
fingerprint, hashes). A remote checkpoint that fails its check is passed over for the one before it (and set
aside on the remote as `.unusable`, as on disk). Everything is first copied into a temp folder beside the
run's and moved in only once complete: a pull cut short (the network, a kill) leaves the folder empty, and
the next start pulls again. A remote whose config.json differs from this run's options is refused before
anything is written; so is a name in a remote meta that would land outside the run folder.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import shutil
import uuid
from pathlib import Path

from trainers.errors import UsageError
from trainers.runtime.files import atomic_write
from trainers.runtime.remote_store import (
    LEASE,
    META_RE,
    Lease,
    check_remote_place,
    checkpoint_problem,
    mounted_folder,
    open_remote,
    put_bytes,
    read_meta,
    redact,
    sha256_bytes,
)


def holds_a_run(run_dir: Path) -> bool:
    return (run_dir / "config.json").exists() or any((run_dir / "checkpoints").glob("meta_*.json")) or \
        any(run_dir.glob("symbols/*/config.json"))


def safe_name(name: str) -> bool:
    """A relative path that stays inside the folder it is joined to."""
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def pull_run(url: str, run_dir: Path, log=print, cfg=None, fix=None, check_only: bool = False) -> str | None:
    """Copy a remote run into an empty local folder (module docstring); what was pulled, in words, or None
    when the remote holds no run. `cfg`: this run's options, checked against the remote's config first,
    as `fix` pins them from a saved config (the trainer's own pinning, e.g. the date range), on a copy: `cfg` itself
    is never written (a settled one would refuse it); `fix` pins the copy in place or returns the pinned one. A remote
    whose config.json is gone (a store restarted empty, then written again from step N) still resumes: the
    config is the one the newest usable checkpoint's meta records. `check_only`: every check, nothing pulled,
    nothing written anywhere (the deploy's check phase)."""
    from trainers.runtime import config as cfgmod

    fs, root = open_remote(url)
    check_remote_place(fs, root, url, run_dir)
    names = [p[len(root) + 1:] for p in fs.find(root)]
    candidates = _candidates(fs, root, [n for n in names if n.startswith("checkpoints/")])
    if "config.json" not in names and not candidates:
        return None
    Lease(fs, root, run_dir, redact(url)).refuse_if_held()  # a second writer is refused before anything is pulled
    if "config.json" in names:
        try:
            saved = json.loads(fs.cat_file(f"{root}/config.json"))
        except (ValueError, UnicodeDecodeError):
            raise UsageError(f"--remote {redact(url)}: its config.json is not JSON; nothing was changed") from None
        config_from = None
    else:
        config_from = next(iter(candidates))
        saved = candidates[config_from].get("config")
    if cfg is not None:
        if isinstance(saved, dict) and fix is not None:
            copy = dataclasses.replace(cfg)
            cfg = fix(copy, saved) or copy
        diffs = cfgmod.incompatible_fields(saved, cfg) if isinstance(saved, dict) else ["not a config"]
        if diffs:
            raise UsageError(f"--remote {redact(url)} holds a run with a different config ({'; '.join(diffs)}); use "
                             f"the same settings to resume it, or another --remote; nothing was changed")
    unsafe = [n for n in names if not safe_name(n)]
    if unsafe:
        raise UsageError(f"--remote {redact(url)} holds names that would land outside the run folder "
                         f"({', '.join(unsafe[:3])}); nothing was changed")
    if check_only:
        return f"a run to resume ({len(candidates)} checkpoint(s) whose meta is complete; their files are checked " \
               f"when it starts)"
    stage = run_dir.parent / f".{run_dir.name}.pull-{uuid.uuid4().hex[:8]}"
    try:
        plain = [n for n in names if n.rsplit("/", 1)[-1] != LEASE and "checkpoints/" not in n]
        for name in plain:
            _write(stage / name, fs.cat_file(f"{root}/{name}"))
        pulled = []
        for folder in sorted({n.rsplit("checkpoints/", 1)[0] for n in names if "checkpoints/" in n}):
            step = _pull_checkpoints(fs, f"{root}/{folder}checkpoints", stage / folder / "checkpoints", log)
            if step is None:
                raise UsageError(f"--remote {redact(url)}: no checkpoint of {folder or 'the run'} is complete and passes "
                                 f"its SHA-256 check (above); nothing was changed. Add --restart to train it again "
                                 f"from step 0 (the remote's checkpoints are then removed), or give another --remote")
            pulled.append(f"{folder or './'} step {step}")
        if config_from is not None:  # the config the options were checked against (one run's checkpoints share it)
            _write(stage / "config.json", json.dumps(saved, indent=1).encode())
            log(f"--remote {redact(url)} holds no config.json (a store emptied and written again?): it is the one "
                f"the pulled checkpoint's meta records")
        run_dir.mkdir(parents=True, exist_ok=True)
        for entry in sorted(stage.iterdir()):  # complete: moved in (the folder held no run)
            target = run_dir / entry.name
            if target.is_dir() and entry.is_dir():
                shutil.copytree(entry, target, dirs_exist_ok=True)
            else:
                entry.replace(target)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    return f"{len(plain)} files and checkpoints ({'; '.join(pulled) or 'none'})"


def _candidates(fs, root: str, names: list[str]) -> dict[int, dict]:
    """The run's own checkpoints (not a nested job's) whose meta describes a complete checkpoint and records its
    config, newest first, by step: their records. The config of a remote without config.json comes from the first.
    (Quiet: the pull names each meta it passes over, once.)"""
    steps = sorted((int(m.group(1)) for n in names if (m := META_RE.match(n.removeprefix("checkpoints/")))),
                   reverse=True)
    records = {step: read_meta(fs, f"{root}/checkpoints", step) for step in steps}
    return {step: r for step, r in records.items()
            if checkpoint_problem(step, r) is None and isinstance(r.get("config"), dict)}


def _pull_checkpoints(fs, remote: str, local: Path, log) -> int | None:
    """The newest remote checkpoint that is complete (checkpoint_problem: every file of its step listed) and whose
    files all match their SHA-256, and the best one (lowest metric) when it is another; data first, meta last. Each
    one passed over is named and set aside on the remote. The newest one's step (None: none verifies)."""
    names = [p.rsplit("/", 1)[-1] for p in fs.ls(remote, detail=False)]
    records = {}
    for step in sorted((int(m.group(1)) for n in names if (m := META_RE.match(n))), reverse=True):
        record = read_meta(fs, remote, step)
        problem = checkpoint_problem(step, record)
        if problem is None:
            records[step] = record
        else:
            log(f"remote checkpoint step {step}: {problem}; set aside, trying an older one")
            _set_aside(fs, remote, step)
    scored = sorted((r["metric"], -s, s) for s, r in records.items() if isinstance(r.get("metric"), (int, float))
                    and not isinstance(r.get("metric"), bool) and math.isfinite(r["metric"]))
    newest, tried = None, set()
    for step in records:  # newest first
        tried.add(step)
        if _pull_one(fs, remote, local, step, records[step], log):
            newest = step
            break
    for _metric, _neg, step in scored:
        if newest is None or step == newest or (step not in tried and
                                                 _pull_one(fs, remote, local, step, records[step], log)):
            break
    return newest


def _pull_one(fs, remote: str, local: Path, step: int, record: dict, log) -> bool:
    """One checkpoint, if every file is there and matches the meta (a missing or mismatching one sets it aside
    on the remote; a network error is raised: the pull is not complete)."""
    try:
        blobs = {name: fs.cat_file(f"{remote}/{name}") for name in record["files"]}
    except FileNotFoundError as exc:
        log(f"remote checkpoint step {step} is incomplete ({exc}); set aside, trying an older one")
        _set_aside(fs, remote, step)
        return False
    bad = [name for name, data in blobs.items() if sha256_bytes(data) != record["files"][name]]
    if bad:
        log(f"remote checkpoint step {step} fails its SHA-256 check ({', '.join(bad)}); set aside, trying an older "
            f"one")
        _set_aside(fs, remote, step)
        return False
    for name, data in blobs.items():
        _write(local / name, data)
    _write(local / f"meta_{step:08d}.json", json.dumps(record).encode())  # last: complete now
    return True


def _set_aside(fs, remote: str, step: int) -> None:
    """Out of the remote's complete set, kept for a post-mortem (what a local unusable meta gets)."""
    meta = f"{remote}/meta_{step:08d}.json"
    try:
        put_bytes(fs, meta + ".unusable", fs.cat_file(meta))
        fs.rm_file(meta)
    except FileNotFoundError:
        pass  # set aside or pruned by someone else meanwhile


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: f.write(data))


def restore_from_remote(url: str | None, run_dir: Path, ctx, cfg=None, fix=None) -> str | None:
    """Collective, before a trainer reads its run folder: rank 0 pulls the remote run into an empty local
    folder (`pull_run`, after checking the remote's config against `cfg`); every rank gets the same
    one-line refusal when the remote cannot be read or holds another run. What was pulled, in words (None:
    nothing to pull, or a local run is there)."""
    from trainers.runtime.dist import broadcast_object

    if url is None:
        share_run_record(Path(run_dir), ctx)
        return None
    outcome = None
    check_only = os.environ.get("TRAINERS_CHECK_ONLY") == "1"
    restart = cfg is not None and cfg.for_attempt(ctx.restart_count).restart
    if ctx.is_main:
        try:
            if check_only:  # the deploy's check phase: a missing bucket fails here, not in torchrun's workers
                check_writable(url, Path(run_dir))
            if holds_a_run(Path(run_dir)) or (restart and not check_only):
                pulled = None  # (--restart: the remote's checkpoints are removed, so there is nothing to pull)
            else:
                pulled = pull_run(url, Path(run_dir), cfg=cfg, fix=fix, check_only=check_only)
            outcome = ("ok", pulled)
        except UsageError as exc:
            outcome = ("refused", str(exc))
        except Exception as exc:  # noqa: BLE001 - unreachable, denied, malformed: one line, nothing written
            outcome = ("refused", f"--remote {redact(url)} cannot be read ({type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}); check the URL, the endpoint "
                                  f"(AWS_ENDPOINT_URL) and the credentials; nothing was changed")
    kind, text = broadcast_object(ctx, outcome)
    if kind == "refused":
        raise UsageError(text)
    share_run_record(Path(run_dir), ctx)
    if text and ctx.is_main:
        print(f"{'would resume' if check_only else 'resumed'} the run folder {run_dir} from --remote {redact(url)}: "
              f"{text}", flush=True)
    return text


RUN_RECORD = ("config.json", "data.json")  # what every rank reads of the run folder before training (rundir's)


def share_run_record(run_dir: Path, ctx) -> None:
    """Collective: with node 0's run folder the job's alone (checkpoint.run_dir_apart), its config and data record
    copied to every other node's folder, so every rank settles its options from the same saved run (the pinned
    dates, the features) as rank 0 does."""
    from trainers.runtime.apart import run_dir_apart
    from trainers.runtime.dist import barrier, broadcast_object

    if not (ctx.distributed and run_dir_apart()):
        return
    record = broadcast_object(ctx, {name: (run_dir / name).read_bytes() for name in RUN_RECORD
                                    if (run_dir / name).is_file()} if ctx.is_main else None)
    if ctx.local_rank == 0 and not ctx.is_main:  # (another node's first rank)
        run_dir.mkdir(parents=True, exist_ok=True)
        for name in RUN_RECORD:
            if name in record:
                atomic_write(run_dir / name, lambda f, data=record[name]: f.write(data))
            else:  # (an earlier run's, on a node that kept its disk: rank 0's folder says there is none)
                (run_dir / name).unlink(missing_ok=True)
    barrier(ctx)


def check_writable(url: str, run_dir: Path) -> None:
    """One probe object written, read back and removed: the remote exists and takes writes (credentials, bucket,
    a mounted volume that is writable). A mounted volume's run folder that the probe created goes with it."""
    fs, root = open_remote(url)
    check_remote_place(fs, root, url, run_dir)
    folder = mounted_folder(fs, root)
    created = folder is not None and not folder.exists()
    probe = f"{root}/.probe-{uuid.uuid4().hex[:12]}"
    try:
        put_bytes(fs, probe, b"trainers: a write check; removed at once")
        fs.cat_file(probe)
    finally:
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(probe)
        if created and folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
