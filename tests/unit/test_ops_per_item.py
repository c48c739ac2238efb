"""bench/ops_per_item.py: aten operations per trained item, split by where the job was (issue 33's CPU proxy
for a GPU's kernel launches), counted in this process on a tiny forecast run."""

import importlib.util

from conftest import ROOT, TINY_DATA


def _bench():
    spec = importlib.util.spec_from_file_location("ops_per_item", ROOT / "bench" / "ops_per_item.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_count_is_split_by_phase_and_the_loop_share_is_per_item(tmp_path):
    bench = _bench()
    row = bench.count(["forecast", "train", *TINY_DATA, "--max-steps", "4", "--eval-every", "2", "--batch-size", "64"],
                      tmp_path)
    phases = row["ops_by_phase"]
    assert sum(phases.values()) == row["aten_ops"] and phases["loop"] > 0 and phases["evaluation"] > 0, phases
    assert row["items"] == 4 * 64 and row["loop_ops_per_item"] == phases["loop"] / row["items"]
    # a step of a tiny model dispatches hundreds of operations (forward, backward, AdamW), not thousands
    assert 100 < phases["loop"] / 4 < 5000, phases
