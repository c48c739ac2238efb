"""The claims guard: every figure a page publishes is tied to the one number it was measured as.

    python tools/claims.py [PAGE ...]     # the problems of each page (all of them without arguments); exit 1 if any

A measured figure is followed by `<!-- claim: bench/results/FILE.json#dotted.path -->`, which names exactly one
number: a leaf of the JSON (an index into a list counts as a key), never an object or a list. The mark ties to the
last number printed before it, after the previous mark, within its paragraph, list item or table row; that
number must equal the JSON's at the printed precision (`12.3` is 12.25 to 12.35; `3.0e-08` compares its mantissa's
digits). Thousands separators and `−` are read; a figure printed with `%` is the leaf x 100 (a fraction: 0.489 is
48.9 %, and 0.49 % is refused); `scale=K` multiplies the leaf instead (`scale=1000` for seconds printed in ms,
`scale=1` for a leaf that is a percent already; K finite and > 0); `abs` compares magnitudes (a loss printed as a gap).
A comment that looks like a mark but is not one (`<!-- Claim: ...`, `<!-- claims ...`) is refused, never skipped.

A figure from outside this repository (a seed's projection, a paper, another project's log, a vendor's default)
is followed by `<!-- external: SOURCE -->` instead, which names its source and, as a claim does, ties to the last
number before it. A figure measured here is never external: a source that names this repository's
files, a log or work done by hand is refused.

Measured-looking, and so needing a mark: a number with a decimal point, a percentage, or a count followed by a
unit of time, size, rate or speed-up (`12.3 s`, `48.9 %`, `518 graphs/s`, `3.9x`; a range's first end takes the
unit of its second, `10-20 %`), outside code spans, code blocks and link targets; in a table, also a cell holding
only a number under a header that names a unit. Dates, versions (`torch 2.13`), commits, products (`H100 80GB
HBM3`, `64 x depth`) and plain counts are not; a count that is a measurement is marked all the same (the mark then
checks it).
"""

from __future__ import annotations

import bisect
import json
import math
import re
import sys
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"<!--\s*(claim|external):\s*(.*?)\s*-->", re.S)
UNITS = (r"(?:ms|s|min|h|hours?|minutes?|seconds?|GB|GiB|MB|MiB|KiB|kB|TB/s|GB/s|TFLOP/s|"
         r"[a-zA-Z_]+/s)")
NUMBER = re.compile(r"(?:(?<![\w.\-/])|(?<=\d[-–]))([+\-−]?\d[\d,]*(?:\.\d+)?(?:[eE][+\-]?\d+)?)"
                    r"(\s?%|\s?" + UNITS + r"(?![\w/])|[x×](?![\w/]))?")
RANGE_UNIT = re.compile(r"[-–]\d[\d,]*(?:\.\d+)?(?:\s?%|\s?" + UNITS + r"(?![\w/])|[x×](?![\w/]))")
VERSIONED = re.compile(r"(?:Python|torch|PyTorch|Lightning|podman|CUDA|NCCL|Debian|Ubuntu|onnxruntime|yfinance|"
                       r"NumPy|pandas|gymnasium|pip)\s?(?:[≥≤<>=]=?\s?)?$")
PRODUCT_AFTER = re.compile(r"GB HBM|GB PCIe|GB SXM|-SXM|-PCIe")
HEADER_UNIT = re.compile(r"(?<![\w/])(?:%|" + UNITS + r")(?![\w/])")
ROW_BOUNDARY = re.compile(r"\n\n|\n[ \t]*\||\n[ \t]*(?:[-*+]|\d+\.)[ \t]")
# an external source may not be this repository's own measurement
NOT_EXTERNAL = re.compile(r"bench/|\.json\b|\.log\b|\bby hand\b|\bthis repo|\bmeasured here\b|\bour\b", re.I)


def pages() -> list[str]:
    """Every page the guard reads: the README, docs/, each trainer's README and the READMEs of the results."""
    found = ["README.md"]
    found += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))
    found += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "trainers").glob("*/README.md"))
    found += sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench" / "results").rglob("README.md"))
    return found


