"""From a task batch to what the model needs: inputs, scored rows, targets, and the metrics.

Only the rows whose next-token prediction is scored (the union of the loss masks over the batch)
are computed by the last layer. Exact match by teacher forcing: every scored prediction right
given the true prefix ⇔ greedy decoding reproduces the target (see ``docs/design.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lengthgen.tasks.base import TaskBatch


@dataclass(frozen=True)
class ModelBatch:
    input_ids: torch.Tensor  # (B, T)
    query_positions: torch.Tensor  # (Nq,) rows the last layer computes
    targets: torch.Tensor  # (B, Nq) the next tokens at those rows
    mask: torch.Tensor  # (B, Nq) bool: scored for this sample

    @classmethod
    def from_task(cls, batch: TaskBatch, device: torch.device | str) -> ModelBatch:
        ids = batch.input_ids
        rows = np.flatnonzero(batch.loss_mask.any(axis=0))
        return cls(
            input_ids=torch.from_numpy(ids).to(device),
            query_positions=torch.from_numpy(rows).to(device),
            targets=torch.from_numpy(ids[:, rows + 1]).to(device),
            mask=torch.from_numpy(batch.loss_mask[:, rows]).to(device),
        )


def masked_loss(logits: torch.Tensor, batch: ModelBatch) -> torch.Tensor:
    """Mean cross-entropy over the scored positions only."""
    losses = F.cross_entropy(logits.float().transpose(1, 2), batch.targets, reduction="none")
    mask = batch.mask.float()
    return (losses * mask).sum() / mask.sum().clamp_min(1.0)


@dataclass(frozen=True)
class BatchScore:
    exact: np.ndarray  # (B,) bool: every scored prediction right
    tokens_right: int
    tokens_scored: int


def score(logits: torch.Tensor, batch: ModelBatch) -> BatchScore:
    right = (logits.argmax(-1) == batch.targets) | ~batch.mask
    exact = right.all(dim=1).cpu().numpy()
    tokens_right = int((right & batch.mask).sum())
    return BatchScore(exact=exact, tokens_right=tokens_right, tokens_scored=int(batch.mask.sum()))
