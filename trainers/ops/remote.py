"""`trainers remote push` and `trainers remote status`: the deploy kit's side of `--remote`.

    trainers remote push --state FILE --remote URL   the deploy's state file, as <remote>/deploy.state
    trainers remote push --run-dir D --remote URL [--file PATH ...]   the folder's files (after export: the
                 ONNX files; the checkpoints are the run's own mirror's), and each --file under
                 <remote>/package/; waits for the uploads, exit 1 with one line when they did not finish
    trainers remote status --remote URL [--json]   from any machine (a laptop): the deploy's phase, the
                 step, the newest complete checkpoint and its age, whether the heartbeat is fresh, the
                 mirror's lag, how training ended
"""

from __future__ import annotations

import json
import logging
import math
import sys
import time
from pathlib import Path

from trainers.errors import UsageError
from trainers.ops.status import STATE_CAP, read_capped
from trainers.runtime.config import saved_config
from trainers.runtime.remote import Mirror
from trainers.runtime.remote_store import (
    LEASE,
    META_RE,
    check_remote_place,
    check_remote_url,
    checkpoint_problem,
    open_remote,
    put_bytes,
    redact,
)

FRESH_S = 120.0  # a heartbeat older than this (they come every 30 s) means the job is not running


def _one_line(url: str, what: str, call):
    """`call()`, with a storage error as one line naming the (redacted) URL: exit 2, no traceback."""
    try:
        return call()
    except UsageError:
        raise
    except Exception as exc:  # noqa: BLE001 - every backend's errors: unreachable, denied, malformed
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise UsageError(f"--remote {redact(url)} cannot be {what} ({type(exc).__name__}: "
                         f"{first.replace(url, redact(url))}); check the URL, the endpoint (AWS_ENDPOINT_URL) and "
                         f"the credentials") from None


def push(args) -> int:
    check_remote_url(args.remote)
    local = _local_inputs(args)  # (a missing local file is this machine's problem, not the remote's)
    return _one_line(args.remote, "written", lambda: _push(args, *local))


def _local_inputs(args) -> tuple[bytes | None, dict | None, list[Path]]:
    """What push reads here, checked before the remote is touched: (the state file's bytes, the run folder's
    config.json, the --file paths)."""
    if args.state is not None:
        try:
            return read_capped(Path(args.state), STATE_CAP, f"--state {args.state}", "give the deploy's state file "
                               "(<out>/deploy-<trainer>.state)"), None, []
        except FileNotFoundError:
            raise UsageError(f"--state {args.state}: no such file") from None
    if args.run_dir is None:
        raise UsageError("trainers remote push needs --run-dir (or --state)")
    run_dir = Path(args.run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"--run-dir {run_dir} is not a folder")
    config = saved_config(run_dir)  # (garbage there: one line, as for training)
    if config is None:
        raise UsageError(f"--run-dir {run_dir} holds no config.json: not a run folder a training run wrote")
    files = [Path(f) for f in args.file]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise UsageError(f"--file {', '.join(missing)}: no such file")
    return None, config, files


def _push(args, state: bytes | None, config: dict | None, files: list[Path]) -> int:
    if state is not None:  # the deploy's state file alone (no lease: the run's mirror may hold it)
        fs, root = open_remote(args.remote)
        put_bytes(fs, f"{root}/deploy.state", state)
        return 0
    run_dir = Path(args.run_dir)
    log = logging.getLogger("trainers.remote")
    log.addHandler(logging.StreamHandler(sys.stderr))
    mirror = Mirror(args.remote, run_dir, log)
    check_remote_place(mirror.fs, mirror.root, args.remote, run_dir)  # (a missing volume too)
    mirror.start(config=config)  # another run's remote is refused
    with mirror:
        mirror.sync()
        lag = mirror.close(args.wait_s)
    for f in files:  # after the folder: the package and its checksum last
        put_bytes(mirror.fs, f"{mirror.root}/package/{f.name}", f.read_bytes())
    if not lag["caught_up"]:
        print(f"error: the remote {lag['url']} is behind: {lag['pending_uploads']} upload(s) not done after "
              f"{args.wait_s:.0f} s ({lag['last_error']}); everything is in {run_dir}", file=sys.stderr)
        return 1
    print(f"pushed {run_dir} to {lag['url']}" + (f" and {', '.join(f.name for f in files)} to package/" if files
                                                else ""))
    return 0


def remote_status(url: str) -> dict:
    check_remote_url(url)
    return _one_line(url, "read", lambda: _remote_status(url))


