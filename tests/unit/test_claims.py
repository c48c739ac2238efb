"""Every figure a README publishes is tied to the committed JSON it was measured into, so a figure
cannot drift from its measurement (or outlive it).

A measured figure is followed (on its line, or later in its paragraph, list item or table row) by
`<!-- claim: bench/results/FILE.json#dotted.path -->`: every measured-looking number between the
previous mark and this one (within that paragraph, list item or row) must equal, rounded as printed,
some number found under that path of the JSON (the path may point at a number, or at an object or
list holding several). A figure from outside this repository — a seed's projection, a paper, another
project, a known chromatic number, a vendor's default — is followed by `<!-- external: WHERE -->`
instead. A measured-looking number with neither mark fails the test, and so does a mark whose file,
path or option does not exist.

Measured-looking: a number written with a decimal point (`12.3`, `3.0e-08`: e-notation compares the
mantissa's digits), a percentage, or a count followed by a unit of time, size, rate or speed-up
(`12.3 s`, `48.9 %`, `518 graphs/s`, `3.9x`; the first end of a range takes the unit of the second,
`10-20 %`), outside code spans, code blocks and link targets; in a table, also a cell holding only a
number under a header that names the unit (`samples/s`, `wall s`). Dates, versions (`torch 2.13`,
`Python ≥ 3.10`), commits, products (`64 x depth`: an `x` after a space multiplies), option values and
plain counts are not; a setting quoted in prose goes in a code span (`POLL_S = 0.5`).
Options: `scale=K` multiplies the JSON's numbers before comparing (a fraction printed as a percent
needs none: ×100 is always tried); `abs` compares magnitudes (a JSON loss printed as a gap).
"""

from __future__ import annotations

import json
import math
import re

import pytest

from conftest import ROOT

READMES = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")),
           *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "trainers").glob("*/README.md"))]
MARK = re.compile(r"<!--\s*(claim|external):\s*(.*?)\s*-->", re.S)
UNITS = (r"(?:ms|s|min|h|hours?|minutes?|seconds?|GB|GiB|MB|MiB|KiB|kB|TB/s|GB/s|TFLOP/s|"
         r"[a-zA-Z_]+/s)")
# A speed-up (`3.9x`, `0.80×`) touches its number; `64 x depth`, `2 ranks x 4 sequences` multiply.
NUMBER = re.compile(r"(?:(?<![\w.\-/])|(?<=\d[-–]))([+\-−]?\d[\d,]*(?:\.\d+)?(?:[eE][+\-]?\d+)?)"
                    r"(\s?%|\s?" + UNITS + r"(?![\w/])|[x×](?![\w/]))?")
# the second end of a range gives the first its unit: `0.2-0.3 s`, `10–20 %`
RANGE_UNIT = re.compile(r"[-–]\d[\d,]*(?:\.\d+)?(?:\s?%|\s?" + UNITS + r"(?![\w/])|[x×](?![\w/]))")
VERSIONED = re.compile(r"(?:Python|torch|PyTorch|Lightning|podman|CUDA|NCCL|Debian|Ubuntu|onnxruntime|yfinance|"
                       r"NumPy|pandas|gymnasium)\s?(?:[≥≤<>=]=?\s?)?$")
HEADER_UNIT = re.compile(r"(?<![\w/])(?:%|" + UNITS + r")(?![\w/])")
ROW_BOUNDARY = re.compile(r"\n\n|\n[ \t]*\||\n[ \t]*(?:[-*+]|\d+\.)[ \t]")  # a paragraph, table row, list item


