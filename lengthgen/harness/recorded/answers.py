"""Accuracy by answer position: where in its answer a trained model starts to go wrong.

Why. Exact match says only that some prediction of a sample was wrong. A model that extrapolates
badly can fail everywhere (its attention dispersed) or only past the positions it was trained on
(it learned to locate tokens by absolute position); the two call for different explanations.
Scoring each prediction by its index within its sample's answer tells them apart. The predictions
are the evaluation's own (the same test set, one teacher-forced pass, ``harness/evaluate.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lengthgen.harness.evaluate import TEST_SEED, test_batches
from lengthgen.harness.recorded.saved import open_trained
from lengthgen.model import Transformer
from lengthgen.registry import reading_data
from lengthgen.tasks.base import Task


@dataclass(frozen=True)
class PositionAccuracy:
    """Over a test set: ``right[k]`` predictions right and ``scored[k]`` predictions made at the
    k-th scored position of a sample's answer (k from 0)."""

    right: np.ndarray
    scored: np.ndarray

    def bins(self, count: int) -> list[tuple[int, int, float]]:
        """``count`` equal ranges of answer positions (1-based, inclusive): (first, last, accuracy)."""
        size = len(self.scored)
        edges = np.unique(np.linspace(0, size, min(count, size) + 1).round().astype(int))
        return [(int(lo) + 1, int(hi), float(self.right[lo:hi].sum() / max(1, self.scored[lo:hi].sum())))
                for lo, hi in zip(edges[:-1], edges[1:], strict=True)]


def answer_positions(mask: np.ndarray) -> np.ndarray:
    """For a (B, N) mask of scored predictions, the index of each within its own sample's answer
    (−1 where nothing is scored)."""
    return np.where(mask, np.cumsum(mask, axis=1) - 1, -1)


@torch.no_grad()
def accuracy_by_position(model: Transformer, task: Task, length: int, n_samples: int, batch_tokens: int,
                         device: torch.device) -> PositionAccuracy:
    """Score every answer position of ``n_samples`` test samples of ``length``."""
    model.eval()
    scored: list[np.ndarray] = []
    right: list[np.ndarray] = []
    for batch in test_batches(task, length, n_samples, batch_tokens, device):
        logits = model(batch.input_ids, batch.query_positions, None)
        hits = (logits.argmax(-1) == batch.targets).cpu().numpy()
        mask = batch.mask.cpu().numpy()
        index = answer_positions(mask)
        scored.append(index[mask])
        right.append(index[mask & hits])
    scored_counts = np.bincount(np.concatenate(scored))
    return PositionAccuracy(np.bincount(np.concatenate(right), minlength=len(scored_counts)), scored_counts)


@dataclass(frozen=True)
class RunProfile:
    """A run's accuracy by answer position at L·``factor``; ``trained_positions`` is the answer
    length at the longest training length, the last position training ever scored."""

    run_id: str
    length: int
    factor: int
    trained_positions: int
    accuracy: PositionAccuracy


@reading_data()  # names from the folder's config: data, as in open_trained
def profile_run(run_dir: Path, factor: int, n_samples: int, device: str | torch.device = "auto",
                task_params: Mapping[str, Any] | None = None, checkpoint: int | None = None) -> RunProfile:
    """Load the trained run in ``run_dir`` (its selected weights, or those kept after ``checkpoint``
    steps) and score its answers position by position at L·``factor``."""
    trained = open_trained(run_dir, factor, n_samples, device, task_params, checkpoint)
    config, task = trained.run.config, trained.task
    # what training scored: the run's own task, not the variant
    training_sample = trained.tasks.trained.sample(1, config.train.train_length, seed=TEST_SEED, split="eval")
    last = int(training_sample.loss_mask.sum())
    accuracy = accuracy_by_position(trained.model, task, trained.length, n_samples, config.eval.batch_tokens,
                                    trained.device)
    return RunProfile(trained.run.run_id, trained.length, factor, last, accuracy)
