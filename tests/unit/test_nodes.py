"""trainers nodes meet: the nodes of a deploy meet at the rendezvous endpoint before any data or training, and find
out whether they share --out. Each "node" here is a thread with its own folder (no shared disk) or one folder."""

import threading

import pytest

from conftest import free_port
from trainers.errors import UsageError
from trainers.ops.nodes import MARKER_PREFIX, meet


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
