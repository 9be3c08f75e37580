"""ReLU² attention: weights ∝ relu(z − max z + m)², renormalized per row.

Keys scoring more than the margin m below the row's best key get exactly zero weight, so, unlike
softmax, far-away low-scoring keys cannot accumulate mass as the sequence grows; the best key
always has weight m² > 0, so every row is well defined. The normalizer is all a backend needs:
masking, position schemes, the chunked long-evaluation path and the diagnostics come for free.
"""

from __future__ import annotations

import torch
from lengthgen.api import AttentionBackend, BackendOptions
from pydantic import Field


class ReLU2Options(BackendOptions):
    margin: float = Field(1.0, gt=0.0, description="keys more than this below the row max get weight 0")


class ReLU2Attention(AttentionBackend):
    name = "relu2"
    description = "ReLU² attention: relu(z − max z + margin)², renormalized (exact zeros; plugin example)"
    Options = ReLU2Options
    options: ReLU2Options

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        z = scores.float()
        top = z.amax(dim=-1, keepdim=True)  # finite: every row sees at least its own key
        weights = torch.relu(z - top + self.options.margin).square()  # masked keys (−inf) → 0
        return (weights / weights.sum(dim=-1, keepdim=True)).to(scores.dtype)
