"""The claims guard's own mutants (issue 66): on every committed page, each figure a claim ties to is changed in
its last digit, each pair of neighbouring figures is swapped, and each mark's key is deleted from its JSON (in
memory). Every one of them must turn the guard red; a figure whose change the guard lets through is named.

Pure text and JSON: no subprocess, so the whole set runs in seconds."""

from __future__ import annotations

import copy
import functools
import json
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import claims  # noqa: E402

PAGES = claims.pages()


@functools.lru_cache(maxsize=None)
def cached(file: str):
    """A JSON read once (the guard only reads what it is given; the key mutant copies the one file it edits)."""
    return json.loads((ROOT / file).read_text())


def last_digit_changed(printed: str) -> str:
    i = max(i for i, c in enumerate(printed) if c.isdigit() and not printed[:i].lower().endswith("e")
            and "e" not in printed[:i].lower() or c.isdigit() and "e" not in printed.lower())
    digit = printed[i]
    return printed[:i] + ("8" if digit == "9" else str(int(digit) + 1)) + printed[i + 1:]


def test_the_digit_mutation_changes_the_last_printed_digit():
    assert last_digit_changed("3,916") == "3,917" and last_digit_changed("0.59") == "0.58"
    assert last_digit_changed("3.0e-08") == "3.1e-08" and last_digit_changed("90501") == "90502"


@pytest.mark.parametrize("page", PAGES)
def test_a_figure_changed_in_its_last_digit_turns_the_guard_red(page):
    text = (ROOT / page).read_text()
    assert claims.check(text, cached) == []
    missed = []
    for figure, spec, line in claims.ties(text):
        mutated = text[:figure.pos] + last_digit_changed(figure.printed) + text[figure.pos + len(figure.printed):]
        if not claims.check(mutated, cached):
            missed.append(f"line {line}: {figure.printed} -> {last_digit_changed(figure.printed)} ({spec})")
    assert not missed, f"{page}: {len(missed)} figure(s) the guard lets change:\n" + "\n".join(missed[:30])


@pytest.mark.parametrize("page", PAGES)
def test_two_neighbouring_figures_swapped_turn_the_guard_red(page):
    text = (ROOT / page).read_text()
    tied = claims.ties(text)
    missed = []
    for (a, spec_a, line), (b, spec_b, _) in zip(tied, tied[1:]):
        coarser = min(d for d in (a.decimals, b.decimals, 6) if d is not None)
        if round(claims.to_float(a.printed), coarser) == round(claims.to_float(b.printed), coarser):
            continue  # one number twice (5.21 and its 5.2): a swap changes nothing
        mutated = (text[:a.pos] + b.printed + text[a.pos + len(a.printed):b.pos] + a.printed
                   + text[b.pos + len(b.printed):])
        if not claims.check(mutated, cached):
            missed.append(f"line {line}: {a.printed} <-> {b.printed} ({spec_a}, {spec_b})")
    assert not missed, f"{page}: {len(missed)} swap(s) the guard lets through:\n" + "\n".join(missed[:30])


@pytest.mark.parametrize("page", PAGES)
def test_a_marks_key_deleted_from_its_json_turns_the_guard_red(page):
    text = (ROOT / page).read_text()
    missed = []
    for _figure, spec, line in claims.ties(text):
        file, path, _options = claims.split_spec(spec)
        *parents, key = path.split(".")

        def without(name: str, file=file, parents=parents, key=key):
            record = copy.deepcopy(cached(name))
            if name == file:
                node = record
                for part in parents:
                    node = node[int(part)] if isinstance(node, list) else node[part]
                if isinstance(node, list):
                    node[int(key)] = None  # (a pop would shift the next item into its place)
                else:
                    del node[key]
            return record

        if not claims.check(text, without):
            missed.append(f"line {line}: {spec}")
    assert not missed, f"{page}: {len(missed)} deleted key(s) the guard does not notice:\n" + "\n".join(missed[:30])
