"""Graphs for the coloring trainer: generators, DIMACS files, an on-disk dataset, greedy bounds.

Graphs are undirected, without self-loops, stored as edge lists `edges` [E, 2] with u < v (never
dense n x n matrices). Families: Erdős–Rényi, random geometric, planted k-colorable (chi <= k),
planted flat (equal classes, even degrees: Culberson's flat graphs), Barabási–Albert, n-queens and
Mycielski graphs (chromatic numbers known).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trainers.errors import UsageError
from trainers.runtime.config import check_folder_writable
from trainers.runtime.files import atomic_write_json, fsync_dir, full_disk_named, sha256_file
from trainers.runtime.lock import FolderLock


@dataclass
class Graph:
    name: str
    n: int
    edges: np.ndarray  # [E, 2] int64, u < v, unique
    chromatic: int | None = None  # known (or best known) chromatic number
    upper_k: int | None = None  # planted graphs: chi <= upper_k
    hidden: np.ndarray | None = None  # planted graphs: the coloring the edges were drawn around

    @property
    def n_edges(self) -> int:
        return int(len(self.edges))


def _canonical(n: int, edges: np.ndarray) -> np.ndarray:
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    edges = edges[edges[:, 0] != edges[:, 1]]
    edges = np.sort(edges, axis=1)
    if len(edges):
        edges = np.unique(edges, axis=0)
    if len(edges) and (edges.min() < 0 or edges.max() >= n):
        raise ValueError("edge endpoint out of range")
    return edges


def erdos_renyi(n: int, p: float, rng: np.random.Generator, name: str = "") -> Graph:
    iu = np.triu_indices(n, 1)
    keep = rng.random(len(iu[0])) < p
    return Graph(name or f"er_{n}_{p}", n, _canonical(n, np.stack([iu[0][keep], iu[1][keep]], 1)))


def random_geometric(n: int, radius: float, rng: np.random.Generator, name: str = "") -> Graph:
    pts = rng.random((n, 2))
    iu = np.triu_indices(n, 1)
    d2 = ((pts[iu[0]] - pts[iu[1]]) ** 2).sum(1)
    keep = d2 <= radius * radius
    return Graph(name or f"rgg_{n}_{radius}", n, _canonical(n, np.stack([iu[0][keep], iu[1][keep]], 1)))


def planted(n: int, k: int, p: float, rng: np.random.Generator, name: str = "") -> Graph:
    """Edges only between nodes of different hidden colors, so chi <= k."""
    color = rng.integers(0, k, n)
    iu = np.triu_indices(n, 1)
    keep = (color[iu[0]] != color[iu[1]]) & (rng.random(len(iu[0])) < p)
    return Graph(name or f"planted_{n}_k{k}", n, _canonical(n, np.stack([iu[0][keep], iu[1][keep]], 1)), upper_k=k,
                 hidden=color)


def flat(n: int, k: int, p: float, rng: np.random.Generator, name: str = "") -> Graph:
    """A planted "flat" graph (after Culberson's generator, as DIMACS flat300_28): n nodes in k classes
    of equal size (differing by at most one), edges only between classes, and between every two
    classes the same share p of their pairs, spread so that each node has about the same number of
    neighbours in every other class: degrees say almost nothing about the hidden colouring.
    chi <= k (the classes)."""
    hidden = rng.permutation(np.arange(n) % k)
    members = [np.flatnonzero(hidden == c) for c in range(k)]
    edges = []
    for i in range(k):
        for j in range(i + 1, k):
            A, B = (members[i], members[j]) if len(members[i]) <= len(members[j]) else (members[j], members[i])
            A, B = rng.permutation(A), rng.permutation(B)  # afresh for each pair: no node is always first
            a, b = len(A), len(B)
            m = int(round(p * a * b))
            # pairs taken diagonal by diagonal ((u, (u + s) mod b) for s = s0, s0 + 1, ...): each
            # diagonal joins every node of A once and a nodes of B once, so degrees stay within one
            t = np.arange(m)
            s = (rng.integers(b) + t // a) % b
            edges.append(np.stack([A[t % a], B[(t % a + s) % b]], 1))
    e = np.concatenate(edges) if edges else np.zeros((0, 2), np.int64)
    return Graph(name or f"flat_{n}_{k}", n, _canonical(n, e), upper_k=k, hidden=hidden)


def barabasi_albert(n: int, m: int, rng: np.random.Generator, name: str = "") -> Graph:
    edges, targets, repeated = [], list(range(m)), []
    for v in range(m, n):
        for t in set(targets):
            edges.append((t, v))
        repeated.extend(targets)
        repeated.extend([v] * m)
        targets = list(rng.choice(repeated, size=m, replace=True))
    return Graph(name or f"ba_{n}_{m}", n, _canonical(n, np.array(edges)))


QUEEN_CHI = {5: 5, 6: 7, 7: 7, 8: 9, 9: 10}


def queen(k: int) -> Graph:
    """The k x k queen graph: squares attack along rows, columns and diagonals."""
    r, c = np.divmod(np.arange(k * k), k)
    iu = np.triu_indices(k * k, 1)
    a, b = iu
    attack = (r[a] == r[b]) | (c[a] == c[b]) | (np.abs(r[a] - r[b]) == np.abs(c[a] - c[b]))
    return Graph(f"queen{k}_{k}", k * k, _canonical(k * k, np.stack([a[attack], b[attack]], 1)), QUEEN_CHI.get(k))


def mycielski(k: int) -> Graph:
    """DIMACS mycielK: the Mycielskian applied to K2 (k-1) times; chi = k + 1 (myciel3 = Grötzsch)."""
    n, edges = 2, [(0, 1)]
    for _ in range(k - 1):
        new = [(u, v) for u, v in edges]
        new += [(u, v + n) for u, v in edges] + [(v, u + n) for u, v in edges]
        new += [(i + n, 2 * n) for i in range(n)]
        n, edges = 2 * n + 1, new
    return Graph(f"myciel{k}", n, _canonical(n, np.array(edges)), k + 1)


def benchmark_set(seed: int = 1234) -> list[Graph]:
    """Fixed graphs with known (or planted upper-bound) chromatic numbers."""
    rng = np.random.default_rng(seed)
    graphs = [queen(k) for k in (5, 6, 7, 8)] + [mycielski(k) for k in (4, 5, 6)]
    graphs += [planted(100, 3, 0.1, rng, "planted_100_k3"), planted(200, 5, 0.15, rng, "planted_200_k5"),
               planted(400, 4, 0.05, rng, "planted_400_k4")]
    return graphs


# ---- greedy coloring (the bound on colors offered, and the repair) -------------------------------

def adjacency(n: int, edges: np.ndarray) -> list[np.ndarray]:
    both = np.concatenate([edges, edges[:, ::-1]]) if len(edges) else np.zeros((0, 2), np.int64)
    order = np.argsort(both[:, 0], kind="stable")
    both = both[order]
    splits = np.searchsorted(both[:, 0], np.arange(n + 1))
    return [both[splits[i]:splits[i + 1], 1] for i in range(n)]


def greedy_coloring(n: int, edges: np.ndarray, order: np.ndarray | None = None) -> np.ndarray:
    """Largest-degree-first greedy: the smallest color no colored neighbour has."""
    adj = adjacency(n, edges)
    if order is None:
        order = np.argsort([-len(a) for a in adj], kind="stable")
    color = np.full(n, -1, dtype=np.int64)
    for v in order:
        used = set(color[adj[v]].tolist())
        c = 0
        while c in used:
            c += 1
        color[v] = c
    return color


def greedy_bound(g: Graph) -> int:
    """Colours largest-first greedy needs: an upper bound on the chromatic number."""
    if g.n_edges == 0:
        return 1 if g.n else 0
    return int(greedy_coloring(g.n, g.edges).max() + 1)


def conflicts(edges: np.ndarray, color: np.ndarray) -> int:
    return int((color[edges[:, 0]] == color[edges[:, 1]]).sum()) if len(edges) else 0


# ---- DIMACS .col and edge lists -----------------------------------------------------------------------

MAX_NODES = 5_000_000  # what one graph may have: its arrays are O(nodes) in memory
MAX_NODES_PER_BYTE = 64  # a header may not claim far more nodes than its file could describe
MAX_GRAPH_BYTES = 1 << 30


def _check_size(p: Path | str, n: int, file_bytes: int, what: str) -> None:
    limit = min(MAX_NODES, MAX_NODES_PER_BYTE * max(file_bytes, 16))
    if n > limit:
        raise UsageError(f"{p}: {what} {n:,} nodes, more than this reader accepts for a {file_bytes:,}-byte file "
                         f"(at most {limit:,}: {MAX_NODES:,} in all, {MAX_NODES_PER_BYTE} per byte of file)")


NUMBER_RE = re.compile(r"^[0-9]+$")  # ASCII digits: str.isdigit() also takes '²' and '٣', which int() refuses or reads


def read_graph(path: str | Path) -> Graph:
    """DIMACS `.col` (`p edge N E`, `e u v`, 1-based) or a plain edge list (`u v` per line, 0-based).
    What a file may claim is bounded (MAX_NODES, and nodes per byte of file), so a two-line file
    cannot make us allocate gigabytes. A self-loop is refused: a node adjacent to itself has no
    proper colour, so the file cannot be what the user meant to colour."""
    p = Path(path)
    if p.is_dir():
        raise UsageError(f"graph file {path} is a folder; give a DIMACS .col or edge-list file")
    if not p.exists():
        raise UsageError(f"graph file {path}: no such file")
    if not p.is_file():
        raise UsageError(f"graph file {path} is not a regular file (a device or a pipe); give a DIMACS .col or "
                         f"edge-list file")
    size = p.stat().st_size
    if size > MAX_GRAPH_BYTES:
        raise UsageError(f"{p}: {size:,} bytes is more than this reader accepts ({MAX_GRAPH_BYTES:,})")
    try:
        lines = p.read_bytes().decode("utf-8-sig").splitlines()  # -sig: a byte-order mark is not a line type
    except UnicodeDecodeError as exc:
        raise UsageError(f"{p}: not a text file ({exc.reason} at byte {exc.start})") from None
    is_dimacs = p.suffix == ".col" or any(line.startswith("p ") for line in lines)
    g = _read_dimacs(p, lines) if is_dimacs else _read_edge_list(p, lines)
    if g.n == 0:
        raise UsageError(f"{p}: the graph has no nodes; nothing to colour")
    return g


def _self_loop(p: Path, i: int, line: str, node: int) -> UsageError:
    return UsageError(f"{p}:{i}: {line.strip()!r} joins node {node} to itself; a self-loop has no proper colouring "
                      f"(remove that line)")


def _read_dimacs(p: Path, lines: list[str]) -> Graph:
    n, declared, edges = None, None, []
    for i, line in enumerate(lines, 1):
        parts = line.split()
        if not parts or parts[0] == "c":
            continue
        if parts[0] == "p":
            if n is not None:
                raise UsageError(f"{p}:{i}: a second problem line {line!r}; a DIMACS file has one 'p edge NODES EDGES'")
            if len(parts) != 4 or parts[1] not in ("edge", "col") or not all(map(NUMBER_RE.match, parts[2:])):
                raise UsageError(f"{p}:{i}: bad problem line {line!r}; expected 'p edge NODES EDGES'")
            n, declared = int(parts[2]), int(parts[3])
            _check_size(p, n, p.stat().st_size, "the header declares")
        elif parts[0] == "e":
            if n is None:
                raise UsageError(f"{p}:{i}: edge before the 'p edge NODES EDGES' line")
            if len(parts) != 3 or not all(map(NUMBER_RE.match, parts[1:])):
                raise UsageError(f"{p}:{i}: bad edge line {line!r}; expected 'e U V' with 1-based node numbers")
            u, v = int(parts[1]), int(parts[2])
            if not (1 <= u <= n and 1 <= v <= n):
                raise UsageError(f"{p}:{i}: node {max(u, v) if max(u, v) > n else min(u, v)} outside 1..{n}")
            if u == v:
                raise _self_loop(p, i, line, u)
            edges.append((u - 1, v - 1))
        else:
            raise UsageError(f"{p}:{i}: unknown line type {parts[0]!r}; DIMACS lines start with c, p or e")
    if n is None:
        raise UsageError(f"{p}: no 'p edge NODES EDGES' line; not a DIMACS .col file")
    g = Graph(p.stem, n, _canonical(n, np.array(edges, dtype=np.int64)))
    if declared is not None and declared not in (len(edges), g.n_edges, 2 * g.n_edges):
        raise UsageError(f"{p}: the header declares {declared} edges, the file has {len(edges)}")
    return g


def _read_edge_list(p: Path, lines: list[str]) -> Graph:
    edges = []
    limit = min(MAX_NODES, MAX_NODES_PER_BYTE * max(p.stat().st_size, 16))
    for i, line in enumerate(lines, 1):
        parts = line.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) != 2 or not all(map(NUMBER_RE.match, parts)):
            raise UsageError(f"{p}:{i}: bad edge {line!r}; expected two 0-based node numbers 'U V'")
        u, v = int(parts[0]), int(parts[1])
        if max(u, v) >= limit:  # before NumPy sees it: 10**20 does not fit an int64
            _check_size(f"{p}:{i}", max(u, v) + 1, p.stat().st_size, "the largest node number implies")
        if u == v:
            raise _self_loop(p, i, line, u)
        edges.append((u, v))
    if not edges:
        raise UsageError(f"{p}: no edges")
    arr = np.array(edges, dtype=np.int64)
    n = int(arr.max()) + 1
    return Graph(p.stem, n, _canonical(n, arr))


def write_dimacs(g: Graph, path: str | Path) -> None:
    lines = [f"c {g.name}", f"p edge {g.n} {g.n_edges}"] + [f"e {u + 1} {v + 1}" for u, v in g.edges]
    Path(path).write_text("\n".join(lines) + "\n")


# ---- the on-disk dataset ---------------------------------------------------------------------------------

FAMILIES = ("er", "rgg", "planted", "ba")
DATASET_ARRAYS = ("edges", "offsets", "nodes", "node_offsets", "edge_index", "degree_features", "color_bound")
# a generated dataset's arrays, beside its metadata.json: these names only (any train_*.npy once counted, and a
# user's val_predictions.npy in the folder was replaced with the dataset)
DATASET_FILE = re.compile(rf"(train|val)_({'|'.join(DATASET_ARRAYS)})\.npy")
OS_CLUTTER = {".DS_Store", "Thumbs.db", "desktop.ini"}  # what a file browser leaves in a folder: left beside it


def random_graph(index: int, seed: int, min_nodes: int, max_nodes: int, dense: float = 0.0) -> Graph:
    """Graph `index` of a dataset: family and size drawn from (seed, index), so generation is
    deterministic and can run in any order, in parallel. With `dense` > 0, that share of the graphs
    (drawn from (seed, index) apart, so the sparse ones stay what they were) comes from the dense
    families instead: G(n, p) with p in [0.1, 0.9], and planted flat graphs with 2..40 equal classes
    (at most n / 4) joined at a share in [0.3, 0.9] (the hard colouring instances are of these kinds)."""
    if dense > 0 and np.random.default_rng([seed, index, 1]).random() < dense:
        return _dense_graph(index, seed, min_nodes, max_nodes)
    rng = np.random.default_rng([seed, index])
    family = FAMILIES[index % len(FAMILIES)]
    n = int(rng.integers(min_nodes, max_nodes + 1))
    if family == "er":
        g = erdos_renyi(n, float(rng.choice([2.0, 4.0, 8.0])) / n, rng)
    elif family == "rgg":
        g = random_geometric(n, float(np.sqrt(rng.uniform(4.0, 10.0) / (np.pi * n))), rng)
    elif family == "planted":
        k = int(rng.integers(3, 6))
        g = planted(n, k, float(rng.uniform(3.0, 8.0)) * k / ((k - 1) * n), rng)
    else:
        g = barabasi_albert(n, int(rng.integers(2, 5)), rng)
    g.name = f"{family}_{index}"
    return g


def _dense_graph(index: int, seed: int, min_nodes: int, max_nodes: int) -> Graph:
    rng = np.random.default_rng([seed, index, 2])
    n = int(rng.integers(min_nodes, max_nodes + 1))
    if index % 2 == 0:
        g = erdos_renyi(n, float(rng.uniform(0.1, 0.9)), rng)
        g.name = f"gnp_{index}"
    else:
        k = int(rng.integers(2, max(2, min(40, n // 4)) + 1))  # classes of about 4 nodes or more
        g = flat(n, k, float(rng.uniform(0.3, 0.9)), rng)
        g.name = f"flat_{index}"
    return g


def degree_features(g: Graph) -> np.ndarray:
    """[n, 2] float32: log(1 + degree) and degree / max degree."""
    deg = np.bincount(g.edges.ravel(), minlength=g.n).astype(np.float32) if g.n_edges else np.zeros(g.n, np.float32)
    return np.stack([np.log1p(deg), deg / max(float(deg.max()) if g.n else 0.0, 1.0)], axis=1).astype(np.float32)


def _generate(args) -> dict:
    """One graph and what training needs of it, computed once here rather than at every step:
    degree features, the greedy colour bound, and both directions of every edge."""
    index, seed, lo, hi, dense = args
    g = random_graph(index, seed, lo, hi, dense)
    return {"name": g.name, "n": g.n, "edges": g.edges, "upper_k": g.upper_k, "degree": degree_features(g),
            "bound": greedy_bound(g), "directed": np.concatenate([g.edges, g.edges[:, ::-1]]).T}


def write_dataset(out: Path, n_train: int, n_val: int, seed: int, min_nodes: int, max_nodes: int,
                  workers: int = 1, progress: bool = True, overwrite: bool = False, dense: float = 0.0) -> dict:
    """Generate once into `out/{train,val}_{edges,offsets,nodes}.npy` + metadata.json.

    Written into a temporary folder beside `out` and renamed into place when complete, so a run never
    reads a half-written dataset; one generator per folder at a time (a lock beside it). A folder
    that already holds a dataset is left alone unless `overwrite`; the metadata records a
    fingerprint of the arrays, which a training run checks on resume."""
    import shutil
    import tempfile
    from concurrent.futures import ProcessPoolExecutor

    from tqdm import tqdm

    if min(n_train, n_val) < 1 or not 2 <= min_nodes <= max_nodes:
        raise UsageError(f"need >= 1 train and val graph and 2 <= --min-nodes <= --max-nodes "
                         f"(got {n_train}, {n_val}, {min_nodes}, {max_nodes})")
    shown = out
    try:
        out = Path(out).resolve()  # (a symlink: the dataset is built beside the folder it names, on its volume)
    except (RuntimeError, OSError) as exc:  # a symlink loop (RuntimeError on Python 3.11), a path past its limit
        raise UsageError(f"--out {shown} cannot be resolved to a folder ({exc}); give a folder's path") from None
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {shown} is a file, not a folder")
    check_folder_writable(out, "--out")
    out.parent.mkdir(parents=True, exist_ok=True)
    with FolderLock(out.parent, "--out", lock_name=f".{out.name}.lock", shown=shown):
        others = not_dataset_files(out)
        if others:  # a dataset's folder is its own: a wrong --out (a run, notes) is refused, not written into
            named = ", ".join(map(repr, others[:3])) + (" ..." if len(others) > 3 else "")
            raise UsageError(f"--out {shown} holds files that are not a graph dataset ({named}); give a new or empty "
                             f"folder")
        if (out / "metadata.json").exists() and not overwrite:
            raise UsageError(f"--out {shown} already holds a graph dataset; use it as it is (--data-dir {shown}), "
                             f"pick another --out, or add --overwrite (runs that used it will refuse to resume)")
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
        try:
            with full_disk_named(out):  # a full volume: one line naming it, not numpy's traceback
                meta = {"seed": seed, "min_nodes": min_nodes, "max_nodes": max_nodes, "dense": dense, "splits": {}}
                for split, count, offset in (("train", n_train, 0), ("val", n_val, n_train)):
                    jobs = [(offset + i, seed, min_nodes, max_nodes, dense) for i in range(count)]
                    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _Serial() as pool:
                        results = list(tqdm(pool.map(_generate, jobs, chunksize=16), total=count, disable=not progress,
                                            desc=f"graphs/{split}"))
                    nodes = np.array([r["n"] for r in results], dtype=np.int64)
                    edge_counts = np.array([len(r["edges"]) for r in results], dtype=np.int64)
                    offsets = np.concatenate([[0], np.cumsum(edge_counts)])
                    edges = np.concatenate([r["edges"] for r in results]) if offsets[-1] else np.zeros((0, 2), np.int64)
                    arrays = {"edges": edges.astype(np.int32), "offsets": offsets, "nodes": nodes,
                              "node_offsets": np.concatenate([[0], np.cumsum(nodes)]),
                              "edge_index": np.concatenate([r["directed"] for r in results], axis=1).astype(np.int32),
                              "degree_features": np.concatenate([r["degree"] for r in results]),
                              "color_bound": np.array([r["bound"] for r in results], dtype=np.int32)}
                    assert tuple(arrays) == DATASET_ARRAYS  # (what not_dataset_files leaves to be replaced)
                    for name, arr in arrays.items():
                        np.save(staging / f"{split}_{name}.npy", arr)
                    meta["splits"][split] = {"graphs": count, "nodes": int(nodes.sum()), "edges": int(offsets[-1]),
                                             "names": [r["name"] for r in results],
                                             "upper_k": [r["upper_k"] for r in results]}
                meta["fingerprint"] = dataset_fingerprint(staging)
                atomic_write_json(staging / "metadata.json", meta)
                move_dataset_into(staging, out)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return meta


def move_dataset_into(staging: Path, out: Path) -> None:
    """The whole dataset built in `staging` into the folder `out`, file by file; the folder itself is kept (its
    permissions, group, anything else in it). Its old metadata.json goes first and the new one comes last, so
    until every array is in place the folder is no dataset (GraphSplit refuses it) rather than a mixed one.
    It used to swap the folder whole: a copy's mode (mkdtemp's 0700) and group, and a file put in the folder
    while the graphs were drawn was deleted with the old one."""
    out.mkdir(exist_ok=True)
    (out / "metadata.json").unlink(missing_ok=True)
    fsync_dir(out)
    for name in sorted(p.name for p in staging.iterdir() if p.name != "metadata.json"):
        os.replace(staging / name, out / name)
    os.replace(staging / "metadata.json", out / "metadata.json")
    fsync_dir(out)
    staging.rmdir()


def not_dataset_files(folder: Path) -> list[str]:
    """What `folder` holds besides a graph dataset's files (metadata.json, <split>_<array>.npy), sorted."""
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir()
                  if not (plain_file(p) and (p.name == "metadata.json" or DATASET_FILE.fullmatch(p.name)))
                  and not is_os_clutter(p))


