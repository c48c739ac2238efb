"""Every figure a page publishes is tied to the one number of the committed JSON it was measured into
(`tools/claims.py` says how), so a figure cannot drift from its measurement or outlive it. The guard's own mutants
(every figure's last digit changed, neighbours swapped, a mark's key deleted) are in tests/leaks/test_claims_mutants.py.
"""

from __future__ import annotations

import json
import re
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import claims  # noqa: E402

PAGES = claims.pages()


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_is_tied_to_its_measurement(page):
    problems = claims.check((ROOT / page).read_text())
    assert not problems, f"{page}: {len(problems)} problem(s):\n" + "\n".join(problems[:40])


def test_the_pages_include_the_readmes_of_the_results():
    assert "README.md" in PAGES and "docs/measurements.md" in PAGES
    assert any(p.startswith("bench/results/") and p.endswith("README.md") for p in PAGES)


def page_with(tmp_path, record: dict, text: str):
    results = tmp_path / "r.json"
    results.write_text(json.dumps(record))
    return claims.check(text.replace("R.json", str(results)))


RECORD = {"run": {"epoch_s": 12.31, "share": 0.489, "rate": 518.4, "steps_per_s": 79401.3},
          "rows": [{"mfu": 0.450}, {"mfu": 0.514}, {"mfu": 0.482}], "ratio": 1.1004, "low": 0.861, "high": 1.183,
          "cudnn": 90501, "err": 2.98e-08, "step_s": 0.22797}


def test_a_faithful_page_passes(tmp_path):
    text = ("Trained at 12.3 s <!-- claim: R.json#run.epoch_s --> an epoch, 48.9 % <!-- claim: R.json#run.share --> of\n"
            "it steady; 79,401 <!-- claim: R.json#run.steps_per_s --> env steps/s. Eager 45.0 %\n"
            "<!-- claim: R.json#rows.0.mfu -->, FSDP2 51.4 % <!-- claim: R.json#rows.1.mfu -->, d12 48.2 %\n"
            "<!-- claim: R.json#rows.2.mfu -->; the plan was off by 1.10 <!-- claim: R.json#ratio -->, 0.86\n"
            "<!-- claim: R.json#low --> to 1.18 <!-- claim: R.json#high -->; cuDNN 90501 <!-- claim: R.json#cudnn -->;\n"
            "parity 3.0e-08 <!-- claim: R.json#err -->; a step of 228 ms <!-- claim: R.json#step_s scale=1000 -->.\n"
            "With `--lr 1e-3` on 2 cores, 2026-11-24, torch 2.13.0, an H100 80GB HBM3.\n\n"
            "| graph | colours |\n| --- | --- |\n| DSJC250.5 | 28.0 <!-- external: DIMACS best known --> |\n")
    assert page_with(tmp_path, RECORD, text) == []


@pytest.mark.parametrize("edit", [
    ("79,401", "87,341"),                        # a count that is a measurement (no unit after it)
    ("45.0 %", "51.4 %"),                       # two figures swapped...
    ("1.10", "1.00"),                            # a ratio's last digits
    ("0.86\n", "0.93\n"),                        # a range's ends
    ("cuDNN 90501", "cuDNN 90502"),              # an integer the audit changed by one
    ("3.0e-08", "3.1e-08"),                      # e-notation
    ("228 ms", "229 ms"),                        # a scaled figure
], ids=["count", "swap", "ratio", "range", "integer", "e-notation", "scale"])
def test_each_edit_of_the_audit_turns_the_check_red(tmp_path, edit):
    text = ("79,401 <!-- claim: R.json#run.steps_per_s --> env steps/s. Eager 45.0 % <!-- claim: R.json#rows.0.mfu -->,\n"
            "FSDP2 51.4 % <!-- claim: R.json#rows.1.mfu -->; off by 1.10 <!-- claim: R.json#ratio -->, 0.86\n"
            "<!-- claim: R.json#low --> to 1.18 <!-- claim: R.json#high -->; cuDNN 90501 <!-- claim: R.json#cudnn -->;\n"
            "parity 3.0e-08 <!-- claim: R.json#err -->; a step of 228 ms <!-- claim: R.json#step_s scale=1000 -->.\n")
    assert page_with(tmp_path, RECORD, text) == []
    old, new = edit
    assert text.count(old) == 1
    assert page_with(tmp_path, RECORD, text.replace(old, new)), edit


