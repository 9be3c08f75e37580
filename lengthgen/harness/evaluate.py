"""Evaluation at L·{1, 2, 4, …, max_factor} on a fixed test set per (task, length).

The test set is the task's ``eval`` stream with seed 0 — independent of the training seed, so
every model sees the same sequences (a paired comparison). Each sample is scored by one
teacher-forced forward pass; the attention diagnostics (normalized entropy, support size) are
collected on the same pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from lengthgen.attention.backend import AttentionStats
from lengthgen.config import EvalConfig
from lengthgen.harness.batches import ModelBatch, score
from lengthgen.harness.host_memory import reuse_freed_memory
from lengthgen.harness.storage.schema import wilson_interval
from lengthgen.model import Transformer
from lengthgen.progress import Shown, display
from lengthgen.tasks.base import Task

TEST_SEED = 0


@dataclass(frozen=True)
class LengthResult:
    eval_length: int
    factor: int
    n_samples: int
    exact_match: float
    exact_match_lo: float
    exact_match_hi: float
    token_accuracy: float
    attn_entropy: float
    attn_support: float
    eval_seconds: float


def sequence_tokens(task: Task, length: int) -> int:
    return int(task.sample(1, length, seed=TEST_SEED, split="eval").input_ids.shape[1])


def test_batches(task: Task, length: int, n: int, batch_tokens: int,
                 device: torch.device) -> Iterator[ModelBatch]:
    """The first ``n`` samples of the test set at ``length``, in batches of at most ``batch_tokens``
    tokens (one sample at least): what every score of a length is computed on."""
    per_batch = max(1, min(n, batch_tokens // sequence_tokens(task, length)))
    data = task.sample(n, length, seed=TEST_SEED, split="eval")
    for lo in range(0, n, per_batch):
        hi = min(n, lo + per_batch)
        yield ModelBatch.from_task(type(data)(data.input_ids[lo:hi], data.loss_mask[lo:hi], [], []), device)


@torch.no_grad()
def evaluate_length(
    model: Transformer, task: Task, length: int, factor: int, config: EvalConfig,
    device: torch.device, n_samples: int | None = None, progress: Shown = True,
) -> LengthResult:
    reuse_freed_memory()
    model.eval()
    tokens = sequence_tokens(task, length)
    n = n_samples if n_samples is not None else config.samples_at(tokens)
    stats = AttentionStats()
    exact = right = scored = 0
    start = time.perf_counter()
    bar = display(n, f"eval {length:>6} ({factor}x)", enabled=progress, unit="samples", live_only=True,
                  leave=False)
    for batch in test_batches(task, length, n, config.batch_tokens, device):
        result = score(model(batch.input_ids, batch.query_positions, stats), batch)
        exact += int(result.exact.sum())
        right += result.tokens_right
        scored += result.tokens_scored
        bar.update(len(result.exact))
    bar.close()
    lo_ci, hi_ci = wilson_interval(exact, n)
    return LengthResult(
        eval_length=length,
        factor=factor,
        n_samples=n,
        exact_match=exact / n,
        exact_match_lo=lo_ci,
        exact_match_hi=hi_ci,
        token_accuracy=right / max(1, scored),
        attn_entropy=stats.entropy,
        attn_support=stats.support,
        eval_seconds=time.perf_counter() - start,
    )
