"""Probes of a hostile tester, each once a traceback (or a silent wrong answer): bad input is one line
on stderr naming the bad value and what would be accepted, exit code 2, nothing written or lost.

Integers too large for the libraries they reach, options that together build an impossible model,
malformed dates, malformed graph files and model exports for `gnn color`, garbled files under
`status`, non-finite numbers sent to `gpt serve`, `gpt serve` without its extra, and symbolic links
in a run folder being packaged. Every numeric flag's ceiling is walked in test_inputs.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import GPT_TINY, ROOT, TINY_DATA, run_cli, serving_in_thread
from trainers.cli import main

INT_MAX = 2**31 - 1  # trainers.runtime.config.INT_MAX, written out: these probes also ran against the code before it
HUGE = str(10**20)  # past int64 and C long: where NumPy, torch and multiprocessing used to overflow


def run(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return exc.code


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:"), err
    return err[0]


def tree(root: Path) -> dict[str, str | None]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            for p in sorted(root.rglob("*"))}


def refused(argv: list[str], needles: tuple[str, ...], tmp_path: Path, capsys, monkeypatch) -> str:
    """`argv` in tmp_path: exit 2, one line naming every needle, the folder as it was."""
    monkeypatch.chdir(tmp_path)
    before = tree(tmp_path)
    assert run(argv) == 2, argv
    line = one_line(capsys)
    assert all(n in line for n in needles), (needles, line)
    assert tree(tmp_path) == before
    return line


# ---- 1. integers (and floats) too large for the libraries they reach ------------------------------------
PPO_TINY = ["--synthetic-tickers", "6", "--num-stocks", "4", "--synthetic-days", "700", "--window", "8",
            "--episode-days", "30", "--num-envs", "8", "--rollout-steps", "16", "--batch-size", "64", "--hidden", "16",
            "--total-steps", "256", "--seeds", "1", "--no-baseline-mlp", "--device", "cpu"]

TOO_LARGE = [  # (argv, what the line must name); what each did before, in the comment
    (["forecast", "train", *TINY_DATA, "--max-steps", "1", "--seed", str(2**70)], ("--seed", str(2**70))),  # ValueError in torch
    (["forecast", "train", *TINY_DATA, "--max-steps", "1", "--epochs", HUGE], ("--epochs", HUGE)),  # trained
    (["forecast", "train", *TINY_DATA, "--max-steps", "1", "--batch-size", str(10**12)], ("--batch-size",)),  # torch OOM
    (["forecast", "train", "--synthetic-tickers", str(10**15)], ("--synthetic-tickers",)),  # NumPy MemoryError
    (["forecast", "train", *TINY_DATA, "--max-steps", "1", "--lr", "1e308"], ("--lr", "3.40282e+38")),  # Adam overflow
    (["forecast", "train", "--source", "yfinance", "--tickers", "AAPL", "--years", "100000"], ("--years", "100")),
    (["fetch-sp500", "--source", "synthetic", "--synthetic-tickers", str(10**15), "--cache-dir", "c"],
     ("--synthetic-tickers",)),  # NumPy MemoryError
    (["gnn", "data", "--max-nodes", HUGE, "--train", "1", "--val", "1", "--workers", "1"], ("--max-nodes", "20000")),
    (["gnn", "data", "--workers", HUGE, "--train", "1", "--val", "1"], ("--workers",)),  # OverflowError
    (["gnn", "data", "--train", HUGE, "--workers", "1"], ("--train",)),  # MemoryError
    (["gpt", "train", *GPT_TINY, "--batch-tokens", "256", "--max-steps", "1", "--seed", HUGE], ("--seed",)),
    (["gpt", "size", "--depth", "1", "--gpu-memory-gib", "1e308"], ("--gpu-memory-gib",)),  # OverflowError
    (["ppo", "train", *PPO_TINY, "--seed", HUGE], ("--seed",)),  # ValueError in random.seed
    (["ppo", "train", *PPO_TINY, "--num-envs", HUGE], ("--num-envs",)),  # NumPy: maximum size exceeded
    (["ppo", "train", *PPO_TINY, "--random-runs", str(10**12)], ("--random-runs", "65536")),  # NumPy: too large
    (["ppo", "train", *PPO_TINY, "--hidden", HUGE], ("--hidden",)),  # torch: overflow unpacking long long
    (["plan", "--trainer", "gnn", "--hidden", HUGE], ("--hidden",)),  # the same, in the planner
]


@pytest.mark.parametrize("argv,needles", TOO_LARGE, ids=[" ".join(a[:2] + [n[0]]) for a, n in TOO_LARGE])
def test_a_number_too_large_is_one_line(argv, needles, tmp_path, capsys, monkeypatch):
    line = refused(argv, needles, tmp_path, capsys, monkeypatch)
    assert "<" in line  # it says what would be accepted


@pytest.mark.parametrize("argv", [
    ["plan", "--trainer", "gnn", "--hidden", str(INT_MAX)],  # a 2**31-wide layer: torch's CPU allocator refuses
    ["plan", "--trainer", "ppo", "--hidden", str(2**30)],
], ids=["gnn hidden 2**31-1", "ppo hidden 2**30"])
def test_sizes_within_bounds_that_no_memory_holds_are_one_line(argv, tmp_path, capsys, monkeypatch):
    refused(argv, ("not enough memory", "smaller sizes"), tmp_path, capsys, monkeypatch)


# ---- 2. options that build an impossible model -------------------------------------------------------
IMPOSSIBLE = [
    # rotary positions turn pairs of dimensions: an odd head crashed in the rotary tables
    (["gpt", "train", *GPT_TINY, "--batch-tokens", "256", "--max-steps", "1", "--head-dim", "15"],
     ("--head-dim 15", "--positions rotary")),
    # the exact entropy floor solves alphabet ** order contexts: ValueError from the Markov source
    (["gpt", "train", *GPT_TINY, "--batch-tokens", "256", "--max-steps", "1", "--markov-alphabet", "27",
      "--markov-order", "8"], ("--markov-alphabet 27", "--markov-order 8")),
    # refused only once a process group existed (a run without one was told to start torchrun first)
    (["gpt", "train", *GPT_TINY, "--batch-tokens", "256", "--max-steps", "1", "--tie-embeddings", "--parallel",
      "fsdp"], ("--tie-embeddings", "--parallel ddp")),
    # a minibatch larger than the rollout it is cut from was silently the whole rollout
    (["ppo", "train", *PPO_TINY, "--batch-size", "129"], ("--batch-size 129", "--num-envs 8", "--rollout-steps 16")),
    # more micro-batches than samples: most of them empty
    (["ppo", "train", *PPO_TINY, "--grad-accum", "65"], ("--grad-accum 65", "--batch-size 64")),
    # a step of more samples than the training split: minutes of one-sample micro-batches before any failure
    (["forecast", "train", *TINY_DATA, "--grad-accum", "100000"], ("--grad-accum 100000", "--batch-size 256")),
    # each within bounds, 10**11 prices together: NumPy's MemoryError
    (["forecast", "train", "--synthetic-tickers", "2000000", "--synthetic-days", "50000"],
     ("--synthetic-tickers 2000000", "--synthetic-days 50000")),
    (["ppo", "train", *PPO_TINY, "--synthetic-tickers", "2000000", "--synthetic-days", "50000"],
     ("--synthetic-tickers 2000000", "--synthetic-days 50000")),
]


@pytest.mark.parametrize("argv,needles", IMPOSSIBLE, ids=[" ".join(a[:2]) + " " + n[0] for a, n in IMPOSSIBLE])
def test_an_impossible_combination_is_one_line_naming_both_options(argv, needles, tmp_path, capsys, monkeypatch):
    refused(argv, needles, tmp_path, capsys, monkeypatch)


# ---- 3. dates ----------------------------------------------------------------------------------------
DATES = [
    (["--start", "2020-13-45"], ("--start", "2020-13-45")),
    (["--start", "2021-02-29"], ("--start", "2021-02-29")),
    (["--end", "yesterday"], ("--end", "yesterday", "YYYY-MM-DD")),
    (["--start", "2020-1-5"], ("--start", "YYYY-MM-DD")),
    (["--start", "２０２０-01-01"], ("--start",)),  # digits of another script
    (["--start", "2021-01-01", "--end", "2020-01-01"], ("--end 2020-01-01", "--start 2021-01-01")),
    (["--start", "2021-01-01", "--end", "2021-01-01"], ("--end 2021-01-01", "--start 2021-01-01")),
]


LSTM_TINY = ["--synthetic-tickers", "2", "--synthetic-days", "700", "--window", "16", "--hidden", "8", "--epochs", "1",
             "--device", "cpu"]


@pytest.mark.parametrize("trainer", ["forecast", "ppo", "lstm"])
@pytest.mark.parametrize("dates,needles", DATES, ids=[" ".join(d) for d, _ in DATES])
def test_a_malformed_or_reversed_date_is_one_line_even_on_synthetic_data(trainer, dates, needles, tmp_path, capsys,
                                                                           monkeypatch):
    """The synthetic source ignored them (a reversed range trained); a real source met them deep in
    pandas."""
    tiny = {"forecast": [*TINY_DATA, "--max-steps", "1"], "ppo": PPO_TINY, "lstm": LSTM_TINY}[trainer]
    refused([trainer, "train", *tiny, "--source", "synthetic", *dates], needles, tmp_path, capsys, monkeypatch)


def test_good_dates_pass_the_rule():
    from trainers.forecast.config import ForecastConfig

    cfg = ForecastConfig(start="2020-02-29", end="2020-03-01")
    cfg.validate()
    ForecastConfig(start=None, end="2020-03-01").validate()


# ---- 4. graph files and model exports for `gnn color` -----------------------------------------------------
@pytest.fixture(scope="module")
def gnn_run(tmp_path_factory) -> Path:
    """A tiny trained and exported colouring GNN."""
    root = tmp_path_factory.mktemp("gnn")
    run_cli(["gnn", "data", "--out", str(root / "data"), "--train", "8", "--val", "4", "--min-nodes", "10",
             "--max-nodes", "30", "--workers", "1", "--no-progress"], check=True)
    run_cli(["gnn", "train", "--data-dir", str(root / "data"), "--run-dir", str(root / "run"), "--epochs", "1",
             "--hidden", "8", "--layers", "1", "--search-iters", "10", "--search-seconds", "0.1"], check=True)
    run_cli(["gnn", "export", "--run-dir", str(root / "run")], check=True)
    return root / "run"


GRAPHS = [  # (file name, content, what the line must name); each was a traceback or accepted before
    ("bigid.txt", b"0 1\n5 99999999999999999999\n", ("bigid.txt:2", "100,000,000,000,000,000,000 nodes")),  # Overflow
    ("superscript.txt", "1 \u00b9\n".encode(), ("superscript.txt:1",)),  # '¹'.isdigit(): ValueError in int()
    ("fullwidth.col", "p edge 3 1\ne 1 \uff12\n".encode(), ("fullwidth.col:2",)),  # read as node 2
    ("superscript.col", "p edge \u00b3 1\n".encode(), ("superscript.col:1", "problem line")),  # ValueError
    ("selfloop.col", b"p edge 3 2\ne 1 1\ne 1 2\n", ("selfloop.col:2", "node 1 to itself")),  # dropped silently
    ("selfloop.txt", b"0 1\n1 1\n", ("selfloop.txt:2", "node 1 to itself")),  # dropped silently
    ("two_headers.col", b"p edge 3 1\np edge 5 1\ne 1 2\n", ("two_headers.col:2", "second problem line")),
    ("no_nodes.col", b"p edge 0 0\n", ("no_nodes.col", "no nodes")),  # coloured an empty graph
]


@pytest.mark.parametrize("name,content,needles", GRAPHS, ids=[g[0] for g in GRAPHS])
def test_a_malformed_graph_file_is_one_line_naming_the_place(name, content, needles, gnn_run, tmp_path, capsys,
                                                             monkeypatch):
    (tmp_path / name).write_bytes(content)
    refused(["gnn", "color", "--model", str(gnn_run / "model.onnx"), "--graph", str(tmp_path / name),
             "--search-iters", "10"], needles, tmp_path, capsys, monkeypatch)


ALREADY_ONE_LINE = [  # guarded here too: these were one line before (the tester listed them)
    ("truncated.col", b"p edge 3 2\ne 1 2\ne 2", ("truncated.col:3",)),
    ("more_edges.col", b"p edge 3 5\ne 1 2\ne 2 3\n", ("declares 5 edges", "has 2")),
    ("out_of_range.col", b"p edge 3 1\ne 1 7\n", ("node 7 outside 1..3",)),
    ("negative.col", b"p edge 3 1\ne -1 2\n", ("negative.col:2",)),
    ("negative.txt", b"0 1\n-1 2\n", ("negative.txt:2",)),
    ("words.col", b"p edge 3 1\ne a b\n", ("words.col:2",)),
    ("empty.col", b"", ("empty.col", "no 'p edge")),
    ("empty.txt", b"", ("empty.txt", "no edges")),
    ("binary.col", bytes(range(128, 256)) * 8, ("binary.col", "not a text file")),
    ("huge_header.col", b"p edge 99999999999999999999999 0\n", ("huge_header.col", "nodes")),
]


@pytest.mark.parametrize("name,content,needles", ALREADY_ONE_LINE, ids=[g[0] for g in ALREADY_ONE_LINE])
def test_other_malformed_graph_files_stay_one_line(name, content, needles, gnn_run, tmp_path, capsys, monkeypatch):
    (tmp_path / name).write_bytes(content)
    refused(["gnn", "color", "--model", str(gnn_run / "model.onnx"), "--graph", str(tmp_path / name)], needles,
            tmp_path, capsys, monkeypatch)


def test_a_device_is_not_called_missing(gnn_run, tmp_path, capsys, monkeypatch):
    refused(["gnn", "color", "--model", str(gnn_run / "model.onnx"), "--graph", "/dev/null"],
            ("/dev/null", "not a regular file"), tmp_path, capsys, monkeypatch)


def test_a_byte_order_mark_is_not_a_line_type(gnn_run, tmp_path, capsys):
    (tmp_path / "bom.col").write_bytes(b"\xef\xbb\xbfp edge 3 2\ne 1 2\ne 2 3\n")
    assert main(["gnn", "color", "--model", str(gnn_run / "model.onnx"), "--graph", str(tmp_path / "bom.col"),
                 "--search-iters", "10"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["nodes"] == 3 and out["conflicts"] == 0 and out["colors"] == 2


def foreign_onnx(path: Path) -> None:
    """A valid ONNX file of another shape of model (an input named `features`, as the forecaster's)."""
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["batch", 32, 5])
    y = helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 32, 5])
    graph = helper.make_graph([helper.make_node("Identity", ["features"], ["out"])], "foreign", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def model_case(kind: str, gnn_run: Path, folder: Path) -> Path:
    """A folder holding model.onnx + export.json broken in the way `kind` says."""
    folder.mkdir()
    onnx_path, info_path = folder / "model.onnx", folder / "export.json"
    info = json.loads((gnn_run / "export.json").read_text())
    real = (gnn_run / "model.onnx").read_bytes()
    if kind == "garbage onnx":
        onnx_path.write_bytes(os.urandom(3000))
    elif kind == "truncated onnx":
        onnx_path.write_bytes(real[:100])
    elif kind == "another trainer's onnx and export":
        foreign_onnx(onnx_path)
        info = {"input": {"name": "features"}, "sha256": sha(onnx_path), "checkpoint_step": 2, "path": "model.onnx"}
    elif kind == "another trainer's onnx, the gnn's export":
        foreign_onnx(onnx_path)
    elif kind == "export edited to another width":
        onnx_path.write_bytes(real)
        info["random_features"] += 3
    else:
        onnx_path.write_bytes(real)
    if kind == "export not json":
        info_path.write_text("{not json")
    elif kind == "export a list":
        info_path.write_text("[1, 2]")
    elif kind == "export without inputs":
        info_path.write_text('{"inputs": {}}')
    elif kind == "export width a string":
        info["inputs"]["color_mask"][1] = "abc"
        info_path.write_text(json.dumps(info))
    elif kind == "export binary":
        info_path.write_bytes(bytes(range(256)))
    else:
        info_path.write_text(json.dumps(info))
    return onnx_path


MODELS = [("garbage onnx", "SHA-256"), ("truncated onnx", "SHA-256"),
          ("another trainer's onnx and export", "not the record of a colouring GNN"),
          ("another trainer's onnx, the gnn's export", "SHA-256"),
          ("export edited to another width", "takes inputs"), ("export not json", "unreadable"),
          ("export a list", "not the record"), ("export without inputs", "not the record"),
          ("export width a string", "not the record"), ("export binary", "unreadable")]


@pytest.mark.parametrize("kind,needle", MODELS, ids=[k for k, _ in MODELS])
def test_a_broken_or_foreign_model_export_is_one_line(kind, needle, gnn_run, tmp_path, capsys, monkeypatch):
    """Each was an onnxruntime InvalidProtobuf, a JSONDecodeError, a KeyError or a TypeError."""
    model = model_case(kind, gnn_run, tmp_path / "model")
    (tmp_path / "g.txt").write_text("0 1\n1 2\n")
    refused(["gnn", "color", "--model", str(model), "--graph", str(tmp_path / "g.txt")], ("--model", needle),
            tmp_path, capsys, monkeypatch)


def test_a_missing_export_record_stays_one_line(gnn_run, tmp_path, capsys, monkeypatch):
    (tmp_path / "model.onnx").write_bytes((gnn_run / "model.onnx").read_bytes())
    (tmp_path / "g.txt").write_text("0 1\n")
    refused(["gnn", "color", "--model", str(tmp_path / "model.onnx"), "--graph", str(tmp_path / "g.txt")],
            ("export.json",), tmp_path, capsys, monkeypatch)


# ---- 5. `trainers status` on garbled files ---------------------------------------------------------------
def deploy_out(root: Path) -> Path:
    """An output folder as a deploy of the GNN leaves it mid-training (the deploy itself is gone)."""
    out, run_dir = root / "out", root / "out" / "gnn"
    run_dir.mkdir(parents=True)
    (out / "deploy-gnn.state").write_text(
        f"trainer=gnn\npid=4242\nhost=pod\nstarted={int(time.time()) - 60}\nstate=finished\nphase=package\n"
        f"run_dir={run_dir}\nlog={out}/deploy-gnn.log\nusd_per_gpu_hour=2.5\nbudget_usd=10\nmax_hours=1\n"
        f"exit_code=0\nended={int(time.time())}\n")
    (run_dir / "heartbeat.json").write_text(json.dumps({"elapsed_s": 30.0, "step": 7, "total_steps": 10,
                                                        "world_size": 2}))
    rows = [{"kind": "train", "step": 7, "conflict_fraction": 0.25, "graphs_per_s": 100.0, "step_time_s": 0.01},
            {"kind": "val", "step": 7, "conflict_fraction": 0.2}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "results.json").write_text(json.dumps({"training": {"stop_reason": "completed", "cost_usd": 0.04,
                                                                   "elapsed_s_all_attempts": 30.0}}))
    return out


def garble(out: Path, case: str) -> None:
    state, run_dir = out / "deploy-gnn.state", out / "gnn"
    text = state.read_text()
    edits = {
        "state binary junk": lambda: state.write_bytes(bytes(range(256)) * 4),
        "state pid not a number": lambda: state.write_text(text.replace("pid=4242", "pid=\u00b2")),  # '²'.isdigit()
        "state exit_code not a number": lambda: state.write_text(text.replace("exit_code=0", "exit_code=bad")),
        "state started not a number": lambda: state.write_text(text.replace("started=", "started=soon")),
        "state without its state line": lambda: state.write_text(text.replace("state=finished\n", "")),
        "state price not a number": lambda: state.write_text(text.replace("usd_per_gpu_hour=2.5", "usd_per_gpu_hour=x")),
        "state escape sequences": lambda: state.write_text(text.replace("log=", "log=\x1b[2J\x1b[31m")),
        "heartbeat not json": lambda: (run_dir / "heartbeat.json").write_text("{\"elapsed_s\": 3"),
        "heartbeat a list": lambda: (run_dir / "heartbeat.json").write_text("[1, 2]"),
        "heartbeat strings": lambda: (run_dir / "heartbeat.json").write_text(json.dumps(
            {"elapsed_s": "long", "step": "seven", "total_steps": "ten", "world_size": "two"})),
        "heartbeat nested past the parser": lambda: (run_dir / "heartbeat.json").write_text("[" * 100_000),
        "heartbeat overflowing": lambda: (run_dir / "heartbeat.json").write_text(json.dumps(
            {"elapsed_s": 1e308, "step": 1e300, "total_steps": 2e300, "world_size": 1e300})),
        "metrics row not json": lambda: (run_dir / "metrics.jsonl").write_text("{\"kind\": \"tr\n"),
        "metrics row a list": lambda: (run_dir / "metrics.jsonl").write_text("[1, 2]\n"),
        "metrics numbers as strings": lambda: (run_dir / "metrics.jsonl").write_text(json.dumps(
            {"kind": "train", "step": "7.5", "conflict_fraction": "low", "graphs_per_s": "fast",
             "step_time_s": "0.01"}) + "\n"),
        "metrics kind a list": lambda: (run_dir / "metrics.jsonl").write_text(json.dumps({"kind": ["train"]}) + "\n"),
        "results training a list": lambda: (run_dir / "results.json").write_text('{"training": [1]}'),
        "plan time a list": lambda: (out / "plan-gnn.json").write_text('{"time": [1], "money": 3}'),
    }
    edits[case]()


GARBLED = ["state binary junk", "state pid not a number", "state started not a number",
           "state without its state line", "state escape sequences", "heartbeat strings",
           "heartbeat nested past the parser", "heartbeat overflowing", "metrics numbers as strings",
           "results training a list", "plan time a list"]
TOLERATED_BEFORE = ["state exit_code not a number", "state price not a number", "heartbeat not json",
                    "heartbeat a list", "metrics row not json", "metrics row a list", "metrics kind a list"]


def not_json(constant: str):
    raise AssertionError(f"--json wrote {constant}, which is not JSON")


def status(out: Path, capsys, *extra: str) -> str:
    assert main(["status", "--out", str(out), *extra]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return captured.out


@pytest.mark.parametrize("case", GARBLED + TOLERATED_BEFORE)
def test_status_prints_what_it_can_from_garbled_files(case, tmp_path, capsys):
    """The garbled cases were each a traceback (UnicodeDecodeError, ValueError, TypeError,
    AttributeError, RecursionError, OverflowError); the tolerated ones are guarded here too."""
    out = deploy_out(tmp_path)
    garble(out, case)
    text = status(out, capsys)
    assert text.startswith("gnn in ") and "\x1b" not in text
    data = json.loads(status(out, capsys, "--json"), parse_constant=not_json)  # no NaN or Infinity
    assert data["trainer"] == "gnn"
    assert all(v is None or isinstance(v, (int, float)) for k, v in data.items()
               if k in ("pid", "exit_code", "step", "total_steps", "elapsed_s", "spent_usd", "eta_s", "wall_s"))
    if case.startswith("metrics"):  # the other files still tell their part
        assert data["elapsed_s"] == 30.0 and data["step"] == 7
    if case.startswith("heartbeat"):
        assert data["last_train"].get("conflict_fraction") == 0.25


@pytest.mark.parametrize("broken", ["dangling link", "folder"])
def test_status_shows_every_job_and_names_the_broken_state_file(broken, tmp_path, capsys):
    """A dangling state link sorted first (deploy-forecast before deploy-gnn) made `status` without
    --trainer exit 2 on it and hide the healthy job (issue 34). Every job is shown; the broken file is named."""
    out = deploy_out(tmp_path)
    if broken == "dangling link":
        (out / "deploy-forecast.state").symlink_to(tmp_path / "gone.state")
    else:
        (out / "deploy-forecast.state").mkdir()
    text = status(out, capsys)
    assert "forecast in " in text and "BROKEN STATE FILE: deploy-forecast.state" in text and "gnn in " in text
    jobs = json.loads(status(out, capsys, "--json"))
    assert [j["trainer"] for j in jobs] == ["forecast", "gnn"] and jobs[0]["state"] == "broken"
    kit = subprocess.run(["bash", str(ROOT / "deploy_8gpu.sh"), "status", "--out", str(out)], capture_output=True,
                         text=True, env={**os.environ, "TRAINERS_PYTHON": sys.executable}, timeout=120)
    assert kit.returncode == 0 and "BROKEN STATE FILE" in kit.stdout and "gnn in " in kit.stdout, kit.stderr


def test_status_refuses_a_trainer_name_that_is_a_path(tmp_path, capsys, monkeypatch):
    """--trainer becomes part of a file name: `a/../../elsewhere` read any *.state file (and the run
    folder it names) as a deploy's."""
    out = deploy_out(tmp_path)
    (out / "deploy-a").mkdir()
    (tmp_path / "elsewhere.state").write_text(f"state=running\nphase=train\nrun_dir={out / 'gnn'}\n")
    refused(["status", "--out", str(out), "--trainer", "a/../../elsewhere"], ("--trainer", "a/../../elsewhere", "gnn"),
            tmp_path, capsys, monkeypatch)


# ---- 6. `gpt serve`: every bad request a 4xx naming the field; the extra missing --------------------------
@pytest.fixture(scope="module")
def gpt_server(tmp_path_factory):
    """The real app on a tiny trained GPT, served by uvicorn on localhost in a thread."""
    run_dir = tmp_path_factory.mktemp("gpt") / "run"
    run_cli(["gpt", "train", *GPT_TINY, "--batch-tokens", "256", "--max-steps", "2", "--run-dir", str(run_dir)],
            check=True)
    from trainers.gpt.infer import load_for_inference
    from trainers.gpt.serve import build_app

    with serving_in_thread(build_app(load_for_inference(run_dir, "best", "cpu"), 64, 100, timeout_s=30,
                                     max_queue=4)) as url:
        yield url


def post_raw(url: str, body: str) -> tuple[int, dict]:
    """POST a body as written (Python's json.dumps cannot write 1e999 or a bare NaN on purpose)."""
    req = urllib.request.Request(url + "/generate", data=body.encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


BAD_REQUESTS = [  # each was a 500 (FastAPI's 422 echoes the input, and a non-finite one is not JSON) or accepted
    ('{"prompt": "ab", "temperature": 1e999}', "temperature"),
    ('{"prompt": "ab", "temperature": NaN}', "temperature"),
    ('{"prompt": "ab", "temperature": Infinity}', "temperature"),
    ('{"prompt": "ab", "temperature": -Infinity}', "temperature"),
    ('{"prompt": "ab", "stream": true, "temperature": NaN}', "temperature"),
    ('{"prompt": "ab", "top_k": 1e999}', "top_k"),
    ('{"prompt": "ab", "top_k": 100000000000000000000000}', "top_k"),
    ('{"prompt": "ab", "top_k": 2.5}', "top_k"),
    ('{"prompt": "ab", "top_k": true}', "top_k"),
    ('{"prompt": "ab", "max_new_tokens": 1e999}', "max_new_tokens"),
    ('{"prompt": "ab", "max_new_tokens": NaN}', "max_new_tokens"),
    ('{"prompt": "ab", "max_new_tokens": "5"}', "max_new_tokens"),
    ('{"prompt": "ab", "seed": NaN}', "seed"),
    ('{"prompt": "ab", "seed": 1e999}', "seed"),
    ('{"prompt": "ab", "stream": "yes"}', "stream"),
    ('not json', "not JSON"),
]


@pytest.mark.parametrize("body,field", BAD_REQUESTS, ids=[b for b, _ in BAD_REQUESTS])
def test_every_bad_request_is_a_4xx_naming_the_field(body, field, gpt_server):
    status_code, out = post_raw(gpt_server, body)
    assert status_code == 422 and isinstance(out.get("detail"), str) and field in out["detail"], (status_code, out)


NUMERIC_FIELDS = ("max_new_tokens", "temperature", "top_k", "seed")
EDGE_NUMBERS = ("NaN", "Infinity", "-Infinity", "1e999", "1e308", "-1e308", str(2**63), str(-2**63), "-0.0", "-0")


@pytest.mark.parametrize("field", NUMERIC_FIELDS)
def test_every_numeric_field_of_the_server_takes_every_edge_number_without_a_500(field, gpt_server):
    """The probe set's server class, kept: non-finite, huge and negative-zero numbers in every numeric field,
    as JSON text (json.dumps cannot write them). Each is refused with a 422 naming the field, or served
    (200) when it is a value the field takes (temperature -0.0 is 0: greedy); never a 500 or a hang."""
    served = []
    for number in EDGE_NUMBERS:
        body = '{"prompt": "ab", "max_new_tokens": 2, "%s": %s}' % (field, number)
        if field == "max_new_tokens":
            body = '{"prompt": "ab", "max_new_tokens": %s}' % number
        status_code, out = post_raw(gpt_server, body)
        assert status_code in (200, 422), (body, status_code, out)
        if status_code == 422:
            assert field in out["detail"], (body, out)
        else:
            served.append(number)
            assert out["tokens"] == 2, (body, out)
    assert served == {"temperature": ["-0.0", "-0"], "seed": ["-0"]}.get(field, []), (field, served)


def test_good_requests_are_still_served(gpt_server):
    for body in ('{"prompt": "ab", "max_new_tokens": 3, "temperature": 2, "top_k": 3, "seed": 5}',
                 '{"prompt": "ab", "max_new_tokens": 3, "temperature": 0.5}'):
        status_code, out = post_raw(gpt_server, body)
        assert status_code == 200 and out["tokens"] == 3, out
    status_code, out = post_raw(gpt_server, '{"prompt": "ab", "max_new_tokens": 65}')
    assert status_code == 422 and "above the limit 64" in out["detail"]  # unchanged


@pytest.mark.parametrize("hidden", ["fastapi", "uvicorn"])
def test_serve_without_the_extra_says_which_to_install(hidden, tmp_path):
    """Was a ModuleNotFoundError traceback."""
    code = (f"import sys; sys.modules[{hidden!r}] = None\nfrom trainers.cli import main\n"
            f"raise SystemExit(main(['gpt', 'serve', '--run-dir', {str(tmp_path / 'run')!r}]))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("error:") and hidden in lines[0] and ".[serve]" in lines[0] and "trainers[serve]" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# ---- 7. `trainers package` and symbolic links ------------------------------------------------------------
@pytest.fixture
def packable(gnn_run, tmp_path) -> Path:
    """A copy of the exported GNN run that can be changed."""
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(gnn_run, run_dir, symlinks=True)
    return run_dir


def test_a_linked_log_or_picture_is_left_out_with_a_warning(packable, tmp_path, capsys):
    """/etc/passwd was packed as the run's training.log, its checksum in SHA256SUMS."""
    (packable / "training.log").unlink()
    (packable / "training.log").symlink_to("/etc/passwd")
    outside = tmp_path / "outside.png"
    outside.write_bytes(b"\x89PNG not the run's")
    (packable / "loss.png").symlink_to(outside)
    assert main(["package", "--run-dir", str(packable), "--output", str(tmp_path / "run.tar.gz")]) == 0
    captured = capsys.readouterr()
    warnings = captured.err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: left out") for w in warnings), warnings
    assert "training.log -> /etc/passwd" in warnings[0] and "loss.png" in warnings[1]
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        members = tar.getmembers()
        names = {m.name for m in members}
        sums = tar.extractfile("run/SHA256SUMS").read().decode()
    assert all(m.isfile() for m in members)  # no link inside
    assert "run/training.log" not in names and "run/loss.png" not in names and "run/model.onnx" in names
    assert "training.log" not in sums and "loss.png" not in sums


@pytest.mark.parametrize("linked", ["model.onnx", "config.json", "checkpoints"])
def test_a_linked_file_the_tarball_vouches_for_is_refused(linked, packable, tmp_path, capsys, monkeypatch):
    """A model.onnx (or config, or checkpoints folder) that is a link to a copy outside the run passed
    every check (same bytes) and was packed as a link to a path on this machine."""
    import shutil

    outside = tmp_path / f"outside-{linked}"
    shutil.move(packable / linked, outside)
    (packable / linked).symlink_to(outside)
    line = refused(["package", "--run-dir", str(packable), "--output", str(tmp_path / "run.tar.gz")],
                   ("will not pack", linked, "symbolic link"), tmp_path, capsys, monkeypatch)
    assert str(outside) in line


@pytest.mark.parametrize("args,needles", [
    (["--start", "2020-13-45"], ("--start", "2020-13-45")),
    (["--end", "yesterday"], ("--end", "yesterday")),
    (["--years", "100000"], ("--years", "100000")),
    (["--source", "synthetic", "--synthetic-days", "100000"], ("--synthetic-days", "100000")),
    (["--source", "synthetic", "--synthetic-tickers", "100000", "--synthetic-days", "50000"],
     ("--synthetic-tickers 100000 x --synthetic-days 50000",)),
])
def test_fetch_sp500_takes_the_same_rules_for_dates_and_sizes(args, needles, tmp_path, capsys, monkeypatch):
    """--start 2020-13-45 went to the network and came back "no ticker could be fetched"; --years
    100000 overflowed; a synthetic market of any size was generated."""
    refused(["fetch-sp500", "--cache-dir", str(tmp_path / "cache"), *args], needles, tmp_path, capsys, monkeypatch)


def test_lstm_years_too_large_is_one_line(tmp_path, capsys, monkeypatch):
    refused(["lstm", "train", *LSTM_TINY, "--years", "100000"], ("--years", "100000"), tmp_path, capsys, monkeypatch)


def test_status_checks_a_finished_deploy_against_its_tarball_and_names_why_one_failed(tmp_path, capsys):
    """A deploy that died at export once recorded "finished"; status then printed FINISHED with a
    tarball that did not exist. It now checks the file, and shows how a failed deploy ended."""
    out = deploy_out(tmp_path)
    state = out / "deploy-gnn.state"
    state.write_text(state.read_text() + f"tarball={out}/gnn.tar.gz\n")
    text = status(out, capsys)
    assert "INCOMPLETE" in text and "is not there" in text and "FINISHED" not in text
    (out / "gnn.tar.gz").write_bytes(b"tarball")
    assert "FINISHED" in status(out, capsys)
    state.write_text(state.read_text().replace("state=finished", "state=failed").replace("exit_code=0", "exit_code=138")
                     + "reason=killed by SIGUSR1 in phase train\n")
    text = status(out, capsys)
    assert "FAILED in phase" in text and "killed by SIGUSR1 in phase train" in text
    assert json.loads(status(out, capsys, "--json"))["reason"] == "killed by SIGUSR1 in phase train"