def prose(text: str) -> str:
    """The text with code blocks, code spans, link targets and HTML comments other than marks blanked (replaced
    by spaces, so positions stay)."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    text = re.sub(r"```.*?```", blank, text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", blank, text)
    text = re.sub(r"\]\([^)]*\)", blank, text)
    text = re.sub(r"https?://\S+", blank, text)
    return re.sub(r"<!--(?!\s*(?:claim|external):).*?-->", blank, text, flags=re.S)


class Figure:
    """A number printed on a page: where, as printed, its decimals (None: e-notation), whether it is
    measured-looking (needs a mark) and whether it carries a percent sign."""

    def __init__(self, pos: int, end: int, printed: str, decimals: int | None, measured: bool, percent: bool):
        self.pos, self.end, self.printed, self.decimals = pos, end, printed, decimals
        self.measured, self.percent = measured, percent

    def __repr__(self) -> str:
        return f"Figure({self.printed!r} at {self.pos})"


def numbers_in(text: str) -> list[Figure]:
    """Every number of the text (marks blanked first), measured-looking or not, without dates, versions, product
    names and numbers inside words (`H200`, `d12`)."""
    out: dict[int, Figure] = {}
    for m in NUMBER.finditer(text):
        number, unit = m.group(1), (m.group(2) or "").strip()
        start = m.start(1)
        if re.match(r"\d{4}-\d\d-\d\d", text[start:start + 10]) or re.search(r"\d{4}-\d\d-$", text[max(0, start - 8):start]) \
                or re.search(r"\d{4}-$", text[max(0, start - 5):start]) and re.match(r"\d\d-\d\d", text[start:start + 5]):
            continue  # a date
        if re.match(r"[\d.]+\.\d+\.\d+", text[start:]) or VERSIONED.search(text[max(0, start - 20):start]):
            continue  # a version
        if PRODUCT_AFTER.match(text, m.end(1)):
            continue  # a product's name: H100 80GB HBM3, h100-sxm
        if not unit and RANGE_UNIT.match(text, m.end(1)):
            unit = "range"
        mantissa, _, exponent = number.lower().partition("e")
        decimal = "." in mantissa
        decimals = None if exponent else (len(mantissa.split(".")[1]) if decimal else 0)
        out[start] = Figure(start, m.end(), number, decimals, bool(decimal or unit), unit == "%")
    for figure in table_cells(text):
        out.setdefault(figure.pos, figure)
        out[figure.pos].measured = True
    return sorted(out.values(), key=lambda f: f.pos)


def table_cells(text: str) -> list[Figure]:
    """Table cells holding only a number under a header that names a unit (`samples/s`, `wall s`, `%`): the unit
    is printed once for the column, so each of them is measured-looking too."""
    out = []
    lines, offsets, pos = text.split("\n"), [], 0
    for line in lines:
        offsets.append(pos)
        pos += len(line) + 1
    i = 0
    while i < len(lines):
        if not table_starts(lines, i):
            i += 1
            continue
        header = lines[i].strip().strip("|").split("|")
        units = [HEADER_UNIT.search(cell) for cell in header]
        i += 2
        while i < len(lines) and lines[i].lstrip().startswith("|"):
            line, start = lines[i], offsets[i]
            cells = line.split("|")
            at = start + len(cells[0]) + 1
            inner = cells[1:-1] if line.rstrip().endswith("|") else cells[1:]  # (a row may leave out its last pipe)
            for column, cell in enumerate(inner):
                number = re.fullmatch(r"\s*(?:\*\*)?([+\-−]?\d[\d,]*(?:\.\d+)?)(?:\*\*)?\s*", cell)
                if number and column < len(units) and units[column]:
                    printed = number.group(1)
                    decimals = len(printed.split(".")[1]) if "." in printed else 0
                    begin = at + number.start(1)
                    out.append(Figure(begin, begin + len(printed), printed, decimals, True,
                                      units[column].group(0) == "%"))
                at += len(cell) + 1
            i += 1
    return out


def to_float(printed: str) -> float:
    return float(printed.replace(",", "").replace("−", "-"))


def load_json(file: str):
    return json.loads((ROOT / file).read_text())


def split_spec(spec: str) -> tuple[str, str, list[str]]:
    """A mark's file, its dotted key and its options (`scale=K`, `abs`: the words at its end; a key may hold spaces:
    "compile on", "64 symbols, cohort 64")."""
    words = spec.split()
    options = []
    while len(words) > 1 and (words[-1] == "abs" or words[-1].startswith("scale=")):
        options.insert(0, words.pop())
    file, _, path = " ".join(words).partition("#")
    return file, path, options


def table_starts(lines: list[str], i: int) -> bool:
    """Whether line i is a table's header: a row of cells over a separator row."""
    return (lines[i].lstrip().startswith("|") and i + 1 < len(lines)
            and re.fullmatch(r"\s*\|[\s:|-]*-[\s:|-]*", lines[i + 1]) is not None)


