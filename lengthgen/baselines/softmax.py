"""Plain softmax attention: the dispersing baseline."""

from __future__ import annotations

import torch

from lengthgen.attention import register_attention
from lengthgen.attention.backend import AttentionBackend


@register_attention()
class Softmax(AttentionBackend):
    name = "softmax"
    description = "standard softmax attention (disperses as length grows)"

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores.float(), dim=-1).to(scores.dtype)
