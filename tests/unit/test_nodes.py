"""trainers nodes meet: the nodes of a deploy meet at the rendezvous endpoint before any data or training, and find
out whether they share --out. Each "node" here is a thread with its own folder (no shared disk) or one folder."""

import fcntl
import json
import os
import threading
import time

import pytest

from conftest import free_port
from trainers.errors import UsageError
from trainers.ops.nodes import MARKER_PREFIX, lost_nodes, meet
from trainers.ops.status import format_status, job_status


def meet_all(folders, ranks=None, nnodes=None, timeout_s=20.0):
    port, results = free_port(), {}
    ranks = ranks if ranks is not None else list(range(len(folders)))

    def node(i):
        try:
            results[i] = meet(folders[i], nnodes or len(folders), ranks[i], f"127.0.0.1:{port}", timeout_s)
        except UsageError as err:
            results[i] = err

    threads = [threading.Thread(target=node, args=(i,)) for i in range(len(folders))]
    threads[0].start()
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout=timeout_s * 3)
    return [results[i] for i in range(len(folders))]


def test_nodes_on_one_folder_meet_and_find_it_shared(tmp_path):
    verdicts = meet_all([tmp_path] * 3)
    assert all(v["shared"] for v in verdicts) and [n["rank"] for n in verdicts[0]["nodes"]] == [0, 1, 2]
    assert verdicts[0] == verdicts[2]  # one verdict, node 0's, for every node
    assert not list(tmp_path.glob(f"{MARKER_PREFIX}*"))  # node 0 took its marker away


def test_nodes_on_their_own_disks_all_learn_that_they_share_none(tmp_path):
    folders = [tmp_path / "node0", tmp_path / "node1", tmp_path / "node2"]
    verdicts = meet_all(folders)
    assert [v["shared"] for v in verdicts] == [False] * 3
    assert [n["sees"] for n in verdicts[1]["nodes"]] == [True, False, False]


def test_a_node_that_never_comes_ends_every_node_that_did(tmp_path):
    verdicts = meet_all([tmp_path] * 2, nnodes=3, timeout_s=3.0)
    assert isinstance(verdicts[0], UsageError) and "node(s) 2 of 3 did not come within 3 s" in str(verdicts[0])
    assert isinstance(verdicts[1], UsageError) and "did not come within 3 s" in str(verdicts[1])


def test_two_nodes_claiming_one_rank_are_refused_on_every_node(tmp_path):
    verdicts = meet_all([tmp_path] * 3, ranks=[0, 1, 1], timeout_s=10.0)
    assert all(isinstance(v, UsageError) and "two nodes claim rank 1" in str(v) for v in verdicts), verdicts


