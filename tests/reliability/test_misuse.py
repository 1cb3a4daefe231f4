"""The misuse catalogue (tests/reliability/misuse_catalogue.py) as tests: one per case and eager mode.

The cases of a mode run together in one subprocess (plus one per group of cases that
needs its own, such as fork), started once for all the selected tests of that mode; each
test reads its case's result line. The PENDING cases are strict xfails: a fix makes the
test fail until its entry is removed and the table regenerated (`--write`).
"""
from __future__ import annotations

import os

import misuse_catalogue as catalogue
import pytest
from helpers import misuse

DOC = os.path.join(misuse.ROOT, "docs", "RELIABILITY.md")


def _params():
    for mode in misuse.MODES:
        for name in misuse.CASES:
            reason = misuse.pending_reason(catalogue.PENDING, name, mode)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(name, mode, marks=marks, id=f"{name}-{mode}")


@pytest.fixture(scope="module")
def results(request):
    """mode -> {case: result}, each mode's processes started once, for the cases of the
    tests selected in this session (all of them for the document test)."""
    selected = {}
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is request.module:
            if "name" in params:
                selected.setdefault(params["mode"], set()).add(params["name"])
            elif item.originalname == "test_table_is_current":
                for mode in misuse.MODES:
                    selected[mode] = set(misuse.CASES)
    cache = {}

    def get(mode):
        if mode not in cache:
            names = [n for n in misuse.CASES if n in selected.get(mode, misuse.CASES)]
            cache[mode] = misuse.collect(mode, catalogue.__file__, names)[0]
        return cache[mode]
    return get


@pytest.mark.slow  # the catalogue takes about a minute per mode on 2 cores
@pytest.mark.parametrize("name, mode", list(_params()))
def test_case(results, name, mode):
    r = results(mode)[name]
    assert r["verdict"] == "pass", (
        f"{name} in {mode}: expected {r['expected']}, observed {r['observed']}: {r['why']}")


def _rows(text):
    """(case, mode) -> the row's cells, from the document's table."""
    body = text[text.index(misuse.TABLE_BEGIN):text.index(misuse.TABLE_END)]
    rows = {}
    for line in body.splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        rows[(cells[0].strip("`"), cells[2])] = cells
    return rows


@pytest.mark.slow
def test_table_is_current(results):
    """Regenerating gives the same table: every case and mode, with the same expectation
    and verdict. The expected and observed columns are left out of the comparison: they
    quote messages that their owners may reword, and values that vary from run to run
    (the threads case sums in whatever order the threads ran), without changing what a
    user sees happen."""
    fresh = _rows(misuse.TABLE_BEGIN + "\n" + misuse.table(
        {m: results(m) for m in misuse.MODES}, catalogue.PENDING) + "\n" + misuse.TABLE_END)
    with open(DOC) as f:
        written = _rows(f.read())
    assert set(written) == set(fresh), "docs/RELIABILITY.md: run python tests/reliability/misuse_catalogue.py --write"
    stale = [f"{k}: {written[k]} != {fresh[k]}" for k in fresh
             if [c for i, c in enumerate(written[k]) if i not in (4, 5)]
             != [c for i, c in enumerate(fresh[k]) if i not in (4, 5)]]
    assert not stale, "docs/RELIABILITY.md is stale (--write):\n" + "\n".join(stale[:10])


def test_the_catalogue_covers_issue_16():
    """At least 60 cases, every item of issue 16 but the distributed one (11: multi-process,
    tests/distributed/test_distributed_faults.py), PENDING naming real cases and modes, and every case
    and mode in the document's table."""
    assert len(misuse.CASES) >= 60
    assert {str(i) for i in range(1, 11)} <= {c.item for c in misuse.CASES.values()}
    for key in catalogue.PENDING:
        name, _, mode = key.partition("@")
        assert name in misuse.CASES and mode in ("", *misuse.MODES), f"PENDING: {key}"
    with open(DOC) as f:
        rows = _rows(f.read())
    missing = sorted({(n, m) for n in misuse.CASES for m in misuse.MODES} - set(rows))
    assert not missing, f"docs/RELIABILITY.md lacks {missing[:5]}: run python tests/reliability/misuse_catalogue.py --write"
