"""ASEntmax: α-entmax with a learned, length-aware query scale s = δ + β(log n)^γ (design.md §2)."""

from __future__ import annotations

import torch
from pydantic import Field

from lengthgen.attention import register_attention
from lengthgen.attention.backend import LayerSpec
from lengthgen.attention.entmax_family import EntmaxFamilyBackend, EntmaxOptions
from lengthgen.attention.scales import AdaptiveScale


class ASEntmaxOptions(EntmaxOptions):
    static: bool = Field(False, description="learn β, γ per head instead of from the layer input")
    beta_init: float = Field(0.05, gt=0.0, description="initial β (s = 1 + β at step 0)")
    delta: float = Field(1.0, description="offset δ of the scale")


@register_attention()
class ASEntmax(EntmaxFamilyBackend):
    name = "asentmax"
    description = "Adaptive-Scalable Entmax: α-entmax with a learned length-aware scale δ + β(log n)^γ"
    Options = ASEntmaxOptions
    options: ASEntmaxOptions

    def __init__(self, spec: LayerSpec, options: ASEntmaxOptions | None = None) -> None:
        super().__init__(spec, options)
        self.scale = AdaptiveScale(
            spec.d_model, spec.n_heads, delta=self.options.delta,
            beta_init=self.options.beta_init, static=self.options.static,
        )

    def query_scale(self, x: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        return self.scale(x, q_pos, self.scaled_heads)