def _number(value) -> float | None:
    """A finite number, else None (NaN and infinities are what an edited or corrupted object holds)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    return float(value) if math.isfinite(value) else None


def _remote_status(url: str) -> dict:
    fs, root = open_remote(url)
    out: dict = {"remote": redact(url), "now": time.time()}

    unreadable: list[str] = []  # objects that are there but cannot be read as what the kit writes: named

    def read_json(name: str) -> dict | None:
        try:
            value = json.loads(fs.cat_file(f"{root}/{name}"))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            unreadable.append(f"{name} (not JSON)")
            return None
        if not isinstance(value, dict):
            unreadable.append(f"{name} (a JSON {type(value).__name__})")
            return None
        return value

    def read_state(name: str) -> dict | None:
        try:
            text = fs.cat_file(f"{root}/{name}").decode()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError:
            unreadable.append(f"{name} (not text)")
            return None
        return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    state = read_state("deploy.state")
    beat, results, lease = read_json("heartbeat.json"), read_json("results.json"), read_json(LEASE)
    if state is None and beat is None and results is None:
        raise UsageError(f"--remote {redact(url)} holds no run (no heartbeat.json, results.json or deploy.state)")
    out["deploy"] = {k: state.get(k) for k in ("trainer", "state", "phase", "reason", "host")} if state else None
    if beat and _number(beat.get("time")) is not None:
        age = max(time.time() - _number(beat["time"]), 0.0)
        out["heartbeat"] = {"step": _count(beat.get("step")), "total_steps": _count(beat.get("total_steps")),
                            "age_s": round(age), "fresh": age < FRESH_S,
                            "mirror": beat.get("remote") if isinstance(beat.get("remote"), dict) else None}
    elif beat:
        unreadable.append("heartbeat.json (no finite time)")
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(f"{root}/checkpoints", detail=False)]
    except FileNotFoundError:
        names = []
    steps = []
    for step in sorted((int(m.group(1)) for n in names if (m := META_RE.match(n))), reverse=True):
        problem = checkpoint_problem(step, read_json(f"checkpoints/meta_{step:08d}.json"))
        if problem is None:
            steps.append(step)
            break  # the newest complete one is all status shows
        unreadable.append(f"checkpoints/meta_{step:08d}.json ({problem})")
    if steps:
        try:
            info = fs.info(f"{root}/checkpoints/meta_{steps[0]:08d}.json")
        except FileNotFoundError:  # pruned between the listing and now: a newer one is there
            info = {}
        modified = info.get("LastModified") or info.get("mtime") or info.get("created")
        stamp = _number(modified.timestamp() if hasattr(modified, "timestamp") else modified)
        out["checkpoint"] = {"step": steps[0], "age_s": round(time.time() - stamp) if stamp else None}
    if results:
        t = results.get("training") if isinstance(results.get("training"), dict) else {}
        r = results.get("remote") if isinstance(results.get("remote"), dict) else {}
        if not t:
            unreadable.append("results.json (no training section)")
        out["training"] = {"stop_reason": t.get("stop_reason") if isinstance(t.get("stop_reason"), str) else None,
                           "steps": _count(t.get("steps")),
                           "mirror_caught_up": r.get("caught_up") if isinstance(r.get("caught_up"), bool) else None}
    if lease and _number(lease.get("time")) is not None:
        out["writer"] = {"host": str(lease.get("host"))[:100], "pid": _count(lease.get("pid")),
                         "said_so_s_ago": round(max(time.time() - _number(lease["time"]), 0.0))}
    elif lease:
        unreadable.append(f"{LEASE} (no finite time)")
    if unreadable:
        out["unreadable"] = unreadable
    return out


def _count(value) -> int | None:
    """A step or pid as the kit writes it (a whole number), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def status(args) -> int:
    s = remote_status(args.remote)
    if args.json:
        print(json.dumps(s, indent=1))
        return 0
    lines = [f"remote {s['remote']}"]
    d = s.get("deploy")
    if d:
        lines.append(f"  deploy: {d.get('trainer')} {d.get('state')}, phase {d.get('phase')}"
                     + (f" ({d['reason']})" if d.get("reason") else "") + f", on {d.get('host')}")
    b, t = s.get("heartbeat"), s.get("training")
    if b:
        running = b["fresh"] and not t  # (an ended run's last beat says nothing about now)
        lag = (b.get("mirror") or {}) if running else {}
        state = "training" if running else "ended" if t else f"not running: no heartbeat for over {FRESH_S:.0f} s"
        lines.append(f"  step {b['step']} of {b['total_steps']}; last heartbeat {b['age_s']} s ago ({state})"
                     + (f"; mirror {lag.get('pending_uploads')} upload(s) behind" if lag.get("pending_uploads") else ""))
    c = s.get("checkpoint")
    lines.append(f"  newest complete checkpoint: step {c['step']}, {c['age_s']} s old" if c else
                 "  no complete checkpoint on the remote yet")
    if t:
        lines.append(f"  training ended: {t['stop_reason']} at step {t['steps']}; mirror caught up: "
                     f"{t['mirror_caught_up']}")
    for what in s.get("unreadable", []):
        lines.append(f"  unreadable on the remote, left out above: {what}")
    print("\n".join(lines))
    return 0
