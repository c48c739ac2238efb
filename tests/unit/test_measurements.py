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


@pytest.mark.parametrize("row", INDEX["rows"], ids=[r["file"] for r in INDEX["rows"]])
def test_each_row_is_the_latest_result_of_its_benchmark_on_its_device(row):
    """One folder a device, one file a benchmark: a benchmark measured again replaces its file or joins its
    .runs.json, so the latest is the file itself or that file's last run."""
    path = ROOT / row["file"]
    stored = json.loads(path.read_text())
    stem = path.name.removesuffix(".runs.json").removesuffix(".json")
    twins = [p for p in path.parent.glob(f"{stem}*.json") if p != path
             and p.name.removesuffix(".runs.json").removesuffix(".json") == stem]
    assert not twins, (row["file"], twins)  # a .json beside a .runs.json of one benchmark: which is the latest?
    if stored.get("benchmark") == "runs":
        assert row.get("run") in (-1, len(stored["runs"]) - 1), row  # its latest run
    else:
        assert "run" not in row, row


def test_every_result_file_is_on_the_page():
    page = (ROOT / "docs" / "measurements.md").read_text()
    files = [p.relative_to(ROOT / "bench" / "results").as_posix() for p in (ROOT / "bench" / "results").rglob("*.json")]
    missing = [f for f in files if f != "index.json" and f"`{f}`" not in page]
    assert len(files) > 100 and not missing, missing
