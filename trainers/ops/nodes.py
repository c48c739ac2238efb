"""`trainers nodes meet`: the nodes of a multi-node deploy meet before anything is fetched or trained, and find out
whether they share the output folder.

Every node's data, checkpoints and results live in one run folder, so the nodes must share the disk it is on
(NFS, a bucket mounted on every node, a ReadWriteMany volume). Nothing on a node says whether its folder is the
others' too: node 0 writes a marker with a fresh random name into its output folder and tells the others the name
through a c10d TCPStore at the rendezvous endpoint (the port torchrun's rendezvous takes over a moment later);
each node says whether it sees that marker. Node 0 hands every node one verdict, so all of them go on or all stop.

A node that never comes, two nodes claiming one rank, nodes that disagree on the node count, or a folder not
shared all end every node in one line that names the node and the fix, before minutes are spent on data.
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from datetime import timedelta
from pathlib import Path

from trainers.errors import UsageError

MARKER_PREFIX = ".node0-marker-"
DONE_WAIT_S = 30.0  # node 0 waits this long for every node to have read the verdict before it closes the store


def _store(host: str, port: int, is_head: bool, timeout_s: float):
    from torch.distributed import TCPStore

    try:
        return TCPStore(host, port, is_master=is_head, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)
    except (RuntimeError, OSError) as err:  # (torch's DistNetworkError is a RuntimeError)
        what = f"listen on port {port}" if is_head else f"reach node 0 at {host}:{port}"
        raise UsageError(f"nodes: could not {what} within {timeout_s:g} s ({str(err).splitlines()[0][:160]}); "
                         "is node 0 up, and the port open between the nodes?") from None


def _get(store, key: str, timeout_s: float, waiting_for: str) -> str:
    try:
        store.wait([key], timedelta(seconds=timeout_s))
    except RuntimeError:
        raise UsageError(f"nodes: {waiting_for} did not come within {timeout_s:g} s") from None
    return store.get(key).decode()


def meet(out: Path, nnodes: int, node_rank: int, endpoint: str, timeout_s: float, workers: int | None = None) -> dict:
    """Collective across the nodes; returns node 0's verdict: {"shared": bool, "nodes": [{rank, host, sees, workers}],
    "same_workers": bool} (`workers`: this node's training processes, None when not said)."""
    host, _, port = endpoint.rpartition(":")
    is_head = node_rank == 0
    store = _store(host, int(port), is_head, timeout_s)
    if is_head:
        out.mkdir(parents=True, exist_ok=True)
        for stale in out.glob(f"{MARKER_PREFIX}*"):  # a node 0 killed mid-meet left its own behind
            stale.unlink(missing_ok=True)
        nonce = uuid.uuid4().hex
        marker = out / f"{MARKER_PREFIX}{nonce}"
        marker.write_text(socket.gethostname() + "\n")
        store.set("kit/nonce", nonce)
    nonce = _get(store, "kit/nonce", timeout_s, "node 0's marker name")
    me = {"rank": node_rank, "host": socket.gethostname(), "pid": os.getpid(), "nnodes": nnodes,
          "sees": (out / f"{MARKER_PREFIX}{nonce}").is_file(), "id": uuid.uuid4().hex, "workers": workers}
    claimed = store.compare_set(f"kit/node{node_rank}", "", json.dumps(me)).decode()
    if claimed != json.dumps(me):  # the key was already another node's
        first = json.loads(claimed)
        store.set("kit/verdict", json.dumps({"error": f"two nodes claim rank {node_rank}: {first['host']} (pid "
                                                      f"{first['pid']}) and {me['host']} (pid {me['pid']})"}))
    if is_head:
        verdict = _head_verdict(store, nnodes, timeout_s)
        store.set("kit/verdict", json.dumps(verdict))
        came = sum(store.check([f"kit/node{rank}"]) for rank in range(1, nnodes))
        deadline = time.monotonic() + DONE_WAIT_S
        while store.add("kit/read", 0) < came and time.monotonic() < deadline:
            time.sleep(0.1)
        marker.unlink(missing_ok=True)
    else:
        # node 0 may have started a whole timeout before this node, and waits that long for the last one
        verdict = json.loads(_get(store, "kit/verdict", timeout_s + DONE_WAIT_S, "node 0's verdict"))
        store.add("kit/read", 1)
    if "error" in verdict:
        raise UsageError(f"nodes: {verdict['error']}")
    return verdict


def _head_verdict(store, nnodes: int, timeout_s: float) -> dict:
    keys = [f"kit/node{rank}" for rank in range(nnodes)]
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [rank for rank, key in enumerate(keys) if not store.check([key])]
        if not missing:
            break
        if time.monotonic() > deadline:
            return {"error": f"node(s) {', '.join(map(str, missing))} of {nnodes} did not come within {timeout_s:g} s"}
        if store.check(["kit/verdict"]):  # a duplicate rank was found by the node that claimed it second
            return json.loads(store.get("kit/verdict"))
        time.sleep(0.1)
    nodes = [json.loads(store.get(key)) for key in keys]
    counts = {node["nnodes"] for node in nodes}
    if len(counts) > 1:
        said = ", ".join(f"node {n['rank']} ({n['host']}) {n['nnodes']}" for n in nodes)
        return {"error": f"the nodes disagree on the node count: {said}"}
    workers = {node.get("workers") for node in nodes}
    return {"shared": all(node["sees"] for node in nodes), "nodes": nodes,
            "same_workers": len(workers) == 1 and None not in workers}


SETTLE_S = 20.0  # how long a survivor waits for the other nodes' deploys to end their own way before it judges them


def lost_nodes(out: Path, trainer: str, nnodes: int, me: int, run_dir: Path, since: float = 0.0,
               settle_s: float = SETTLE_S) -> list[str]:
    """After this node's training (started at `since`) failed: the other nodes that were lost, each in words. This
    node's own watch may have named one already (a node frozen or cut off, trainers/runtime/nodewatch.py). Else lost
    is a deploy gone without ending (its state still says running, its lock free: killed, or its machine went) or, for
    one still holding its lock, a heartbeat of this training older than the silence bound. A node that failed its own
    way (its state says failed), or whose last beat said it was done, is not lost."""
    from trainers.ops.status import node_files, read_state
    from trainers.runtime import nodewatch
    from trainers.runtime.lock import is_locked

    named = nodewatch.verdict(run_dir, me, since)
    if named is not None:
        return [named]
    deadline = time.monotonic() + settle_s
    while True:
        lost, pending = [], []
        for rank in (r for r in range(nnodes) if r != me):
            state_path, lock = node_files(out, trainer, rank)
            state = read_state(state_path).get("state") if state_path.is_file() else None
            if is_locked(lock):
                pending.append(rank)
            elif state == "running":
                lost.append((rank, "its deploy ended without finishing (killed, or its machine went)"))
        if lost or not pending or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    beats = {beat["node"]: beat for beat in nodewatch.read_beats(run_dir, since)}
    if not lost:  # still running, but silent past the bound (the nodes' clocks are taken to agree within it)
        bound = nodewatch.silence_s()
        lost = [(rank, f"silent for over {bound:g} s") for rank in pending
                if rank in beats and beats[rank].get("phase") != "done" and (nodewatch.beat_age(beats[rank]) or 0) > bound]
    said = []
    for rank, how in lost:
        beat, age = beats.get(rank, {}), nodewatch.beat_age(beats.get(rank))
        last = f"; its last heartbeat: step {beat.get('step')} ({beat.get('phase')}), {age:.0f} s ago" if age else ""
        said.append(f"node {rank} ({beat.get('host', '?')}) was lost: {how}{last}")
    return said


def lost_main(args) -> int:
    from trainers.registry import TRAINERS

    if not args.run_dir:
        raise UsageError("--run-dir '' is empty: give the folder")
    if args.trainer not in TRAINERS:  # (it becomes part of a file name)
        raise UsageError(f"--trainer {args.trainer!r} is not one of: {', '.join(TRAINERS)}")
    check_node_flags(args, "lost", "--out '' is empty: give the folder")
    said = lost_nodes(Path(args.out), args.trainer, args.nnodes, args.node_rank, Path(args.run_dir), args.since)
    if said:
        print("; ".join(said))
    return 0


def check_node_flags(args, verb: str, empty_out: str) -> None:
    """--out given, and --nnodes/--node-rank both given with the rank one of the nodes (one line, exit 2)."""
    if not args.out:
        raise UsageError(empty_out)
    if args.nnodes is None or args.node_rank is None:
        raise UsageError(f"nodes {verb} needs --nnodes N (2 or more) and --node-rank R")
    if args.node_rank >= args.nnodes:
        raise UsageError(f"--node-rank {args.node_rank} is not a node of {args.nnodes} (0..{args.nnodes - 1})")


def main(args) -> int:
    check_node_flags(args, "meet", "--out '' is empty: give this node's output folder")
    verdict = meet(Path(args.out), args.nnodes, args.node_rank, args.rdzv_endpoint, args.timeout_s, args.workers)
    hosts = ", ".join(f"{n['rank']}:{n['host']}" for n in verdict["nodes"])
    if verdict["same_workers"]:  # (the deploy then numbers the ranks by node: trainers.runtime.dist.rank_by_deploy_node)
        print(f"ranks: by node ({args.workers} a node, node 0's are ranks 0..{args.workers - 1})")
    if verdict["shared"]:
        print(f"nodes: all {args.nnodes} met ({hosts}); the output folder {args.out} is shared")
        print("disk: shared")
        return 0
    apart = [f"node {n['rank']} ({n['host']})" for n in verdict["nodes"] if not n["sees"]]
    if not verdict["same_workers"]:
        said = ", ".join(f"node {n['rank']} {n.get('workers') or '?'}" for n in verdict["nodes"])
        raise UsageError(f"nodes: {', '.join(apart)} cannot see node 0's output folder, and the nodes run different "
                         f"numbers of workers ({said}): without a shared disk node 0 must hold rank 0, which needs "
                         f"as many workers on every node; give every node the same GPUs, or put --out on storage "
                         f"every node mounts")
    if not args.remote:
        raise UsageError(f"nodes: {', '.join(apart)} cannot see node 0's output folder {args.out}: the nodes share no "
                         "disk; either put --out on storage every node mounts (NFS, a bucket mounted on each node, a "
                         "ReadWriteMany volume), or give --remote URL (s3://bucket/prefix...): node 0's run folder is "
                         "then the job's, mirrored there, and the other nodes keep nothing of it")
    print(f"nodes: all {args.nnodes} met ({hosts}); {', '.join(apart)} cannot see node 0's output folder, so node 0's "
          f"run folder is the job's: every rank's checkpoint state travels to node 0 over the process group, and "
          f"--remote {args.remote} holds it for a fresh node 0")
    print("disk: apart")
    return 0


def add_command(sub) -> None:
    from trainers.registry import TRAINERS
    from trainers.runtime.config import number

    p = sub.add_parser("nodes", help="the nodes of a multi-node deploy meet and check that they share --out")
    verbs = p.add_subparsers(dest="verb", required=True, metavar="verb")
    v = verbs.add_parser("meet", help="wait for every node at the rendezvous endpoint; fail unless --out is shared")
    v.add_argument("--out", required=True, help="this node's output folder")
    v.add_argument("--nnodes", type=number(int, min=2), default=None, help="how many nodes (2 or more)")
    v.add_argument("--node-rank", type=number(int, min=0), default=None, help="this node's rank, 0..N-1")
    v.add_argument("--rdzv-endpoint", required=True, help="HOST:PORT of node 0")
    v.add_argument("--remote", default="", help="the run's remote (--remote): without a shared disk it is the medium")
    v.add_argument("--workers", type=number(int, min=1), default=None,
                   help="this node's training processes: when every node says the same, ranks are numbered by node")
    v.add_argument("--timeout-s", type=number(float, gt=0), default=float(os.environ.get("TRAINERS_NODES_TIMEOUT_S",
                                                                                          600)),
                   help="how long to wait for every node (default: 600, torchrun's rendezvous; "
                        "TRAINERS_NODES_TIMEOUT_S)")
    v.set_defaults(func=main)
    v = verbs.add_parser("lost", help="after a failed multi-node training: name the nodes that were lost (else nothing)")
    v.add_argument("--out", required=True, help="the output folder every node shares")
    v.add_argument("--trainer", default=None, help=f"the deploy's trainer: {', '.join(TRAINERS)}")
    v.add_argument("--nnodes", type=number(int, min=2), default=None, help="how many nodes (2 or more)")
    v.add_argument("--node-rank", type=number(int, min=0), default=None, help="this node's rank, 0..N-1")
    v.add_argument("--run-dir", required=True, help="the run folder (its nodes/ holds every node's last heartbeat)")
    v.add_argument("--since", type=number(float, min=0), default=0.0,
                   help="when this training started (epoch seconds): an earlier run's heartbeats are not its")
    v.set_defaults(func=lost_main)