def test_a_mark_on_an_object_or_a_list_is_refused(tmp_path):
    for path, word in (("run", "an object"), ("rows", "a list")):
        problems = page_with(tmp_path, RECORD, f"Trained at 12.3 s <!-- claim: R.json#{path} -->.\n")
        assert problems and word in problems[0] and "name one number" in problems[0], problems


def test_one_mark_ties_one_figure_the_others_need_their_own(tmp_path):
    problems = page_with(tmp_path, RECORD, "12.3 s and 48.9 % <!-- claim: R.json#run.share -->.\n")
    assert problems == ["line 1: 12.3 has no claim or external mark"]
    # the mark ties to the last number before it: one that is not the figure is a mismatch, not a pass
    problems = page_with(tmp_path, RECORD, "12.3 s an epoch on 2 workers <!-- claim: R.json#run.epoch_s -->.\n")
    assert any("2 is not" in p for p in problems), problems


def test_external_names_a_source_outside_the_repository(tmp_path):
    for source in ("bench/results/gpu_h200/deploy-gpt.log", "lstm_cohort_cpu.json jobs.1", "timed by hand", ""):
        problems = page_with(tmp_path, RECORD, f"A parity of 1.67e-06 <!-- external: {source} -->.\n")
        assert problems and "outside this repository" in problems[0], (source, problems)
    assert page_with(tmp_path, RECORD, "nanochat's run: 47.5 % <!-- external: nanochat's logged d20 run -->.\n") == []


def test_a_missing_file_key_or_option_is_named(tmp_path):
    assert "does not exist" in page_with(tmp_path, RECORD, "12.3 s <!-- claim: gone.json#run.epoch_s -->\n")[0]
    assert "no key 'nope'" in page_with(tmp_path, RECORD, "12.3 s <!-- claim: R.json#run.nope -->\n")[0]
    assert "unknown option" not in " ".join(page_with(tmp_path, RECORD, "228 ms <!-- claim: R.json#step_s scale=1000 -->\n"))
    assert "not a finite number" in page_with(tmp_path, {"s": "12.3"}, "12.3 s <!-- claim: R.json#s -->\n")[0]
    assert "names no key" in page_with(tmp_path, RECORD, "12.3 s <!-- claim: R.json -->\n")[0]


def test_table_cells_under_a_unit_header_and_keys_with_spaces(tmp_path):
    record = {"compile on": {"rate": 1122.98}, "b": 4.49}
    text = ("| workers | samples/s |\n| --- | --- |\n| 1 | 1,123 <!-- claim: R.json#compile on.rate --> |\n"
            "| 2 | 1,124 |\n\n- one bullet's 4.5 s <!-- claim: R.json#b -->\n- the next one's 4.5 s\n")
    assert page_with(tmp_path, record, text) == ["line 4: 1,124 has no claim or external mark",
                                                 "line 7: 4.5 has no claim or external mark"]


def test_every_json_a_claim_cites_records_where_and_on_what_code_it_ran():
    """Issue 66: about 60 claims rested on GPU JSONs that named no device, and three cited files recorded no device,
    torch or commit at all. Each cited file now says all three (tools/claims.py's provenance_gaps: where each
    benchmark writes them)."""
    gaps = {file: claims.provenance_gaps(json.loads((ROOT / file).read_text()))
            for file in claims.cited_files()}
    assert not {f: g for f, g in gaps.items() if g}, {f: g for f, g in gaps.items() if g}


def test_the_provenance_check_names_what_a_record_lacks():
    assert claims.provenance_gaps({"device": "auto", "git_commit": "abc1234"}) == ["device", "torch"]
    assert claims.provenance_gaps({"device_name": "NVIDIA H200", "versions": {"torch": "2.11.0+cu130"},
                                   "git_commit": "abc1234"}) == []
    cpu = {"machine": {"processor": "x86_64", "gpu_driver": None}, "versions": {"torch": "2.13.0+cpu", "cuda": None},
           "git_commit": "abc1234"}
    assert claims.provenance_gaps(cpu) == []
    assert claims.provenance_gaps({"benchmark": "runs", "runs": [cpu, {"git_commit": "abc1234"}]}) == ["device", "torch"]


