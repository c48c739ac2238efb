"""Several nodes: each node's heartbeat through the job's c10d store, and a watch that ends this node when another
goes silent, so a lost node costs the survivors a bounded wait instead of a collective that never returns.

A node killed outright closes its sockets and the survivors' next collective fails at once; a node that freezes, or
whose network goes, closes nothing, and NCCL or gloo wait out the collective timeout (10 minutes). So the first
worker of each node (local rank 0) beats every BEAT_S into torchrun's agent store (the rendezvous endpoint's, on
node 0) with its step and phase, and reads the others' beats. A node whose beat has not changed for `silence_s`
(TRAINERS_NODE_SILENCE_S, default 60) is lost: every worker of this node sees it, says which node and when, and
exits. A checkpoint is only ever the last complete one (atomic writes), so nothing is lost
but the steps since it. The store itself gone (node 0 lost: it hosts it) reads as node 0's silence.

Each beat is also written to <run>/nodes/node<R>.json, so `status` on any node (they share the run folder) shows
every node's last beat, step and phase.

Staleness is measured by this node's own monotonic clock from the moment a node's beat last changed: the nodes'
wall clocks need not agree.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable

BEAT_S = 5.0
SILENCE_S = 60.0
NODES_DIR = "nodes"
KEY = "trainers/nodes/"
LOST_EXIT = 75  # EX_TEMPFAIL: a rerun of the same command resumes


def node_count() -> int:
    """How many nodes (torchrun agents) this job has: GROUP_WORLD_SIZE, 1 outside torchrun."""
    return int(os.environ.get("GROUP_WORLD_SIZE") or 1)


def node_rank() -> int:
    """This node's rank as the launcher and the deploy name it (TRAINERS_NODE_RANK), else torchrun's group rank."""
    return int(os.environ.get("TRAINERS_NODE_RANK") or os.environ.get("GROUP_RANK") or 0)


def silence_s() -> float:
    said = os.environ.get("TRAINERS_NODE_SILENCE_S") or str(SILENCE_S)
    try:
        value = float(said)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(f"TRAINERS_NODE_SILENCE_S={said!r} must be a positive, finite number of seconds")
    return value


class NodeWatch:
    """Beats for this node and watches the others'. `store`: a c10d Store client of this thread's own (a TCPStore
    with a short timeout); `on_lost(message)` ends the node (the default exits the process)."""

    def __init__(self, store, nnodes: int, rank: int, silence: float = SILENCE_S, beat_s: float = BEAT_S,
                 on_lost: Callable[[str], None] | None = None, beats: bool = True):
        self.store, self.nnodes, self.rank, self.silence, self.beat_s = store, nnodes, rank, silence, beat_s
        self.beats = beats  # the node's first worker beats; every worker watches, so all of them end at once
        self.on_lost = on_lost or _exit_lost
        self.host = socket.gethostname()
        self.step, self.phase, self.run_dir = 0, "starting", None
        self._seq = 0
        self._seen: dict[int, tuple[str, float]] = {}  # node -> (its last beat, when it last changed here)
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainers-nodewatch", daemon=True)

    def start(self) -> "NodeWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        """The last beat says "done": a node that ended its part is not lost while the others finish theirs."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.beat_s + 5)
        self.phase = "done"
        if not self.beats:
            return
        try:
            self.beat_once(time.monotonic())
        except RuntimeError as err:  # the store is gone with node 0: nobody is left to tell
            print(f"nodes: this node's last heartbeat was not sent ({str(err).splitlines()[0][:120]})",
                  file=sys.stderr, flush=True)

    def at(self, step: int, phase: str = "train") -> None:  # the loop's position, read by the next beat
        self.step, self.phase = step, phase

    def _loop(self) -> None:
        while not self._stop.is_set():
            lost = self.beat_once(time.monotonic())
            if lost is not None:  # (said once, by the node's first worker: each worker ends on it)
                self.on_lost(lost if self.beats else "")
                return
            self._stop.wait(self.beat_s)

    def beat_once(self, now: float) -> str | None:
        """One beat and one look at the others; the message naming a lost node, else None."""
        self._seq += 1
        beat = {"node": self.rank, "host": self.host, "step": self.step, "phase": self.phase, "time": time.time(),
                "seq": self._seq, "pid": os.getpid()}
        try:
            if self.beats:
                self.store.set(f"{KEY}{self.rank}", json.dumps(beat))
            for other in range(self.nnodes):
                if other != self.rank and self.store.check([f"{KEY}{other}"]):
                    said = self.store.get(f"{KEY}{other}").decode()
                    if self._seen.get(other, ("",))[0] != said:
                        self._seen[other] = (said, now)
        except RuntimeError:  # (DistNetworkError, DistStoreError are RuntimeErrors) the store's host is node 0
            if self.rank == 0:
                raise
        self._write_file(beat)
        for other in range(self.nnodes):
            if other == self.rank:
                continue
            said, changed = self._seen.get(other, ("", self._started))
            last = json.loads(said) if said else {}
            if now - changed > self.silence and last.get("phase") != "done":
                return self._lost_message(other, last, now - changed)
        return None

    def _lost_message(self, other: int, last: dict, quiet_s: float) -> str:
        where = (f"its last beat: step {last.get('step')}, {last.get('phase')}" if last
                 else "it never beat")
        store = " (it holds the job's store)" if other == 0 else ""
        return (f"node {other} ({last.get('host', '?')}){store} went silent: no heartbeat for {quiet_s:.0f} s "
                f"(TRAINERS_NODE_SILENCE_S={self.silence:g}; {where}); node {self.rank} ({self.host}) stops at step "
                f"{self.step}, keeping the last complete checkpoint; rerun the same command on every node to resume")

    def _write_file(self, beat: dict) -> None:
        if self.run_dir is None or not self.beats:
            return
        from trainers.runtime.files import atomic_write_json

        try:
            atomic_write_json(Path(self.run_dir) / NODES_DIR / f"node{self.rank}.json", beat)
        except OSError as err:  # for `status` only: training goes on, and says so once
            print(f"nodes: cannot write this node's heartbeat file ({err}); `status` will not show it",
                  file=sys.stderr, flush=True)
            self.run_dir = None


