"""Every test of the distributed layer carries the `distributed` mark: most start a
multi-process job (torchrun or mp.spawn on 127.0.0.1), and the rest check the DTensor
internals those jobs rest on. `bash scripts/test.sh --fast` leaves them out; CI runs them."""
import pathlib

import pytest

_HERE = pathlib.Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items):
    # a conftest's collection hook sees every item of the session, not only this folder's
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.distributed)
