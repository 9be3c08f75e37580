"""The baselines' tests: tiny tensors, so one thread (a second only adds overhead on a shared CPU, as in
lengthgen's own tests/conftest.py); skipped where lengthgen-baselines is not installed
(``pip install -e baselines``)."""

from __future__ import annotations

import importlib.util

import torch

if importlib.util.find_spec("lengthgen_baselines") is None:
    collect_ignore_glob = ["test_*.py"]

torch.set_num_threads(1)
