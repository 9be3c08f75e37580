"""The α-entmax family: fixed-α entmax, sparsemax (α = 2) and ASEntmax (a learned, length-aware
query scale s = δ + β(log n)^γ). Exact zeros, focused attention.

The engine (``lengthgen.kernels.engine``) runs them on the fused CPU kernel, the Triton kernel on
CUDA or the chunked exact path; a query scale, if any, is folded into q before the call.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from lengthgen.attention import register_attention
from lengthgen.attention.backend import AttentionBackend, BackendOptions, LayerSpec
from lengthgen.functional.entmax import entmax
from lengthgen.functional.scales import AdaptiveScale
from lengthgen.kernels import normalizers


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
        return entmax(scores, alpha=self.alpha, dim=-1)

    def normalizer(self) -> normalizers.Normalizer:
        return normalizers.Entmax(self.alpha)


@register_attention()
class Entmax(EntmaxFamilyBackend):
    name = "entmax"
    description = "α-entmax attention (default α = 1.5): exact zeros, no length-aware scale"


class SparsemaxOptions(EntmaxOptions):
    alpha: float = Field(2.0, ge=2.0, le=2.0, description="fixed at 2 (sparsemax)")


@register_attention()
class Sparsemax(EntmaxFamilyBackend):
    name = "sparsemax"
    description = "sparsemax attention (α-entmax with α = 2)"
    Options = SparsemaxOptions


class ASEntmaxOptions(EntmaxOptions):
    LATE = ("init", "length_cap")
    static: bool = Field(False, description="learn β, γ per head instead of from the layer input")
    beta_init: float = Field(0.05, gt=0.0, description="initial β (s = 1 + β at step 0)")
    delta: float = Field(1.0, description="offset δ of the scale")
    init: Literal["near_one", "paper"] = Field(
        "near_one", description="scale projections: near_one (s = 1 + beta_init at step 0) or paper "
                                "(the paper code's N(0, 0.02) weights, an ablation)")
    length_cap: int | None = Field(None, ge=2, description="hold n at this many keys beyond it (an ablation "
                                                           "of the scale's growth; default: no cap)")


@register_attention()
class ASEntmax(EntmaxFamilyBackend):
    """Adaptive-Scalable Entmax: α-entmax with a learned length-aware scale δ + β(log n)^γ."""

    name = "asentmax"
    description = "Adaptive-Scalable Entmax: α-entmax with a learned length-aware scale δ + β(log n)^γ"
    Options = ASEntmaxOptions
    options: ASEntmaxOptions

    def __init__(self, spec: LayerSpec, options: ASEntmaxOptions | None = None) -> None:
        super().__init__(spec, options)
        self.scale = AdaptiveScale(
            spec.d_model, spec.n_heads, delta=self.options.delta, beta_init=self.options.beta_init,
            static=self.options.static, init=self.options.init, length_cap=self.options.length_cap,
        )

    def query_scale(self, x: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        return self.scale(x, q_pos, self.scaled_heads)