def prose(text: str) -> str:
    """The text with code blocks, code spans, link targets and HTML comments other than marks blanked
    (replaced by spaces, so positions stay)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", blank, text)
    text = re.sub(r"\]\([^)]*\)", blank, text)
    text = re.sub(r"https?://\S+", blank, text)
    return re.sub(r"<!--(?!\s*(?:claim|external):).*?-->", blank, text, flags=re.S)


def measured_looking(text: str) -> list[tuple[int, str, int | None]]:
    """(position, printed number, decimals) of each measured-looking number in `text`: decimals is
    None for a number printed in e-notation (then its mantissa's decimals count, see `matches`)."""
    out = []
    for m in NUMBER.finditer(text):
        number, unit = m.group(1), (m.group(2) or "").strip()
        start = m.start(1)
        if re.match(r"\d{4}-\d\d", text[start:start + 7]) or re.search(r"\d{4}-\d\d-$", text[max(0, start - 8):start]):
            continue  # a date
        if re.match(r"[\d.]+\.\d+\.\d+", text[start:]) or VERSIONED.search(text[max(0, start - 20):start]):
            continue  # a version
        if not unit and RANGE_UNIT.match(text, m.end(1)):
            unit = "range"
        mantissa, _, exponent = number.lower().partition("e")
        decimal = "." in mantissa
        if not (decimal or unit):
            continue
        if exponent:
            out.append((start, number, None))
        else:
            out.append((start, number, len(number.split(".")[1]) if decimal else 0))
    return out


def table_cells(text: str) -> list[tuple[int, str, int | None]]:
    """Table cells holding only a number, under a header that names a unit (`samples/s`, `wall s`,
    `%`): the unit is printed once for the column, so each of them is measured-looking too."""
    out = []
    lines, offsets, pos = text.split("\n"), [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    i = 0
    while i < len(lines):
        if not (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
                and re.fullmatch(r"\s*\|[\s:|-]*-[\s:|-]*", lines[i + 1])):
            i += 1
            continue
        header = lines[i].strip().strip("|").split("|")
        units = [bool(HEADER_UNIT.search(cell)) for cell in header]
        i += 2
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            line, start = lines[i], offsets[i]
            cells = line.split("|")
            at = start + len(cells[0]) + 1
            for column, cell in enumerate(cells[1:-1]):
                number = re.fullmatch(r"\s*(?:\*\*)?([+\-−]?\d[\d,]*(?:\.\d+)?)(?:\*\*)?\s*", cell)
                if number and column < len(units) and units[column]:
                    printed = number.group(1)
                    decimals = len(printed.split(".")[1]) if "." in printed else 0
                    out.append((at + number.start(1), printed, decimals))
                at += len(cell) + 1
            i += 1
    return out


def figures_in(clean: str) -> list[tuple[int, str, int | None]]:
    """Every measured-looking number of a README (the text `prose` left), outside the marks."""
    bare = MARK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), clean)
    found = {pos: (pos, printed, decimals) for pos, printed, decimals in measured_looking(bare)}
    for pos, printed, decimals in table_cells(bare):
        found.setdefault(pos, (pos, printed, decimals))
    return sorted(found.values())


def to_float(printed: str) -> float:
    return float(printed.replace(",", "").replace("−", "-"))


def numbers_under(node) -> list[float]:
    if isinstance(node, bool) or node is None:
        return []
    if isinstance(node, (int, float)):
        return [float(node)] if math.isfinite(node) else []
    if isinstance(node, dict):
        return [v for x in node.values() for v in numbers_under(x)]
    if isinstance(node, (list, tuple)):
        return [v for x in node for v in numbers_under(x)]
    if isinstance(node, str):
        return [float(x) for x in re.findall(r"[+-]?\d+(?:\.\d+)?", node)]
    return []


def resolve(spec: str) -> tuple[list[float], str | None]:
    """The numbers a claim points at (with its options applied), or why it cannot be read."""
    target, *options = spec.split()
    file, _, path = target.partition("#")
    p = ROOT / file
    if not p.is_file():
        return [], f"{file} does not exist"
    try:
        node = json.loads(p.read_text())
    except ValueError as exc:
        return [], f"{file} is not JSON ({exc})"
    for key in [k for k in path.split(".") if k]:
        if isinstance(node, list) and key.lstrip("-").isdigit():
            idx = int(key)
            if not -len(node) <= idx < len(node):
                return [], f"{file}#{path}: no item {key}"
            node = node[idx]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return [], f"{file}#{path}: no key {key!r}"
    values = numbers_under(node)
    scale = 1.0
    for option in options:
        if option.startswith("scale="):
            scale = float(option[6:])
        elif option != "abs":
            return [], f"unknown option {option!r}"
    values = [v * scale for v in values]
    if "abs" in options:
        values += [abs(v) for v in values]
    return values, None


def matches(printed: str, decimals: int | None, values: list[float]) -> bool:
    x = to_float(printed)
    if decimals is None:  # e-notation: equal when printed with the same digits
        digits = len(printed.lower().partition("e")[0].partition(".")[2])
        return any(float(f"{c:.{digits}e}") in (x, -x) for v in values for c in (v, v * 100))
    for v in values:
        for candidate in (v, v * 100):
            if round(candidate, decimals) == round(x, decimals) or round(abs(candidate), decimals) == round(abs(x), decimals):
                return True
    return False


def check(text: str) -> list[str]:
    """Every problem with the figures of one README."""
    clean = prose(text)
    problems = []
    figures = figures_in(clean)
    boundaries = [m.start() for m in ROW_BOUNDARY.finditer(clean)]
    covered: set[int] = set()
    previous = 0
    for mark in MARK.finditer(clean):
        kind, spec = mark.group(1), mark.group(2)
        start = max([previous] + [b for b in boundaries if b < mark.start()])
        previous = mark.end()
        mine = [f for f in figures if start <= f[0] < mark.start()]
        covered |= {pos for pos, _, _ in mine}
        if kind == "external":
            continue
        values, problem = resolve(spec)
        if problem:
            problems.append(f"claim {spec}: {problem}")
            continue
        line = clean.count("\n", 0, mark.start()) + 1
        for _, printed, decimals in mine:
            if not matches(printed, decimals, values):
                problems.append(f"line {line}: {printed} is not in {spec} (rounded as printed)")
    for pos, printed, _ in figures:
        if pos not in covered:
            line = clean.count("\n", 0, pos) + 1
            problems.append(f"line {line}: {printed} has no claim or external mark")
    return problems