def _exit_lost(message: str) -> None:
    if message:  # (a new line first: a progress bar may be drawn there)
        print(f"\nerror: {message}", file=sys.stderr, flush=True)
    os._exit(LOST_EXIT)  # the main thread may be inside a collective that will not return for minutes


_WATCH: NodeWatch | None = None


def start_if_several_nodes() -> NodeWatch | None:
    """In each worker of a multi-node job: the watch (one per process), beating from each node's first worker. Every
    worker watches: a worker left inside a collective when its neighbour exits would hold torchrun's agent for its
    30 s stop timeout."""
    global _WATCH
    env = os.environ
    if (_WATCH is not None or node_count() < 2
            or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_ADDR" not in env):
        return _WATCH
    from torch.distributed import TCPStore

    silence = silence_s()
    store = TCPStore(host_name=env["MASTER_ADDR"], port=int(env["MASTER_PORT"]), is_master=False,
                     timeout=datetime.timedelta(seconds=min(BEAT_S * 2, silence)))
    _WATCH = NodeWatch(store, node_count(), node_rank(), silence, beats=env.get("LOCAL_RANK", "0") == "0").start()
    return _WATCH


def stop() -> None:
    global _WATCH
    if _WATCH is not None:
        _WATCH.stop()
        _WATCH = None


def attach(run_dir: Path) -> None:
    """The run folder this process trains in: the beats are written there for `status` too."""
    if _WATCH is not None:
        _WATCH.run_dir = Path(run_dir)


def at(step: int, phase: str = "train") -> None:
    if _WATCH is not None:
        _WATCH.at(step, phase)


def read_beats(run_dir: Path) -> list[dict]:
    """Every node's last beat in <run>/nodes (for `status`), each checked for what it can be."""
    beats = []
    folder = Path(run_dir) / NODES_DIR
    for path in sorted(folder.glob("node*.json")) if folder.is_dir() else []:
        try:
            beat = json.loads(path.read_bytes()[: 1 << 14])
        except (OSError, ValueError):
            continue
        if isinstance(beat, dict) and isinstance(beat.get("node"), int):
            beats.append(beat)
    return beats
