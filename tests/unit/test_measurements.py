"""docs/measurements.md is what tools/measurements.py makes of bench/results/index.json (issue 66): a figure on it
cannot drift from its file, and the index names the latest committed result of each benchmark on each device."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import measurements  # noqa: E402

INDEX = json.loads((ROOT / "bench" / "results" / "index.json").read_text())


def test_the_page_is_what_the_generator_makes():
    assert (ROOT / "docs" / "measurements.md").read_text() == measurements.render(INDEX), (
        "docs/measurements.md differs from its generator: run python tools/measurements.py")


def test_the_check_fails_on_a_page_edited_by_hand(tmp_path, monkeypatch):
    page = tmp_path / "measurements.md"
    page.write_text(measurements.render(INDEX).replace("3,916 samples/s", "3,917 samples/s"))
    monkeypatch.setattr(measurements, "PAGE", page)
    monkeypatch.setattr(measurements, "ROOT", ROOT)
    assert measurements.main(["--check"]) == 1
    page.write_text(measurements.render(INDEX))
    assert measurements.main(["--check"]) == 0


def test_the_command_line_check_passes_on_the_committed_page():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "measurements.py"), "--check"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_a_figure_names_one_number_never_an_object():
    with pytest.raises(ValueError, match="not one number"):
        measurements.leaf({"rows": [{"a": 1}]}, "rows.0")


def family(path):
    """The device a result folder holds: gpu_h200 and gpu_h200_<session> are one device's; bench/results itself
    is the CPU's."""
    rel = path.relative_to(ROOT / "bench" / "results")
    return rel.parts[0].split("_")[:2] if len(rel.parts) > 1 else ["cpu"]


@pytest.mark.parametrize("row", INDEX["rows"], ids=[r["file"] for r in INDEX["rows"]])
def test_each_row_is_the_latest_result_of_its_benchmark_on_its_device(row):
    path = ROOT / row["file"]
    stored = json.loads(path.read_text())
    if "run" in row:  # one file of every run of a benchmark: the row is its latest run
        assert row["run"] in (-1, len(stored["runs"]) - 1), row
        return
    mine = stored.get("measured_at") or ""
    newer = []
    for other in (ROOT / "bench" / "results").rglob(path.name):
        if other == path or family(other) != family(path):
            continue
        theirs = json.loads(other.read_text()).get("measured_at") or ""
        if theirs > mine:
            newer.append(f"{other.relative_to(ROOT)} ({theirs})")
    assert not newer, f"{row['file']} ({mine}) is not the latest: {newer}"