def resolve(spec: str, load: Callable = load_json) -> tuple[float | None, dict, str | None]:
    """The one number a claim names, its options, or why it names none."""
    file, path, options = split_spec(spec)
    target = " ".join(spec.split()[:len(spec.split()) - len(options)])  # the mark as written, options left out
    if not path:
        return None, {}, f"{target} names no key: a claim names one number (FILE.json#dotted.key)"
    try:
        node = load(file)
    except OSError:
        return None, {}, f"{file} does not exist"
    except ValueError as exc:
        return None, {}, f"{file} is not JSON ({exc})"
    for key in path.split("."):
        if isinstance(node, list) and key.lstrip("-").isdigit():
            if not -len(node) <= int(key) < len(node):
                return None, {}, f"{file}#{path}: no item {key}"
            node = node[int(key)]
        elif isinstance(node, dict) and key in node:
            node = node[key]
        else:
            return None, {}, f"{file}#{path}: no key {key!r}"
    if isinstance(node, (dict, list)):
        return None, {}, f"{file}#{path} is {'an object' if isinstance(node, dict) else 'a list'}: name one number"
    if isinstance(node, bool) or not isinstance(node, (int, float)) or not math.isfinite(node):
        return None, {}, f"{file}#{path} is {node!r}, not a finite number"
    parsed: dict = {"scale": None, "abs": False}
    for option in options:
        if option.startswith("scale="):
            try:
                parsed["scale"] = float(option[6:])
            except ValueError:
                return None, {}, f"bad option {option!r}"
            if not math.isfinite(parsed["scale"]) or parsed["scale"] <= 0:
                return None, {}, f"bad option {option!r}: a scale is a finite number > 0"
        elif option == "abs":
            parsed["abs"] = True
        else:
            return None, {}, f"unknown option {option!r}"
    return float(node), parsed, None


def equal_as_printed(figure: Figure, value: float, options: dict) -> bool:
    """Whether the leaf, scaled, prints as the figure does at the figure's precision."""
    x = to_float(figure.printed)
    if options["scale"] is not None:
        candidates = [value * options["scale"]]
    elif figure.percent:  # a fraction printed x 100 (a leaf that is a percent already says scale=1)
        candidates = [value * 100]
    else:
        candidates = [value]
    for c in candidates:
        if options["abs"]:
            c, y = abs(c), abs(x)
        else:
            y = x
        if figure.decimals is None:
            digits = len(figure.printed.lower().partition("e")[0].partition(".")[2])
            if f"{c:.{digits}e}" == f"{y:.{digits}e}":
                return True
        elif f"{c:.{figure.decimals}f}" == f"{y:.{figure.decimals}f}" or (y == 0 and abs(c) < 0.5 * 10 ** -figure.decimals):
            return True
    return False


def spans(text: str) -> tuple[list[Figure], list[tuple[str, str, int, list[Figure]]]]:
    """The page's numbers, and each mark with the numbers of its span: (kind, spec, line, numbers before it after
    the previous mark, within its paragraph, list item or table row)."""
    clean = prose(text)
    bare = MARK.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), clean)
    figures = numbers_in(bare)
    boundaries = [m.start() for m in ROW_BOUNDARY.finditer(clean)]
    starts = [f.pos for f in figures]
    newlines = [i for i, c in enumerate(clean) if c == "\n"]
    marks = []
    previous = 0
    for mark in MARK.finditer(clean):
        before = bisect.bisect_left(boundaries, mark.start())
        start = max(previous, boundaries[before - 1] if before else 0)
        previous = mark.end()
        mine = figures[bisect.bisect_left(starts, start):bisect.bisect_left(starts, mark.start())]
        marks.append((mark.group(1), mark.group(2), bisect.bisect_left(newlines, mark.start()) + 1, mine))
    return figures, marks


