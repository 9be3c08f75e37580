"""Scalable-Softmax (Nakanishi): softmax of σ_h · log n · scores, σ_h learned per head."""

from __future__ import annotations

import torch

from lengthgen.attention import register_attention
from lengthgen.attention.backend import LayerSpec
from lengthgen.attention.scales import SSMaxScale
from lengthgen.baselines.softmax import Softmax


@register_attention()
class SSMax(Softmax):
    name = "ssmax"
    description = "Scalable-Softmax: softmax with a learned per-head scale σ·log n"

    def __init__(self, spec: LayerSpec, options=None) -> None:  # type: ignore[no-untyped-def]
        super().__init__(spec, options)
        self.scale = SSMaxScale(spec.n_heads)

    def query_scale(self, x: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        return self.scale(x, q_pos, self.scaled_heads)