def test_nodes_that_disagree_on_the_count_are_refused(tmp_path):
    port, results = free_port(), {}

    def node(rank, nnodes):
        try:
            results[rank] = meet(tmp_path, nnodes, rank, f"127.0.0.1:{port}", 10.0)
        except UsageError as err:
            results[rank] = err

    threads = [threading.Thread(target=node, args=args) for args in ((0, 2), (1, 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert "disagree on the node count: node 0" in str(results[0]) and "node 1" in str(results[1])


def test_a_node_without_node_0_says_so_in_one_line(tmp_path):
    with pytest.raises(UsageError, match=r"could not reach node 0 at 127.0.0.1:\d+ within 2 s"):
        meet(tmp_path, 2, 1, f"127.0.0.1:{free_port()}", 2.0)


# --- trainers nodes lost, and status's line per node: from the shared folder's state files, locks and heartbeats


def node_deploy(out, rank, state, locked=False, trainer="forecast"):
    """A node's deploy files as deploy_8gpu.sh leaves them; `locked`: a live deploy holds its lock (the fd)."""
    tag = "" if rank == 0 else f".node{rank}"
    (out / f"deploy-{trainer}{tag}.state").write_text(f"state={state}\nphase=train\nhost=node{rank}\n")
    lock = out / f".deploy-{trainer}{tag}.lock"
    lock.write_text("pid 1\n")
    if locked:
        fd = os.open(lock, os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        return fd


def beat(run_dir, rank, age_s, step=40):
    (run_dir / "nodes").mkdir(parents=True, exist_ok=True)
    (run_dir / "nodes" / f"node{rank}.json").write_text(json.dumps(
        {"node": rank, "host": f"node{rank}", "step": step, "phase": "train", "time": time.time() - age_s}))


def test_a_node_killed_mid_training_is_named_lost_with_its_last_heartbeat(tmp_path):
    run_dir = tmp_path / "forecast"
    node_deploy(tmp_path, 0, "running", locked=True)
    node_deploy(tmp_path, 1, "running")  # its state never said how it ended, and nobody holds its lock
    beat(run_dir, 1, 12, step=140)
    said = lost_nodes(tmp_path, "forecast", 2, 0, run_dir, settle_s=0.2)
    assert len(said) == 1 and said[0].startswith("node 1 (node1) was lost: its deploy ended without finishing")
    assert "its last heartbeat: step 140 (train), 12 s ago" in said[0]


def test_a_node_that_failed_its_own_way_or_still_beats_is_not_lost(tmp_path):
    run_dir = tmp_path / "forecast"
    node_deploy(tmp_path, 0, "failed")  # (node 0's worker raised: its deploy recorded it)
    assert lost_nodes(tmp_path, "forecast", 2, 1, run_dir, settle_s=0.2) == []
    fd = node_deploy(tmp_path, 0, "running", locked=True)
    beat(run_dir, 0, 3)
    assert lost_nodes(tmp_path, "forecast", 2, 1, run_dir, settle_s=0.2) == []  # alive and beating
    beat(run_dir, 0, 500)  # alive, its lock held, but silent past the bound: frozen, or cut off
    said = lost_nodes(tmp_path, "forecast", 2, 1, run_dir, settle_s=0.2)
    assert said and said[0].startswith("node 0 (node0) was lost: silent for over 60 s")
    os.close(fd)


def test_a_heartbeat_file_holding_garbage_does_not_stop_the_verdict(tmp_path):
    run_dir = tmp_path / "forecast"
    node_deploy(tmp_path, 1, "running")
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "nodes" / "node1.json").write_text('{"node": 1, "time": "yesterday", "host": "node1"}')
    said = lost_nodes(tmp_path, "forecast", 2, 0, run_dir, settle_s=0.2)
    assert said == ["node 1 (node1) was lost: its deploy ended without finishing (killed, or its machine went)"]


def test_status_on_any_node_shows_every_nodes_state_phase_and_heartbeat(tmp_path):
    run_dir = tmp_path / "forecast"
    fd = node_deploy(tmp_path, 0, "running", locked=True)
    node_deploy(tmp_path, 1, "running")
    beat(run_dir, 0, 2, step=90)
    beat(run_dir, 1, 40, step=70)
    text = format_status(job_status(tmp_path, "forecast"))
    assert "node 0 (node0): running in phase train; heartbeat 2 s ago at step 90 (train)" in text
    assert "node 1 (node1): lost in phase train; heartbeat 40 s ago at step 70 (train)" in text
    os.close(fd)
    (tmp_path / "deploy-forecast.state").write_text("state=running\nphase=train\nhost=node0\nnnodes=2\n")
    node_deploy(tmp_path, 2, "running")  # an earlier job's third node: not one of this job's two
    text = format_status(job_status(tmp_path, "forecast"))
    assert "node 1 (node1): lost" in text and "node 2 (" not in text
    single = tmp_path / "one"  # one node: no node lines
    single.mkdir()
    node_deploy(single, 0, "finished")
    assert "node 0 (" not in format_status(job_status(single, "forecast"))


def test_an_earlier_runs_or_a_finished_nodes_old_heartbeat_never_makes_a_live_node_lost(tmp_path):
    run_dir = tmp_path / "forecast"
    fd = node_deploy(tmp_path, 1, "running", locked=True)  # alive: waiting for node 0, which failed its own way
    beat(run_dir, 1, 3600)  # the killed run's, before this training began
    assert lost_nodes(tmp_path, "forecast", 2, 0, run_dir, since=time.time() - 60, settle_s=0.2) == []
    (run_dir / "nodes" / "node1.json").write_text(json.dumps(
        {"node": 1, "host": "node1", "step": 9, "phase": "done", "time": time.time() - 120}))
    assert lost_nodes(tmp_path, "forecast", 2, 0, run_dir, since=time.time() - 600, settle_s=0.2) == []
    os.close(fd)


def test_the_node_this_nodes_watch_named_is_the_verdict_at_once(tmp_path):
    run_dir = tmp_path / "forecast"
    fd = node_deploy(tmp_path, 1, "running", locked=True)  # frozen, or cut off: its lock and files look alive
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "nodes" / "verdict-node0.txt").write_text("node 1 (node1) went silent: no heartbeat for 60 s\n")
    started = time.monotonic()
    said = lost_nodes(tmp_path, "forecast", 2, 0, run_dir, since=time.time() - 60, settle_s=30)
    assert said == ["node 1 (node1) went silent: no heartbeat for 60 s"] and time.monotonic() - started < 5
    os.close(fd)


def meet_workers(folders, workers, remote="s3://runs/job"):
    """`trainers nodes meet` (its main, as the deploy runs it) on every node at once, each saying its worker count."""
    from types import SimpleNamespace

    from trainers.ops.nodes import main

    port, said = free_port(), {}

    def node(rank):
        args = SimpleNamespace(out=str(folders[rank]), nnodes=len(folders), node_rank=rank, timeout_s=20.0,
                               rdzv_endpoint=f"127.0.0.1:{port}", remote=remote, workers=workers[rank])
        try:
            said[rank] = main(args)
        except UsageError as err:
            said[rank] = err

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(len(folders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return [said[rank] for rank in range(len(folders))]


def test_nodes_of_equal_worker_counts_are_numbered_by_node_and_apart_ones_of_unequal_counts_are_refused(tmp_path,
                                                                                                        capsys):
    assert meet_workers([tmp_path] * 2, [4, 4]) == [0, 0]
    assert capsys.readouterr().out.count("ranks: by node (4 a node, node 0's are ranks 0..3)") == 2
    assert meet_workers([tmp_path] * 2, [4, 2]) == [0, 0]  # a shared disk: torchrun's numbering is enough
    assert "ranks: by node" not in capsys.readouterr().out
    apart = [tmp_path / "node0", tmp_path / "node1"]
    assert meet_workers(apart, [8, 8]) == [0, 0] and "disk: apart" in capsys.readouterr().out
    for said in meet_workers(apart, [8, 4]):
        assert isinstance(said, UsageError)
        assert "different numbers of workers (node 0 8, node 1 4)" in str(said) and "same GPUs" in str(said)