def ties(text: str) -> list[tuple[Figure, str, int]]:
    """Each claim mark with the figure it ties to (the last number of its span) and its line."""
    return [(mine[-1], spec, line) for kind, spec, line, mine in spans(text)[1] if kind == "claim" and mine]


def check(text: str, load: Callable = load_json) -> list[str]:
    """Every problem with the figures of one page."""
    figures, marks = spans(text)
    problems = [f"line {text.count(chr(10), 0, m.start()) + 1}: {m.group(0)[:40]!r} looks like a mark but is not one "
                "(`<!-- claim: ... -->` or `<!-- external: ... -->`, lower case)"
                for m in re.finditer(r"<!--\s*(?:claims?|externals?)\b(?!:)|<!--\s*(?i:claim|external)(?<!claim)(?<!external):",
                                     text)]
    read: dict = {}

    def once(file: str):  # each JSON parsed once a check (a page cites one file many times)
        if file not in read:
            try:
                read[file] = (load(file), None)
            except (OSError, ValueError) as exc:
                read[file] = (None, exc)
        value, exc = read[file]
        if exc is not None:
            raise exc
        return value

    covered: set[int] = set()
    for kind, spec, line, mine in marks:
        if kind == "external":
            if not spec or NOT_EXTERNAL.search(spec):
                problems.append(f"line {line}: external {spec!r}: an external figure names a source outside this "
                                "repository; a figure measured here is a claim on its JSON")
            covered |= {f.pos for f in mine[-1:]}  # one figure, as a claim (a measured one beside it needs its own)
            continue
        value, options, problem = resolve(spec, once)
        if problem:
            problems.append(f"line {line}: claim {spec}: {problem}")
            covered |= {f.pos for f in mine[-1:]}
            continue
        if not mine:
            problems.append(f"line {line}: claim {spec} follows no number")
            continue
        figure = mine[-1]
        covered.add(figure.pos)
        if not equal_as_printed(figure, value, options):
            problems.append(f"line {line}: {figure.printed} is not {spec} ({value!r}) at its printed precision")
    text_before = prose(text)
    for figure in figures:
        if figure.measured and figure.pos not in covered:
            problems.append(f"line {text_before.count(chr(10), 0, figure.pos) + 1}: {figure.printed} has no claim or "
                            "external mark")
    return problems


def column_outliers(text: str, load: Callable = load_json) -> list[str]:
    """Marks of a table that name another measurement than their column does, though the number prints the same:
    where most of a column's marks end in one key (`....persistence.rank_ic`) and the key that row's other marks
    lead to with that ending exists and prints as the figure does, a mark ending otherwise (`....lightgbm.ic`) is
    a tie to the wrong number that merely equals it (the migration to one mark a figure made 44 such)."""
    problems = []
    lines = text.split("\n")
    claim = re.compile(r"<!--\s*claim:\s*(.*?)\s*-->")

    def parts(spec: str) -> tuple[str, list[str], list[str]]:
        file, path, options = split_spec(spec)
        return file, path.split("."), options

    i = 0
    while i < len(lines):
        if not table_starts(lines, i):
            i += 1
            continue
        rows, j = [], i + 2
        while j < len(lines) and lines[j].lstrip().startswith("|"):
            row = {}
            for c, cell in enumerate(lines[j].split("|")[1:]):
                for k, m in enumerate(claim.finditer(cell)):
                    row[(c, k)] = (m.group(1), cell[:m.start()])
            rows.append((j, row))
            j += 1
        for number, row in rows:
            for column, (spec, before) in row.items():
                file, path, options = parts(spec)
                mates = [parts(r[column][0])[1] for _, r in rows if column in r and parts(r[column][0])[0] == file]
                others = [parts(v[0])[1] for c, v in row.items() if c != column and parts(v[0])[0] == file]
                if len(mates) < 3 or not others:
                    continue
                tails = {}
                for mate in mates:
                    tails[mate[-1]] = tails.get(mate[-1], 0) + 1
                tail, count = max(tails.items(), key=lambda kv: kv[1])
                if count * 2 <= len(mates) or path[-1] == tail:
                    continue
                length = max(len(m) for m in mates if m[-1] == tail)
                prefixes = {}
                for other in others:
                    if len(other) >= length - 1:
                        prefixes[tuple(other[:length - 2])] = prefixes.get(tuple(other[:length - 2]), 0) + 1
                if not prefixes:
                    continue
                prefix = max(prefixes.items(), key=lambda kv: kv[1])[0]
                mate_middles = {m[length - 2] for m in mates if m[-1] == tail and len(m) == length}
                figures = numbers_in(MARK.sub(lambda x: " " * len(x.group(0)), before))
                for middle in sorted(mate_middles | {path[-2]} if len(path) >= 2 else mate_middles):
                    candidate = [*prefix, middle, tail][:length]
                    value, opts, problem = resolve(f"{file}#{'.'.join(candidate)} {' '.join(options)}".strip(), load)
                    if problem is None and figures and equal_as_printed(figures[-1], value, opts) \
                            and candidate != path:
                        problems.append(f"line {number + 1}: {spec} ends in {path[-1]!r} where its column's marks "
                                        f"end in {tail!r}; {'.'.join(candidate)} prints the same")
                        break
        i = j
    return problems


