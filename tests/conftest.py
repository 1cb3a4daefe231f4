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
    `.cpu()` and `.item()`). Tests that sweep dtypes parametrize it themselves (indirect)
    with one dtype per op in `defer`. A passing `defer` run must have recorded ops, run
    none in Strict and flushed at a sync point of its own, or the matrix would silently
    run Strict twice."""
    from torch_tpu import metrics

    before = metrics.counters.copy()
    with torch_tpu.eager_mode(EAGER_MODES[request.param]):
        yield request.param
    if request.param == "defer" and request.node.stash.get(_CALL_PASSED, False):
        grew = metrics.counters - before
        syncs = {k: n for k, n in grew.items() if k.startswith("flush.") and k != "flush.mode_change"}
        assert grew["dispatches.defer_and_fuse"] and not grew["dispatches.strict"] and syncs, (
            f"DeferAndFuse did not defer this test's ops: {dict(grew)}")