def test_no_result_file_or_folder_is_stamped_with_a_commit():
    """The history of a result is git's: a benchmark measured again replaces its file (or joins its .runs.json)."""
    stamped = [str(p.relative_to(ROOT)) for p in (ROOT / "bench" / "results").rglob("*")
               if re.search(r"(?:^|_)[0-9a-f]{7,40}(?:_|\.|$)", p.name)]
    assert not stamped, stamped


def test_a_percent_is_a_fraction_x_100_and_a_scale_is_positive(tmp_path):
    record = {"frac": 0.489, "pct": 48.9, "frac_small": 0.001}
    assert page_with(tmp_path, record, "took 48.9 % <!-- claim: R.json#frac -->\n") == []
    assert page_with(tmp_path, record, "took 0.49 % <!-- claim: R.json#frac -->\n")  # 100x off
    # (a leaf is a fraction unless its mark says scale=1: 48.9 printed as a percent is 4,890 %, one rule, no guess)
    assert page_with(tmp_path, record, "took 48.9 % <!-- claim: R.json#pct scale=1 -->\n") == []
    assert page_with(tmp_path, record, "took 0.1 % <!-- claim: R.json#frac_small -->\n") == []
    for bad in ("scale=0", "scale=-1", "scale=nan"):
        assert "a scale is a finite number > 0" in page_with(tmp_path, record, f"0.0 s <!-- claim: R.json#frac {bad} -->\n")[0]


def test_a_lookalike_mark_a_table_row_without_its_last_pipe_and_a_range_are_read(tmp_path):
    record = {"a": 850.0, "b": 41.0, "lo": 1500.0, "hi": 2500.0}
    assert "looks like a mark" in " ".join(page_with(tmp_path, record, "took 850 s <!-- Claim: R.json#a -->\n"))
    table = "| wall s | MFU % |\n|---|---|\n| 850 <!-- claim: R.json#a --> | 41\n"
    assert page_with(tmp_path, record, table) == ["line 3: 41 has no claim or external mark"]
    assert page_with(tmp_path, record, "took 1500-2500 s <!-- claim: R.json#hi -->\n") == [
        "line 1: 1500 has no claim or external mark"]


def test_an_external_mark_covers_its_own_figure_only(tmp_path):
    problems = page_with(tmp_path, RECORD, "measured 99.9 s here, 45.6 s per the paper <!-- external: Smith 2020 -->\n")
    assert problems == ["line 1: 99.9 has no claim or external mark"]


def test_the_provenance_check_refuses_empty_runs_and_a_commit_that_is_not_one():
    named = {"device_name": "NVIDIA H200", "versions": {"torch": "2.11.0+cu130"}}
    assert claims.provenance_gaps({"benchmark": "runs", "runs": []}) == ["device", "torch", "commit"]
    assert claims.provenance_gaps({**named, "git_commit": "unknown"}) == ["commit"]
    assert claims.provenance_gaps({**named, "versions": {"torch": "unknown"}, "git_commit": "abc1234"}) == ["torch"]


def test_no_table_mark_names_another_measurement_than_its_column():
    """A mark tied to a key whose number merely equals the figure (`+0.066` in the persistence column tied to
    LightGBM's IC) passes every check of the figure; its column's other marks show it (issue 66's migration made
    44 such, found by a review, mended, and this test keeps them out)."""
    found = {page: claims.column_outliers((ROOT / page).read_text()) for page in PAGES}
    assert not {p: f for p, f in found.items() if f}, {p: f for p, f in found.items() if f}


def test_a_column_outlier_is_found(tmp_path):
    record = {"rows": {name: {"rank_ic": v, "ic": v} for name, v in (("a", 0.1), ("b", 0.2), ("c", 0.3))}}
    rows = "".join(f"| {n} | {v} <!-- claim: R.json#rows.{n}.{key} --> | {v} <!-- claim: R.json#rows.{n}.ic --> |\n"
                   for n, v, key in (("a", 0.1, "rank_ic"), ("b", 0.2, "ic"), ("c", 0.3, "rank_ic")))
    text = "| row | rank IC | IC |\n| --- | --- | --- |\n" + rows
    results = tmp_path / "r.json"
    results.write_text(json.dumps(record))
    found = claims.column_outliers(text.replace("R.json", str(results)))
    assert len(found) == 1 and "rows.b.ic ends in 'ic' where its column's marks end in 'rank_ic'" in found[0], found
