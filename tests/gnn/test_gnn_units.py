"""The colouring GNN's pieces: graphs, loss, repair, model, files, bad input."""


import os

import numpy as np
import pytest
import torch

from trainers.cli import main
from trainers.errors import UsageError
from trainers.gnn.batch import make_batch
from trainers.gnn.decode import repair
from trainers.gnn.graphs import (
    Graph,
    GraphSplit,
    barabasi_albert,
    benchmark_set,
    conflicts,
    erdos_renyi,
    mycielski,
    planted,
    queen,
    random_geometric,
    random_graph,
    read_graph,
    write_dataset,
    write_dimacs,
)
from trainers.gnn.model import ColoringGNN, potts_conflicts


def test_planted_graphs_really_are_k_colorable():
    rng = np.random.default_rng(0)
    for k in (3, 4, 5):
        g = planted(150, k, 0.2, rng)
        assert g.n_edges > 0 and conflicts(g.edges, g.hidden) == 0 and g.hidden.max() < k


@pytest.mark.parametrize("k,n,e,chi", [(3, 11, 20, 4), (4, 23, 71, 5), (5, 47, 236, 6), (6, 95, 755, 7)])
def test_mycielski_sizes_match_dimacs(k, n, e, chi):
    g = mycielski(k)
    assert (g.n, g.n_edges, g.chromatic) == (n, e, chi)


@pytest.mark.parametrize("k,chi", [(5, 5), (6, 7), (7, 7), (8, 9)])
def test_queen_graphs(k, chi):
    g = queen(k)
    assert g.n == k * k and g.n_edges == k * (k - 1) * (5 * k - 1) // 3 and g.chromatic == chi


def test_random_families_are_simple_graphs_and_deterministic():
    rng = np.random.default_rng(1)
    for g in (erdos_renyi(80, 0.1, rng), random_geometric(80, 0.2, rng), barabasi_albert(80, 3, rng)):
        assert (g.edges[:, 0] < g.edges[:, 1]).all() and len(np.unique(g.edges, axis=0)) == g.n_edges
    a, b = random_graph(7, 3, 20, 60), random_graph(7, 3, 20, 60)
    assert a.name == b.name and np.array_equal(a.edges, b.edges)
    assert not np.array_equal(random_graph(8, 3, 20, 60).edges, a.edges)


def one_hot(color, k):
    return torch.nn.functional.one_hot(torch.as_tensor(color), k).float()


def test_potts_loss_is_color_permutation_invariant_and_zero_only_for_proper_colorings():
    g = queen(5)
    ei = torch.from_numpy(np.concatenate([g.edges, g.edges[:, ::-1]]).T.copy())
    probs = torch.softmax(torch.randn(g.n, 7), -1)
    perm = torch.randperm(7)
    torch.testing.assert_close(potts_conflicts(probs, ei).sum(), potts_conflicts(probs[:, perm], ei).sum())
    proper = repair(g, np.zeros(g.n, np.int64))
    assert potts_conflicts(one_hot(proper, 8), ei).sum().item() == 0.0
    bad = proper.copy()
    u, v = g.edges[0]
    bad[v] = bad[u]
    n_bad = conflicts(g.edges, bad)
    assert n_bad >= 1 and potts_conflicts(one_hot(bad, 8), ei).sum().item() == 2.0 * n_bad  # both directions


def test_repair_always_returns_a_valid_coloring_and_drops_spare_colors():
    rng = np.random.default_rng(2)
    graphs = [random_graph(i, 5, 10, 120) for i in range(24)] + benchmark_set()
    for g in graphs:
        for start in (np.zeros(g.n, np.int64), rng.integers(0, 4, g.n), rng.integers(0, 30, g.n)):
            c = repair(g, start)
            assert conflicts(g.edges, c) == 0 and c.min() == 0 and len(np.unique(c)) == c.max() + 1
    path = Graph("path", 4, np.array([[0, 1], [1, 2], [2, 3]]))
    assert repair(path, np.array([0, 1, 2, 0])).max() + 1 == 2


def test_model_is_node_permutation_equivariant():
    torch.manual_seed(0)
    g = mycielski(4)
    b = make_batch([g], 8, 4, [0], torch.device("cpu"))
    model = ColoringGNN(6, 16, 2, 8).eval()
    perm = torch.randperm(g.n)
    inv = torch.argsort(perm)
    out = model(b.x, b.edge_index, b.color_mask)
    out_p = model(b.x[perm], inv[b.edge_index], b.color_mask[perm])
    torch.testing.assert_close(out_p, out[perm], rtol=1e-4, atol=1e-5)
    offered = int(b.color_mask[0].sum())
    assert offered == 5 and (out[:, offered:] <= -1e3).all()  # colors beyond the greedy bound are never offered


