"""The eager-mode matrix of the op tests: which (op, dtype) cases run in which mode.

The `eager` fixture (tests/conftest.py) runs a test in Strict (`strict`) and in DeferAndFuse
(`defer`), where the ops are recorded by the C recording path (csrc/scan.cpp, graph.cpp)
and run at the test's sync points. A test that takes `eager` runs in both. A test that
sweeps dtypes uses `parametrize` instead: Strict runs every dtype an op lists, DeferAndFuse
one dtype per op, taken in turn down the table, so that DeferAndFuse meets every op and,
across the table, every dtype, for a fraction of the time.
"""
import pytest


def cases(entries, marks=None):
    """entries: (name, args, dtypes) per op -> pytest params "eager, *args, dtype", with
    ids "mode-name-dtype" (as the fixture's own: "defer-..."); `marks` maps a name to its
    marks (both modes)."""
    params = []
    for i, (name, args, dtypes) in enumerate(entries):
        dtypes = list(dtypes)
        for mode, picked in (("strict", dtypes), ("defer", [dtypes[i % len(dtypes)]])):
            params += [pytest.param(mode, *args, dt, id=f"{mode}-{name}-{str(dt)[6:]}",
                                    marks=(marks or {}).get(name, ())) for dt in picked]
    return params


def parametrize(argnames, entries, marks=None):
    """`pytest.mark.parametrize` over "eager," + argnames (the last one the dtype) with
    `cases(entries, marks)`; the test takes `eager` first."""
    return pytest.mark.parametrize(f"eager,{argnames}", cases(entries, marks),
                                   indirect=["eager"])