def provenance_gaps(record) -> list[str]:
    """What a cited JSON does not record of where and on what code it ran: the device, torch's version, the commit.
    Read where each benchmark writes them (bench/record.py's fields; a results.json's `run`; a merged GPU session's
    `session`; a CPU machine's record with no GPU driver is its CPU). A file of several runs answers for each."""
    if isinstance(record, dict) and record.get("benchmark") == "runs":
        runs = record.get("runs")
        if not isinstance(runs, list) or not runs:
            return ["device", "torch", "commit"]  # a file of runs that holds none says nothing
        return sorted({gap for run in runs for gap in provenance_gaps(run)})
    if not isinstance(record, dict):
        return ["device", "torch", "commit"]
    get = lambda key: record.get(key) if isinstance(record.get(key), dict) else {}  # noqa: E731
    run, session, training, machine = get("run"), get("session"), get("training"), get("machine")
    named = record.get("device") if record.get("device") not in (None, "auto", "cpu", "cuda", "x86_64") else None
    versions = get("versions") or (run.get("versions") or {})
    # a CPU run: the machine it recorded has no GPU driver, or its torch is a CPU build (no CUDA)
    image = get("image").get("versions")  # the Docker smokes: the torch inside the image ("torch 2.13.0+cpu ...")
    no_gpu = machine.get("gpu_driver") is None and ("cuda" in versions and versions["cuda"] is None
                                                   or "+cpu" in str(versions.get("torch", "")) or "gpu_driver" in machine
                                                   or get("cuda").get("cuda_available") is False
                                                   or "+cpu" in str(image))
    cpu = f"CPU ({machine.get('processor') or machine.get('arch')})" if no_gpu and (
        machine.get("processor") or machine.get("arch")) else None
    device = record.get("device_name") or named or training.get("device_name") or session.get("device_name") or cpu
    torch = (versions.get("torch") or record.get("torch") or get("cuda").get("torch") or session.get("torch")
             or (image if isinstance(image, str) and "torch" in image else None))
    # the tree that ran, where its session said (the device's copy recorded another commit four times), else the
    # commit the benchmark recorded; a commit is hexadecimal ("unknown", an image built without GIT_COMMIT, is none)
    commit = session.get("tree_measured") or record.get("git_commit") or run.get("git_commit")
    commit = commit if isinstance(commit, str) and re.fullmatch(r"[0-9a-f]{7,40}", commit) else None
    torch = torch if isinstance(torch, str) and torch not in ("unknown", "") else None
    return [name for name, value in (("device", device), ("torch", torch), ("commit", commit)) if not value]


def cited_files() -> dict[str, list[str]]:
    """Every JSON a claim on a page cites, with the pages citing it."""
    files: dict[str, list[str]] = {}
    for page in pages():
        for _figure, spec, _line in ties((ROOT / page).read_text()):
            files.setdefault(spec.split("#")[0], []).append(page)
    return files


def main(argv: list[str]) -> int:
    bad = 0
    for page in argv or pages():
        problems = check((ROOT / page).read_text())
        bad += len(problems)
        for problem in problems:
            print(f"{page}: {problem}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
