"""One rule for every path: each path option of each command, given a file where a folder belongs, a
folder where a file belongs, or a place nobody can write, fails in one line naming it (exit 1 or 2),
never with a traceback, and writes nothing."""

from __future__ import annotations

import pytest

from conftest import TINY_DATA
from trainers.cli import main

UNWRITABLE = "/proc/trainers-cannot-write-here/x"  # not even root can create files under /proc


@pytest.fixture
def places(tmp_path):
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not what you think\n")
    a_dir = tmp_path / "a_dir"
    a_dir.mkdir()
    return {"file": str(a_file), "dir": str(a_dir), "unwritable": UNWRITABLE}


# command words, path flag, the kind the flag expects, other arguments the command needs
CASES = [
    (["forecast", "train"], "--run-dir", "folder", TINY_DATA + ["--epochs", "1"]),
    (["forecast", "train"], "--tickers-file", "file", ["--source", "cache"]),
    (["forecast", "train"], "--source", "file:", []),
    (["forecast", "evaluate"], "--run-dir", "run", []),
    (["forecast", "export"], "--run-dir", "run", []),
    (["gnn", "data"], "--out", "folder", ["--train", "2", "--val", "1", "--max-nodes", "12", "--min-nodes", "10",
                                          "--workers", "1", "--no-progress"]),
    (["gnn", "train"], "--data-dir", "dataset", []),
    (["gnn", "evaluate"], "--run-dir", "run", []),
    (["gnn", "export"], "--run-dir", "run", []),
    (["gnn", "color"], "--model", "file", ["--graph", "x.col"]),
    (["gpt", "train"], "--run-dir", "folder", ["--max-steps", "1"]),
    (["gpt", "train"], "--data", "dataset", ["--max-steps", "1", "--run-dir", "r"]),
    (["gpt", "data"], "--data", "dataset", []),
    (["gpt", "evaluate"], "--run-dir", "run", []),
    (["gpt", "sample"], "--run-dir", "run", []),
    (["gpt", "serve"], "--run-dir", "run", []),
    (["gpt", "export"], "--run-dir", "run", []),
    (["fetch-sp500"], "--cache-dir", "folder", ["--source", "synthetic", "--synthetic-tickers", "2",
                                                "--synthetic-days", "300", "--min-history-days", "10",
                                                "--no-progress"]),
    (["fetch-sp500"], "--tickers-file", "file", []),
    (["fetch-sp500"], "--source", "file:", ["--cache-dir", "c"]),
    (["refresh-universe"], "--output", "file", ["--url", "http://127.0.0.1:9/nothing"]),
    (["package"], "--run-dir", "run", []),
    (["package"], "--output", "file", ["--run-dir", "r"]),
    (["preflight"], "--json", "file", ["--no-nccl"]),
]


def tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.mark.parametrize("words,flag,kind,extra", CASES, ids=[f"{' '.join(w)} {f}" for w, f, _, _ in CASES])
def test_a_bad_place_is_one_line_naming_it(words, flag, kind, extra, places, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    if words == ["package"] and flag == "--output":
        (tmp_path / "r").mkdir()
    for what, value in places.items():
        if kind == "folder" and what == "dir":
            continue  # a folder is what it wants
        if kind == "file" and what == "file":
            continue  # a readable file is right for an input, and an output may replace a file
        before = tree(tmp_path)
        arg = f"file:{value}" if kind == "file:" else value
        rc = main([*words, flag, arg, *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc in (1, 2), (words, flag, what, rc, err)
        assert err and err[-1].startswith("error:"), (words, flag, what, err)
        assert value in err[-1] or flag in err[-1], (flag, err[-1])
        assert tree(tmp_path) == before, (words, flag, what, tree(tmp_path) - before)
