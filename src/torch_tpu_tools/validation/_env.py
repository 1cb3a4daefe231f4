"""The process setup shared by the validation entry points: the CLI and the child worker it
starts for each chunk of units. A leaf module, so that cli.py and worker.py both import it
and not each other."""
from __future__ import annotations

import os
import warnings


def offline() -> None:
    """transformers and huggingface_hub never reach the network: the sweeps build every
    model from its config, with random weights."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def quiet() -> None:
    """offline(), and no warnings: a sweep runs thousands of samples, and the deprecation
    warnings of torch and HF would bury its progress and results."""
    offline()
    warnings.filterwarnings("ignore")
