"""The nodes' heartbeat through a real c10d TCPStore on loopback: a node that stops beating is named within the
bound, a node that said it was done is not, node 0's store gone reads as node 0's silence, and each beat reaches the
run folder for `status`."""

import datetime
import json
import threading
import time

import pytest
from torch.distributed import TCPStore

from trainers.errors import UsageError
from trainers.runtime import nodewatch
from trainers.runtime.nodewatch import NodeWatch, read_beats


@pytest.fixture
def store():
    master = TCPStore("127.0.0.1", 0, is_master=True, timeout=datetime.timedelta(seconds=5), wait_for_workers=False)
    yield master


def client(master, timeout_s=2.0):
    return TCPStore("127.0.0.1", master.port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


def test_a_node_that_stops_beating_is_named_once_its_silence_passes_the_bound(store):
    head = NodeWatch(store, nnodes=2, rank=0, silence=60)
    other = NodeWatch(client(store), nnodes=2, rank=1, silence=60)
    other.at(340)
    for t in (0.0, 5.0, 10.0):  # both beat: nobody is lost
        assert other.beat_once(t) is None and head.beat_once(t) is None
    assert head.beat_once(69.0) is None  # node 1's beat last changed at 10 s: 59 s of silence is within the bound
    lost = head.beat_once(71.0)
    assert lost is not None and lost.startswith("node 1 (") and "no heartbeat for 61 s" in lost
    assert "step 340, train" in lost and "rerun the same command on every node" in lost


def test_a_node_that_never_beats_is_lost_a_bound_after_the_watch_started(store):
    head = NodeWatch(store, nnodes=3, rank=0, silence=30)
    started = head._started
    assert head.beat_once(started + 29) is None
    lost = head.beat_once(started + 31)
    assert lost.startswith("node 1 (?)") and "it never beat" in lost


def test_a_node_that_said_it_was_done_is_not_lost_while_the_others_finish(store):
    head = NodeWatch(store, nnodes=2, rank=0, silence=1, beat_s=0.05)
    other = NodeWatch(client(store), nnodes=2, rank=1, silence=1, beat_s=0.05)
    other.beat_once(time.monotonic())
    other.stop()  # its last beat says done (the thread never ran)
    assert head.beat_once(time.monotonic()) is None
    assert head.beat_once(time.monotonic() + 100) is None


def test_node_0s_store_gone_reads_as_node_0_gone_silent(store):
    watch = NodeWatch(client(store, timeout_s=0.5), nnodes=2, rank=1, silence=10)
    head = NodeWatch(store, nnodes=2, rank=0, silence=10)
    head.beat_once(0.0)
    assert watch.beat_once(0.0) is None
    watch.store = client_of_a_closed_port()
    assert watch.beat_once(5.0) is None  # a store that cannot be reached is not, by itself, a lost node
    lost = watch.beat_once(11.0)
    assert lost is not None and lost.startswith("node 0 (") and "it holds the job's store" in lost


def client_of_a_closed_port():
    class Unreachable:  # what a TCPStore client raises once its server is gone
        def set(self, *a):
            raise RuntimeError("Connection reset by peer")

        check = get = set
    return Unreachable()


def test_the_watch_thread_ends_the_node_within_the_bound(store):
    said = []
    ended = threading.Event()
    watch = NodeWatch(store, nnodes=2, rank=0, silence=0.5, beat_s=0.05,
                      on_lost=lambda message: (said.append(message), ended.set()))
    started = time.monotonic()
    watch.start()
    assert ended.wait(5), "the watch did not end the node"
    assert 0.5 <= time.monotonic() - started < 2.0 and said[0].startswith("node 1 ")
    watch.stop()


def test_each_beat_reaches_the_run_folder_and_status_reads_them_back(store, tmp_path):
    watch = NodeWatch(store, nnodes=2, rank=0, silence=60, beat_s=0.05)
    watch.folder = tmp_path / "nodes"
    watch.at(12, "train")
    watch.start()
    deadline = time.monotonic() + 10  # (written by a thread of its own, behind the beats)
    while not (tmp_path / "nodes" / "node0.json").is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    (tmp_path / "nodes" / "node1.json").write_bytes(b"\x00garbage")  # a hand edit or a torn copy: left out
    (tmp_path / "nodes" / "node2.json").write_text(json.dumps({"node": "two"}))
    (tmp_path / "nodes" / "node3.json").write_text(json.dumps({"node": 3, "time": time.time() - 3600}))
    beats = read_beats(tmp_path)
    assert [b["node"] for b in beats] == [0, 3] and (beats[0]["step"], beats[0]["phase"]) == (12, "done")
    assert [b["node"] for b in read_beats(tmp_path, since=time.time() - 60)] == [0]  # an earlier run's: not this one's


def test_a_heartbeat_file_that_cannot_be_written_stops_the_files_not_training(store, tmp_path, capsys):
    (tmp_path / "nodes").write_text("a file where the folder should be")
    watch = NodeWatch(store, nnodes=2, rank=0, silence=60)
    watch.folder = tmp_path / "nodes"
    assert watch.beat_once(0.0) is None
    watch.write_file(watch._latest)
    assert watch.folder is None and "cannot write this node's heartbeat file" in capsys.readouterr().err


def test_a_lost_node_is_written_down_for_this_nodes_deploy(store, tmp_path):
    said = []
    watch = NodeWatch(store, nnodes=2, rank=0, silence=0.3, beat_s=0.05, on_lost=said.append)
    watch.folder = tmp_path / "nodes"
    started = time.time()
    watch.start()
    deadline = time.monotonic() + 5
    while not said and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert said and nodewatch.verdict(tmp_path, 0, since=started) == said[0]
    assert nodewatch.verdict(tmp_path, 0, since=time.time() + 60) is None  # written before that training began
    assert nodewatch.verdict(tmp_path, 1, since=0) is None


def test_a_store_that_fails_once_does_not_end_the_watch_and_says_so_once(store, capsys):
    watch = NodeWatch(client(store), nnodes=2, rank=0, silence=10)  # (on node 0 too: it never raises)
    healthy = watch.store
    watch.store = client_of_a_closed_port()
    assert watch.beat_once(0.0) is None and watch.beat_once(1.0) is None
    assert capsys.readouterr().err.count("the job's store did not answer") == 1
    watch.store = healthy
    assert watch.beat_once(2.0) is None and not watch._store_failed


def test_a_store_closed_after_node_0_said_done_ends_the_watch_without_a_verdict(store):
    head = NodeWatch(store, nnodes=3, rank=0, silence=10)
    watch = NodeWatch(client(store), nnodes=3, rank=2, silence=10)
    head.beat_once(0.0)
    head.stop()  # node 0 done; its agent closes the store once its exit barrier ends
    assert watch.beat_once(0.0) is None
    watch.store = client_of_a_closed_port()
    assert watch.beat_once(100.0) is None and watch._stop.is_set()  # node 1's beats unread: nothing to judge by


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "soon", "9.5"])
def test_a_silence_bound_under_two_beats_or_not_a_number_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("TRAINERS_NODE_SILENCE_S", value)
    with pytest.raises(UsageError, match=f"TRAINERS_NODE_SILENCE_S='{value}' must be a number of seconds >= 10"):
        nodewatch.silence_s()
    monkeypatch.setenv("TRAINERS_NODE_SILENCE_S", "10")
    assert nodewatch.silence_s() == 10


