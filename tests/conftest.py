import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_tpu  # noqa: E402,F401


@pytest.fixture
def tpu():
    return torch.device("tpu")


# ---------------------------------------------------------------- the eager-mode matrix
EAGER_MODES = {"strict": "strict", "defer": "defer_and_fuse"}
_CALL_PASSED = pytest.StashKey[bool]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if call.when == "call":
        item.stash[_CALL_PASSED] = report.passed
    return report


@pytest.fixture(params=list(EAGER_MODES))
def eager(request):
    """Runs the test in each eager mode on this thread: `strict`, and `defer`
    (DeferAndFuse: the ops are recorded, in C, and run at the test's sync points such as
    `.cpu()` and `.item()`, or when the block ends). Tests that sweep dtypes parametrize it
    themselves (tests/helpers/mode_matrix.py), with one dtype per op in `defer`. A passing
    `defer` run must have run no op in Strict, and flushed what it recorded (an op of
    data-dependent shape runs at once; a test that only uploads records nothing, as an
    upload with nothing pending goes at once), or the matrix would silently run Strict
    twice."""
    from torch_tpu import metrics

    before = metrics.counters.copy()
    with torch_tpu.eager_mode(EAGER_MODES[request.param]):
        yield request.param
    if request.param == "defer" and request.node.stash.get(_CALL_PASSED, False):
        grew = metrics.counters - before
        flushed = any(k.startswith("flush.") for k in grew) or grew["defer.ran_at_once"]
        recorded = grew["dispatches.defer_and_fuse"]
        assert not grew["dispatches.strict"] and (flushed or not recorded), (
            f"DeferAndFuse did not defer this test's ops: {dict(grew)}")


# ---------------------------------------------------------------- slow / distributed
# pyproject.toml registers both marks; `bash scripts/test.sh --fast` leaves them out. Tests
# carry them as decorators (or a module's `pytestmark`); tests/distributed/conftest.py marks
# that whole folder.


def _sample_the_matrices(items) -> None:
    """--fast samples the two test matrices (CI runs them whole): the eager-mode matrix
    (the `eager` fixture) in DeferAndFuse only, which runs each op's lowering and also its
    C recording path (Strict runs in the other --fast tests); and a test parametrized over
    torch dtypes at one dtype per case (float32 where it has it, else its first), so every
    op still runs. Together about 2/3 of the op-family tests' time."""
    kept = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("eager") == "strict":
            item.add_marker("slow")
        dtype = params.get("dtype")
        if not isinstance(dtype, torch.dtype):
            continue
        # the same test with the same other arguments (parametrize reuses the objects)
        key = (item.path, item.originalname,
               tuple(sorted((k, id(v)) for k, v in params.items() if k != "dtype")))
        first = kept.get(key)
        if first is None or (dtype == torch.float32 and first[1] != torch.float32):
            kept[key] = (item, dtype)
    keep = {id(item) for item, _ in kept.values()}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if isinstance(params.get("dtype"), torch.dtype) and id(item) not in keep:
            item.add_marker("slow")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(config, items):
    _sample_the_matrices(items)
