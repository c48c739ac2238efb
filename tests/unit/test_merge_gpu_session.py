"""A GPU session's results join their device's folder (tools/merge_gpu_session.py): a new benchmark as its file, one
measured before as the next run of its .runs.json, every record with its session, no folder stamped with a commit."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import merge_gpu_session  # noqa: E402

BLOCK = {"device_name": "NVIDIA H200", "date": "2026-12-02", "tree_measured": "1234abc", "torch": "2.11.0+cu130",
         "note": "clean", "source": "test"}


def test_a_session_joins_its_devices_folder(tmp_path):
    device, session = tmp_path / "gpu_h200", tmp_path / "out"
    device.mkdir()
    session.mkdir()
    (device / "run_gnn_gpu.json").write_text(json.dumps({"results": [{"mfu": 0.1}]}))
    (device / "run_ppo_gpu.runs.json").write_text(json.dumps({"benchmark": "runs", "runs": [{"n": 0}, {"n": 1}]}))
    for name, record in (("run_gnn_gpu.json", {"results": [{"mfu": 0.2}]}), ("run_ppo_gpu.json", {"n": 2}),
                         ("matmul_gpu.json", {"tflops": 759.0})):
        (session / name).write_text(json.dumps(record))
    (session / "logs").mkdir()
    (session / "logs" / "run_gnn.log").write_text("ok\n")
    merge_gpu_session.merge(session, device, BLOCK)
    assert sorted(p.name for p in device.iterdir()) == ["logs", "matmul_gpu.json", "run_gnn_gpu.runs.json",
                                                        "run_ppo_gpu.runs.json"]
    gnn = json.loads((device / "run_gnn_gpu.runs.json").read_text())
    assert gnn["benchmark"] == "runs" and [r["results"][0]["mfu"] for r in gnn["runs"]] == [0.1, 0.2]
    assert gnn["runs"][1]["session"] == BLOCK and "session" not in gnn["runs"][0]
    assert [r["n"] for r in json.loads((device / "run_ppo_gpu.runs.json").read_text())["runs"]] == [0, 1, 2]
    assert json.loads((device / "matmul_gpu.json").read_text())["session"]["tree_measured"] == "1234abc"
    assert (device / "logs" / "run_gnn.log").read_text() == "ok\n"
    merge_gpu_session.merge(session, device, dict(BLOCK, date="2026-12-03"))  # the same session merged again
    assert len(json.loads((device / "run_gnn_gpu.runs.json").read_text())["runs"]) == 2  # no run counted twice
    assert len(json.loads((device / "run_ppo_gpu.runs.json").read_text())["runs"]) == 3
    assert json.loads((device / "matmul_gpu.json").read_text())["session"]["date"] == "2026-12-02"


def test_a_session_file_that_is_not_an_object_merges_nothing(tmp_path):
    device, session = tmp_path / "gpu_h200", tmp_path / "out"
    session.mkdir()
    (session / "a.json").write_text(json.dumps({"x": 1}))
    (session / "b.json").write_text("[1, 2]")
    with pytest.raises(SystemExit, match="not a JSON object: nothing merged"):
        merge_gpu_session.merge(session, device, BLOCK)
    assert not device.exists()
