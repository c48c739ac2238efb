"""The colouring GNN end to end: 2 ranks -> results table -> ONNX -> `gnn color` (without torch) -> tarball."""

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import run_cli, run_torchrun
from trainers.gnn.graphs import conflicts, queen, write_dimacs


@pytest.mark.slow
def test_two_rank_training_to_onnx_table_and_color_cli(tmp_path):
    data, run = tmp_path / "data", tmp_path / "run"
    run_cli(["gnn", "data", "--out", str(data), "--train", "48", "--val", "8", "--max-nodes", "60", "--no-progress"],
            check=True)
    run_torchrun(["gnn", "train", "--data-dir", str(data), "--run-dir", str(run), "--epochs", "3", "--graphs-per-batch", "6",
                  "--hidden", "32", "--layers", "2"])
    r = json.loads((run / "results.json").read_text())
    assert r["training"]["world_size"] == 2 and r["training"]["steps"] == 3 * 4 and r["trainer"] == "gnn"  # 48 graphs / (2 x 6)
    rows = r["evaluation"]["benchmark"]
    assert {row["name"] for row in rows} >= {"queen5_5", "queen8_8", "myciel4", "myciel6"}
    assert all(row["conflicts"] == 0 for row in rows) and r["evaluation"]["val"]["all_valid"]
    assert all({"dsatur", "greedy_largest_first", "greedy_smallest_last"} <= set(row["classical"]) for row in rows)
    assert "| queen5_5 | 25 | 160 | 5 |" in (run / "results.md").read_text()
    run_cli(["gnn", "export", "--run-dir", str(run)], check=True)
    info = json.loads((run / "export.json").read_text())
    assert info["max_abs_error"] < 1e-4 and set(info["checked"]) == {"myciel5", "queen8_8", "myciel3"}
    write_dimacs(queen(7), tmp_path / "q7.col")
    # `gnn color` needs no torch: run it with `import torch` made to fail
    proc = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                           "from trainers.cli import main\n"
                           f"raise SystemExit(main(['gnn', 'color', '--model', {str(run / 'model.onnx')!r}, "
                           f"'--graph', {str(tmp_path / 'q7.col')!r}, '--output', {str(tmp_path / 'q7.txt')!r}]))"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["conflicts"] == 0 and out["nodes"] == 49
    colors = np.loadtxt(tmp_path / "q7.txt", dtype=int)[:, 1]
    assert conflicts(queen(7).edges, colors) == 0
    proc = run_cli(["package", "--run-dir", str(run)], check=True)
    assert json.loads(proc.stdout)["files"] > 5