def plain_file(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def is_os_clutter(path: Path) -> bool:
    """A file browser's own file (OS_CLUTTER), left beside the dataset: a plain file only. A folder or a link of
    that name is the user's (a folder named .DS_Store holding notes was deleted with the dataset's old one)."""
    return path.name in OS_CLUTTER and plain_file(path)


def dataset_fingerprint(root: Path) -> str:
    """SHA-256 over the dataset's arrays: two folders with this value hold the same graphs."""
    import hashlib

    h = hashlib.sha256()
    for path in sorted(Path(root).glob("*.npy")):
        h.update(path.name.encode())
        h.update(sha256_file(path).encode())
    return h.hexdigest()


class _Serial:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    @staticmethod
    def map(fn, items, chunksize=1):
        return map(fn, items)


class GraphSplit:
    """A split of the dataset, memory-mapped; graph i is (n_i, edges_i). Per split, written by
    `write_dataset`:

        edges [E, 2] int32 (u < v, local node ids)   offsets [G+1]: graph i's edges are edges[offsets[i]:offsets[i+1]]
        nodes [G]          node_offsets [G+1]          edge_index [2, 2E] int32: both directions, graph-major,
        degree_features [N, 2] float32 (log degree, degree / max degree)    columns 2*offsets[i]..2*offsets[i+1]
        color_bound [G] int32: colours largest-first greedy needs
    """

    ARRAYS = ("edges", "offsets", "nodes", "node_offsets", "edge_index", "degree_features", "color_bound")

    def __init__(self, root: Path, split: str):
        root = Path(root)
        if not (root / "metadata.json").exists():
            raise UsageError(f"--data-dir {root} holds no graph dataset; generate it with `trainers gnn data`")
        try:
            self.meta = json.loads((root / "metadata.json").read_text())
            arrays = {name: np.load(root / f"{split}_{name}.npy", mmap_mode="r") for name in self.ARRAYS}
            self.names = self.meta["splits"][split]["names"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--data-dir {root}: the {split} split is unreadable or was written by an older version "
                             f"({exc}); generate the dataset again with `trainers gnn data --out {root} --overwrite`"
                             ) from None
        self.edges, self.edge_index, self.degree_features = (arrays["edges"], arrays["edge_index"],
                                                             arrays["degree_features"])
        self.offsets, self.nodes = np.asarray(arrays["offsets"]), np.asarray(arrays["nodes"])
        self.node_offsets, self.color_bound = np.asarray(arrays["node_offsets"]), np.asarray(arrays["color_bound"])
        n_graphs, n_nodes, n_edges = len(self.nodes), int(self.nodes.sum()), len(self.edges)
        if not (len(self.names) == len(self.offsets) - 1 == len(self.node_offsets) - 1 == len(self.color_bound)
                == n_graphs and self.offsets[-1] == n_edges and self.node_offsets[-1] == n_nodes
                and self.edge_index.shape == (2, 2 * n_edges) and self.degree_features.shape == (n_nodes, 2)):
            raise UsageError(f"--data-dir {root}: the {split} split's files do not agree with each other; generate "
                             f"it again with `trainers gnn data --out {root} --overwrite`")
        self.fingerprint = self.meta.get("fingerprint")

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> Graph:
        return Graph(self.names[i], int(self.nodes[i]),
                     np.asarray(self.edges[self.offsets[i]:self.offsets[i + 1]], dtype=np.int64))
