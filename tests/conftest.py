import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import torch_tpu  # noqa: E402,F401


@pytest.fixture
def tpu():
    return torch.device("tpu")
