"""The baselines' tests: tiny tensors, so one thread (a second only adds overhead on a shared CPU);
skipped where lengthgen-baselines is not installed (``pip install -e baselines``)."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest
import torch

if importlib.util.find_spec("lengthgen_baselines") is None:
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)
