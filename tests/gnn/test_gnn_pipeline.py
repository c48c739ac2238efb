"""The colouring GNN end to end: 2 ranks -> results table -> `gnn evaluate` -> ONNX -> `gnn color`
(without torch, and fine-tuned per instance with it) -> tarball."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import run_cli, run_torchrun
from trainers.cli import main
from trainers.gnn.graphs import GraphSplit, conflicts, mycielski, queen, write_dimacs
from trainers.ops.commands import load_workload

BLOCK_TORCH = "import sys; sys.modules['torch'] = None\nfrom trainers.cli import main\n"


def color_without_torch(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + f"raise SystemExit(main({['gnn', 'color', *args]!r}))"],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_two_rank_training_to_onnx_table_and_color_cli(tmp_path, capsys):
    data, run = tmp_path / "data", tmp_path / "run"
    run_cli(["gnn", "data", "--out", str(data), "--train", "48", "--val", "8", "--max-nodes", "60", "--no-progress"],
            check=True)
    run_torchrun(["gnn", "train", "--data-dir", str(data), "--run-dir", str(run), "--epochs", "3", "--nodes-per-batch",
                  "250", "--hidden", "32", "--layers", "2", "--search-iters", "300"])
    r = json.loads((run / "results.json").read_text())
    t = r["training"]
    assert t["world_size"] == 2 and t["steps"] == 3 * 4 and r["trainer"] == "gnn"  # 1961 nodes / (2 x 250)
    assert t["ddp"] == {"gradient_as_bucket_view": True, "static_graph": True, "sync_buffers_each_forward": False}
    assert t["graphs_per_s_per_device"] > 0 and t["nodes_per_s_per_device"] > t["graphs_per_s_per_device"]
    # the plan's FLOPs a node for these options, per graph: a GPU run's MFU (None on a CPU) calibrates `trainers plan`
    per_node = load_workload("gnn", ["--data-dir", str(data), "--hidden", "32", "--layers", "2"]).flops_per_item
    assert r["model"]["flops_per_graph"] == pytest.approx(per_node * GraphSplit(data, "train").nodes.mean(), rel=1e-12)
    assert per_node > 0 and t["mfu"] is None
    rows = r["evaluation"]["benchmark"]
    assert {row["name"] for row in rows} >= {"queen5_5", "queen8_8", "myciel4", "myciel6"}
    assert all(row["conflicts"] == 0 for row in rows) and r["evaluation"]["val"]["all_valid"]
    assert all({"dsatur", "greedy_largest_first", "greedy_smallest_last"} <= set(row["classical"]) for row in rows)
    for row in rows:  # each stage never uses more colours than the one before
        assert row["searched"]["colors"] <= row["scheduled"]["colors"] <= row["repaired"]["colors"]
    assert next(row for row in rows if row["name"] == "queen5_5")["searched"]["colors"] == 5  # chi, reached
    assert "| queen5_5 | 25 | 160 | 5 | 5 |" in (run / "results.md").read_text()

    (run / "results.md").unlink()
    assert main(["gnn", "evaluate", "--run-dir", str(run)]) == 0  # in-process: this test's time is CI's
    assert json.loads(capsys.readouterr().out)["val"]["all_valid"] and (run / "results.md").exists()
    other = tmp_path / "other"  # a dataset regenerated where the run's was: evaluated, it once wrote other graphs'
    shutil.copytree(data, other)  # figures into the run's results
    run_cli(["gnn", "data", "--out", str(data), "--train", "8", "--val", "2", "--max-nodes", "30", "--overwrite",
             "--no-progress"], check=True)
    before = (run / "results.json").read_bytes()
    assert main(["gnn", "evaluate", "--run-dir", str(run)]) == 2
    assert "was trained on other data" in capsys.readouterr().err and (run / "results.json").read_bytes() == before
    shutil.rmtree(data)
    other.rename(data)

    run_cli(["gnn", "export", "--run-dir", str(run)], check=True)
    info = json.loads((run / "export.json").read_text())
    assert info["max_abs_error"] < 1e-4 and set(info["checked"]) == {"myciel5", "queen8_8", "myciel3"}
    write_dimacs(queen(7), tmp_path / "q7.col")
    # `gnn color` needs no torch: run it with `import torch` made to fail; the search is on by default
    proc = color_without_torch(["--model", str(run / "model.onnx"), "--graph", str(tmp_path / "q7.col"),
                                "--output", str(tmp_path / "q7.txt")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["conflicts"] == 0 and out["nodes"] == 49 and out["colors"] == 7  # chi: the clique bound ends it
    assert out["searched"]["stopped"] == "lower_bound" and out["seconds"]["total"] < 10
    colors = np.loadtxt(tmp_path / "q7.txt", dtype=int)[:, 1]
    assert conflicts(queen(7).edges, colors) == 0 and len(np.unique(colors)) == 7
    graph = (tmp_path / "q7.col").read_bytes()  # --output refused before the search: the graph itself (it was
    for output, needle in ((tmp_path / "q7.col", "is the --graph it colours"), (tmp_path, "is a folder"),  # lost)
                           (tmp_path / "none" / "c.txt", "does not exist"), (run / "model.onnx", "is the --model"),
                           (run / "export.json", "is the --model's export.json")):
        assert main(["gnn", "color", "--model", str(run / "model.onnx"), "--graph", str(tmp_path / "q7.col"),
                     "--output", str(output)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], err
    assert (tmp_path / "q7.col").read_bytes() == graph and (run / "export.json").is_file()
    # fine-tuning needs torch: without it, one line and exit 2
    write_dimacs(mycielski(5), tmp_path / "m5.col")
    args = ["--model", str(run / "model.onnx"), "--graph", str(tmp_path / "m5.col"), "--search-iters", "500",
            "--finetune-steps", "20", "--finetune-restarts", "2"]
    proc = color_without_torch(args)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "needs PyTorch" in proc.stderr
    assert main(["gnn", "color", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    ft = out["finetuned"]
    assert {"raw", "repaired", "scheduled", "searched", "finetuned"} <= set(out) and out["conflicts"] == 0
    assert len(ft["restarts"]) == 2 and ft["target"] == out["searched"]["colors"] - 1
    assert out["colors"] == ft["colors"] <= out["searched"]["colors"] and out["colors"] >= 6  # chi(myciel5) = 6

    # the population search: torch on the CPU, seeded by the model's samples (queen8_8's start of about
    # 12 colours is within the 16 it offers); without torch, one line and exit 2
    write_dimacs(queen(8), tmp_path / "q8.col")
    args = ["--model", str(run / "model.onnx"), "--graph", str(tmp_path / "q8.col"), "--search", "population",
            "--population", "6", "--search-iters", "6000", "--output", str(tmp_path / "q8.txt")]
    proc = color_without_torch(args)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "--search population needs PyTorch" in proc.stderr
    assert main(["gnn", "color", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    pop = out["searched"]
    assert pop["method"] == "population" and pop["seeded_by"] == "gnn" and pop["population"] == 6
    assert pop["iterations"] <= 6000 and out["conflicts"] == 0 and out["colors"] == pop["colors"] >= 9  # chi(queen8_8) = 9
    assert out["colors"] <= pop["start_colors"] <= out["scheduled"]["colors"]
    colors = np.loadtxt(tmp_path / "q8.txt", dtype=int)[:, 1]
    assert conflicts(queen(8).edges, colors) == 0 and len(np.unique(colors)) == out["colors"]

    proc = run_cli(["package", "--run-dir", str(run)], check=True)
    assert json.loads(proc.stdout)["files"] > 5