def test_dimacs_round_trip_and_edge_lists(tmp_path):
    g = queen(5)
    write_dimacs(g, tmp_path / "q.col")
    back = read_graph(tmp_path / "q.col")
    assert back.n == 25 and np.array_equal(back.edges, g.edges)
    (tmp_path / "e.txt").write_text("# a triangle\n0 1\n1 2\n2 0\n")
    t = read_graph(tmp_path / "e.txt")
    assert t.n == 3 and t.n_edges == 3


@pytest.mark.parametrize("text,match", [
    ("p edge 3\ne 1 2\n", "bad problem line"),
    ("e 1 2\np edge 3 1\n", "edge before the 'p edge"),
    ("p edge 3 1\ne 1 4\n", "node 4 outside 1..3"),
    ("p edge 3 1\nx 1 2\n", "unknown line type 'x'"),
    ("c only comments\n", "no 'p edge NODES EDGES' line"),
    ("p edge 3 1\ne 1 two\n", "bad edge line"),
    ("p edge 3 5\ne 1 2\n", "declares 5 edges"),
])
def test_malformed_col_files_are_rejected_with_line_numbers(tmp_path, text, match):
    path = tmp_path / "bad.col"
    path.write_text(text)
    with pytest.raises(UsageError, match=match):
        read_graph(path)


def test_malformed_edge_list_and_missing_file(tmp_path):
    (tmp_path / "e.txt").write_text("0 1\n1 2 3\n")
    with pytest.raises(UsageError, match=r"e.txt:2: bad edge"):
        read_graph(tmp_path / "e.txt")
    with pytest.raises(UsageError, match="no such file"):
        read_graph(tmp_path / "none.col")


def test_dataset_on_disk(tmp_path):
    meta = write_dataset(tmp_path / "d", 12, 4, seed=3, min_nodes=10, max_nodes=40, workers=2, progress=False)
    train = GraphSplit(tmp_path / "d", "train")
    assert len(train) == 12 and meta["splits"]["val"]["graphs"] == 4
    assert isinstance(train.edges, np.memmap)
    g = train[5]
    assert np.array_equal(g.edges, random_graph(5, 3, 10, 40).edges)
    with pytest.raises(UsageError, match="trainers gnn data"):
        GraphSplit(tmp_path / "nothing", "train")


@pytest.mark.parametrize("args,needle", [(["--max-colors", "1"], "--max-colors 1"), (["--epochs", "0"], "--epochs 0"),
                                         (["--data-dir", "/nonexistent"], "holds no graph dataset")])