def test_one_node_or_a_process_outside_torchrun_starts_no_watch(monkeypatch):
    monkeypatch.setenv("GROUP_WORLD_SIZE", "1")
    assert nodewatch.start_if_several_nodes() is None
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_USE_AGENT_STORE", raising=False)  # not under torchrun's agent
    assert nodewatch.start_if_several_nodes() is None


def test_a_worker_that_only_watches_sends_no_beat_but_still_sees_a_lost_node(store, tmp_path):
    watcher = NodeWatch(store, nnodes=2, rank=0, silence=10, beats=False)
    watcher.run_dir = tmp_path
    assert watcher.beat_once(0.0) is None
    assert not store.check(["trainers/nodes/0"]) and not (tmp_path / "nodes").exists()
    assert watcher.beat_once(watcher._started + 11).startswith("node 1 ")
    watcher.stop()
    assert not store.check(["trainers/nodes/0"])  # (its "done" is not its to say either)


def test_the_watch_under_torchrun_beats_from_the_first_worker_of_each_node(store, monkeypatch, tmp_path):
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("TRAINERS_NODE_RANK", "1")
    monkeypatch.setenv("TRAINERS_NODES_DIR", str(tmp_path / "nodes"))  # the deploy's: <run>/nodes
    watch = nodewatch.start_if_several_nodes()
    try:
        assert watch is not None and watch.rank == 1 and watch.beats and watch.folder == tmp_path / "nodes"
        nodewatch.at(7)
        deadline = time.monotonic() + 10
        while not store.check(["trainers/nodes/1"]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert json.loads(store.get("trainers/nodes/1"))["node"] == 1
    finally:
        nodewatch.stop()
    assert json.loads(store.get("trainers/nodes/1"))["phase"] == "done"
    assert [(b["node"], b["phase"]) for b in read_beats(tmp_path)] == [(1, "done")]  # its last beat, in the folder
