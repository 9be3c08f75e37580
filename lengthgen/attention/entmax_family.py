"""The α-entmax family: backends whose normalizer is α-entmax (exact zeros, focused attention).

Every one of them runs through ``lengthgen.kernels.entmax_attention``, the single seam where the
fused CPU kernel, the chunked exact path and the Triton kernel are chosen; a query scale, if any,
is folded into q before the call.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from lengthgen.attention.backend import AttentionBackend, AttentionStats, BackendOptions


class EntmaxOptions(BackendOptions):
    alpha: float = Field(1.5, gt=1.0, le=2.0, description="entmax α (2 = sparsemax, →1 = softmax)")


class EntmaxFamilyBackend(AttentionBackend):
    """α-entmax normalizer; subclasses add a query scale."""

    Options = EntmaxOptions
    options: EntmaxOptions

    @property
    def alpha(self) -> float:
        return self.options.alpha

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        from lengthgen.attention.entmax import entmax

        return entmax(scores, alpha=self.alpha, dim=-1)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        slopes: torch.Tensor | None,
        stats: AttentionStats | None,
    ) -> torch.Tensor:
        from lengthgen.kernels import entmax_attention

        result = entmax_attention(
            q, k, v,
            alpha=self.alpha,
            causal=True,
            alibi_slopes=slopes,
            scale=1.0 / math.sqrt(q.shape[-1]),
            q_positions=q_pos,
            return_stats=stats is not None,
        )
        if stats is None:
            return result
        out, diag = result
        stats.add(self.spec.layer_index, diag["entropy"], diag["support"])
        return out