def test_bad_gnn_input(tmp_path, capsys, args, needle):
    assert main(["gnn", "train", "--run-dir", str(tmp_path / "r"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]


def test_a_dataset_is_never_overwritten_in_place_and_a_failed_generation_leaves_the_old_one(tmp_path, monkeypatch):
    import trainers.gnn.graphs as graphs

    out = tmp_path / "d"
    first = write_dataset(out, 6, 2, seed=1, min_nodes=10, max_nodes=20, workers=1, progress=False)
    with pytest.raises(UsageError, match="already holds a graph dataset"):
        write_dataset(out, 6, 2, seed=2, min_nodes=10, max_nodes=20, workers=1, progress=False)

    def boom(args):
        raise RuntimeError("killed mid-generation")

    monkeypatch.setattr(graphs, "_generate", boom)
    with pytest.raises(RuntimeError):
        write_dataset(out, 6, 2, seed=2, min_nodes=10, max_nodes=20, workers=1, progress=False, overwrite=True)
    assert GraphSplit(out, "train").fingerprint == first["fingerprint"]  # the old one, whole
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".d.lock") == ["d"]  # no half-written folder
    monkeypatch.undo()
    second = write_dataset(out, 6, 2, seed=2, min_nodes=10, max_nodes=20, workers=1, progress=False, overwrite=True)
    assert second["fingerprint"] != first["fingerprint"]
    assert GraphSplit(out, "train").fingerprint == second["fingerprint"]


def test_a_folder_holding_anything_but_a_dataset_is_never_replaced(tmp_path, monkeypatch, capsys):
    """The dataset goes into its --out folder: a folder of notes, or a training run given by mistake, is refused
    (they were deleted, with or without --overwrite, when the dataset replaced its folder whole), and so is a
    user's file that merely looks like an array (any train_*.npy once counted as the dataset's), a folder or a
    link named as a file browser's clutter, and a link named as a dataset file."""
    kept = tmp_path / "notes"
    kept.mkdir()
    (kept / "notes.txt").write_text("important")
    dataset = tmp_path / "d"
    write_dataset(dataset, 6, 2, seed=1, min_nodes=10, max_nodes=20, workers=1, progress=False)
    (dataset / "results.json").write_text("{}")  # a run's file beside the dataset's
    for folder in (kept, dataset):
        for overwrite in ([], ["--overwrite"]):
            assert main(["gnn", "data", "--out", str(folder), "--train", "2", "--val", "1", "--max-nodes", "20",
                         "--no-progress", *overwrite]) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1 and "holds files that are not a graph dataset" in err[0]
    assert (kept / "notes.txt").read_text() == "important" and (dataset / "results.json").is_file()
    (dataset / "results.json").unlink()
    (tmp_path / "elsewhere").write_text("a link's target")
    for name, make in ((".DS_Store", lambda path: path.mkdir()), ("Thumbs.db", lambda path: path.symlink_to(
            tmp_path / "elsewhere")), ("val_predictions.npy", lambda path: path.write_bytes(b"precious")),
            ("train_edges.npy", None)):
        path = dataset / name
        if make is None:  # a dataset file's name on a link: not the dataset's own
            path.unlink()
            path.symlink_to(tmp_path / "elsewhere")
        else:
            make(path)
        assert main(["gnn", "data", "--out", str(dataset), "--train", "2", "--val", "1", "--max-nodes", "20",
                     "--no-progress", "--overwrite"]) == 2, name
        assert f"('{name}')" in capsys.readouterr().err, name
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    assert (tmp_path / "elsewhere").read_text() == "a link's target"
    (tmp_path / "link").symlink_to(dataset)  # through a symlink, with a file browser's own file: both kept
    (dataset / ".DS_Store").write_bytes(b"finder")
    monkeypatch.chdir(dataset)  # (the current folder, once refused: the folder was swapped away under the shell)
    assert main(["gnn", "data", "--out", str(tmp_path / "link"), "--train", "2", "--val", "1", "--max-nodes", "20",
                 "--no-progress", "--overwrite", "--workers", "1"]) == 0
    assert (tmp_path / "link").is_symlink() and GraphSplit(tmp_path / "link", "train").nodes.size == 2
    assert (dataset / ".DS_Store").read_bytes() == b"finder"
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")  # a symlink loop: one line, not a traceback
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    assert main(["gnn", "data", "--out", str(tmp_path / "loop_a"), "--train", "2", "--val", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot be resolved to a folder" in err[0], err


def test_a_dataset_goes_into_its_folder_which_keeps_its_permissions_group_and_late_files(tmp_path, monkeypatch):
    """The dataset used to be built in a temporary folder (mode 0700) and swapped in whole: a folder a team
    shares became private to whoever generated the data (its metadata.json 0600, as every atomic write's), lost
    its group and setgid bit, and a file put in it while the graphs were drawn was deleted with the old folder.
    Now the files move into the folder itself, each with a plain file's permissions."""
    import stat

    import trainers.gnn.graphs as graphs

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o2775)
    first = write_dataset(shared, 2, 1, seed=1, min_nodes=10, max_nodes=20, workers=1, progress=False)
    real_generate = graphs._generate

    def note_meanwhile(args):  # a teammate's file written while the graphs are drawn
        (shared / "notes.txt").write_text("written meanwhile")
        return real_generate(args)

    monkeypatch.setattr(graphs, "_generate", note_meanwhile)
    second = write_dataset(shared, 2, 1, seed=2, min_nodes=10, max_nodes=20, workers=1, progress=False,
                           overwrite=True)
    assert (shared / "notes.txt").read_text() == "written meanwhile"
    assert GraphSplit(shared, "train").fingerprint == second["fingerprint"] != first["fingerprint"]
    assert stat.S_IMODE(shared.stat().st_mode) == 0o2775  # the folder's own mode, setgid included
    umask = os.umask(0o027)
    try:
        write_dataset(tmp_path / "new", 2, 1, seed=1, min_nodes=10, max_nodes=20, workers=1, progress=False)
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o750
    for path in (tmp_path / "new").iterdir():  # metadata.json too (an atomic write: mkstemp's 0600 before)
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path.name
    assert sorted(p.name for p in tmp_path.iterdir()) == [".new.lock", ".shared.lock", "new", "shared"]


def test_a_header_cannot_claim_more_nodes_than_its_file_could_hold(tmp_path):
    import time

    (tmp_path / "huge.col").write_text("p edge 100000000 1\ne 1 2\n")
    t0 = time.perf_counter()
    with pytest.raises(UsageError, match="declares 100,000,000 nodes, more than this reader accepts"):
        read_graph(tmp_path / "huge.col")
    assert time.perf_counter() - t0 < 1.0
    (tmp_path / "huge.txt").write_text("0 1\n1 90000000\n")
    with pytest.raises(UsageError, match="largest node number implies"):
        read_graph(tmp_path / "huge.txt")
    (tmp_path / "bin.col").write_bytes(b"p edge 3 1\n\xff\xfe\n")
    with pytest.raises(UsageError, match="not a text file"):
        read_graph(tmp_path / "bin.col")
    with pytest.raises(UsageError, match="is a folder"):
        read_graph(tmp_path)
