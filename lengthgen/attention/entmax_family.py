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
from lengthgen.attention.backend import (
    AttentionBackend,
    BackendOptions,
    LayerSpec,
    ScaledQueriesBackend,
    length_cap_field,
)
from lengthgen.functional.entmax import entmax
from lengthgen.functional.scales import AdaptiveScale
from lengthgen.kernels import normalizers


class EntmaxOptions(BackendOptions):
    alpha: float = Field(1.5, gt=1.0, le=2.0, description="entmax α (2 = sparsemax, →1 = softmax)")


class EntmaxFamilyBackend(AttentionBackend):
    """α-entmax normalizer; subclasses add a query scale."""

    Options = EntmaxOptions
    options: EntmaxOptions

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return entmax(scores, alpha=self.options.alpha, dim=-1)

    def normalizer(self) -> normalizers.Normalizer:
        return normalizers.Entmax(self.options.alpha)


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
    length_cap: int | None = length_cap_field()


@register_attention()
class ASEntmax(ScaledQueriesBackend, EntmaxFamilyBackend):
    """Adaptive-Scalable Entmax: α-entmax with a learned length-aware scale δ + β(log n)^γ."""

    name = "asentmax"
    description = "Adaptive-Scalable Entmax: α-entmax with a learned length-aware scale δ + β(log n)^γ"
    Options = ASEntmaxOptions
    options: ASEntmaxOptions

    def make_scale(self, spec: LayerSpec) -> AdaptiveScale:
        o = self.options
        return AdaptiveScale(spec.d_model, spec.n_heads, delta=o.delta, beta_init=o.beta_init,
                             static=o.static, init=o.init, length_cap=o.length_cap)

