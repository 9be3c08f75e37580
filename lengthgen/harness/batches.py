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
    def from_task(cls, batch: TaskBatch, device: torch.device | str, pin: bool = False) -> ModelBatch:
        """The model's view of ``batch`` on ``device``; ``pin``: on the host in page-locked memory,
        so that :meth:`to` a GPU copies without blocking."""
        ids = batch.input_ids
        rows = np.flatnonzero(batch.loss_mask.any(axis=0))
        host = cls(
            input_ids=torch.from_numpy(ids),
            query_positions=torch.from_numpy(rows),
            targets=torch.from_numpy(ids[:, rows + 1]),
            mask=torch.from_numpy(batch.loss_mask[:, rows]),
        )
        if pin:
            host = cls(*(t.pin_memory() for t in host.tensors()))
        return host.to(device)

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.input_ids, self.query_positions, self.targets, self.mask

    def to(self, device: torch.device | str) -> ModelBatch:
        """On ``device``; from pinned host memory the copies are asynchronous (a no-op on the
        same device)."""
        return ModelBatch(*(t.to(device, non_blocking=t.is_pinned()) for t in self.tensors()))


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
