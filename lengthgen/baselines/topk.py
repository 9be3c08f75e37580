"""Top-k softmax: softmax over the k largest scores of each row (a hard-sparsity baseline)."""

from __future__ import annotations

import torch
from pydantic import Field

from lengthgen.attention import register_attention
from lengthgen.attention.backend import AttentionBackend, BackendOptions


class TopKOptions(BackendOptions):
    k: int = Field(8, ge=1, description="number of keys kept per row")


@register_attention()
class TopK(AttentionBackend):
    name = "topk"
    description = "softmax over the k highest-scoring keys of each row (default k = 8)"
    Options = TopKOptions
    options: TopKOptions

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        k = min(self.options.k, scores.shape[-1])
        kth = torch.topk(scores.float(), k, dim=-1).values[..., -1:]
        kept = scores.float().masked_fill(scores.float() < kth, float("-inf"))
        return torch.softmax(kept, dim=-1).to(scores.dtype)