@pytest.mark.parametrize("readme", READMES)
def test_every_figure_is_tied_to_its_measurement(readme):
    problems = check((ROOT / readme).read_text())
    assert not problems, f"{readme}: {len(problems)} problem(s):\n" + "\n".join(problems[:40])


def test_the_check_catches_a_drifted_figure_an_unmarked_one_and_a_missing_file(tmp_path):
    results = tmp_path / "r.json"
    results.write_text(json.dumps({"run": {"epoch_s": 12.31, "share": 0.489, "rate": 518.4}}))
    text = (f"Trained at 12.3 s an epoch <!-- claim: {results}#run.epoch_s -->, 48.9 % of it steady and 518\n"
            f"graphs/s <!-- claim: {results}#run -->. With `--lr 1e-3` on 2 cores, 2026-11-24, torch 2.13.0.\n\n"
            "| graph | k |\n| --- | --- |\n| DSJC250.5 | 28.0 | <!-- external: DIMACS best known -->\n")
    assert check(text) == []
    assert check(text + "\nA bare 7.5 s here.\n") == ["line 8: 7.5 has no claim or external mark"]
    results.write_text(json.dumps({"run": {"epoch_s": 12.41, "share": 0.489, "rate": 518.4}}))
    assert check(text) == [f"line 1: 12.3 is not in {results}#run.epoch_s (rounded as printed)"]
    assert "does not exist" in check(text.replace(str(results), str(tmp_path / "gone.json")))[0]
    assert "no key 'nope'" in check(text.replace("#run.epoch_s", "#run.nope"))[0]


def test_the_check_reads_ranges_e_notation_unit_columns_and_list_items(tmp_path):
    results = tmp_path / "r.json"
    good = {"a": [0.21, 0.34, 1.58, 3.46], "err": 2.98e-08, "rate": 1122.98, "step_s": 0.22797, "b": 4.49}
    results.write_text(json.dumps(good))
    text = (f"Packed in 0.2-0.3 s a symbol, 1.6-3.5x slower <!-- claim: {results}#a -->; parity error 3.0e-08\n"
            f"<!-- claim: {results}#err -->. A width of 64 x depth, 2 ranks x 4 sequences, Python ≥ 3.10,\n"
            "PyTorch Lightning 2.6.\n\n"
            "| workers x threads | samples/s (steady) | step |\n| --- | --- | --- |\n"
            f"| 1 x 1 | 1,123 <!-- claim: {results}#rate --> | 228 ms <!-- claim: {results}#step_s scale=1000 --> |\n\n"
            f"- one bullet's 4.5 s <!-- claim: {results}#b -->\n- the next one's 4.5 s <!-- claim: {results}#b -->\n")
    assert check(text) == []
    assert check(text.replace("#rate -->", "#b -->")) == [f"line 7: 1,123 is not in {results}#b (rounded as printed)"]
    bare_row = text.replace(f" <!-- claim: {results}#rate -->", "").replace(f" <!-- claim: {results}#step_s scale=1000 -->", "")
    assert check(bare_row) == ["line 7: 1,123 has no claim or external mark", "line 7: 228 has no claim or external mark"]
    assert check(text.replace("#step_s scale=1000", "#step_s")) == [
        f"line 7: 228 is not in {results}#step_s (rounded as printed)"]
    assert check(text + "And 3.9x faster.\n") == ["line 11: 3.9 has no claim or external mark"]
    assert "unknown option 'scale:2'" in check(text.replace("scale=1000", "scale:2"))[0]
    for key, drifted in (("a", [0.21, 0.34, 1.58]), ("err", 3.1e-08)):
        results.write_text(json.dumps({**good, key: drifted}))
        assert check(text) == [f"line {1 if key == 'a' else 2}: {'3.5' if key == 'a' else '3.0e-08'} is not in "
                               f"{results}#{key} (rounded as printed)"]
    results.write_text(json.dumps(good))
    # a mark covers its own list item only: the bullet before it stays unmarked
    assert check(text.replace(f"- one bullet's 4.5 s <!-- claim: {results}#b -->\n", "- one bullet's 4.5 s\n")) == [
        "line 9: 4.5 has no claim or external mark"]
