"""The process setup shared by the validation entry points: the CLI and the child worker it
starts for each chunk of units. A leaf module, so that cli.py and worker.py both import it
and not each other."""
from __future__ import annotations

import warnings

from .. import workloads


def quiet() -> None:
    """Offline (workloads.offline: the sweeps build every model from its config, with random
    weights), and no warnings: a sweep runs thousands of samples, and the deprecation
    warnings of torch and HF would bury its progress and results."""
    workloads.offline()
    warnings.filterwarnings("ignore")
