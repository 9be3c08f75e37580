"""What a plugin's own test file looks like: the generic backend suite plus a task sanity check."""

from __future__ import annotations

import numpy as np
from lengthgen.testing import check_backend

from lengthgen_example_plugin.parity import Parity
from lengthgen_example_plugin.relu2 import ReLU2Attention


def test_relu2_passes_the_backend_suite() -> None:
    check_backend(ReLU2Attention)
    check_backend(ReLU2Attention, margin=0.25)


def test_parity_targets_and_determinism() -> None:
    for running in (False, True):
        task = Parity(running=running)
        batch = task.sample(16, 9, seed=3)
        for bits, target in zip(batch.source, batch.target):
            want = list(np.cumsum(bits) % 2)
            assert target == (want if running else want[-1:])
        again = task.sample(16, 9, seed=3)
        assert np.array_equal(batch.input_ids, again.input_ids)
        assert batch.loss_mask.sum() == 16 * len(batch.target[0])
