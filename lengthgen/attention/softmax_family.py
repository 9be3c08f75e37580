"""The softmax family: softmax, Scalable-Softmax, adaptive-temperature softmax and top-k softmax.

Each backend names its normalizer (``lengthgen.kernels.normalizers``; the definitions are in
``lengthgen.functional.normalizers``) and perhaps a query scale; ``lengthgen.kernels.engine`` runs
it, on the fused softmax kernels where it can.
"""

from __future__ import annotations

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
from lengthgen.functional.scales import SSMaxScale
from lengthgen.kernels import normalizers


class SoftmaxFamilyBackend(AttentionBackend):
    """A backend whose ``normalizer`` the engine has fused kernels for; ``normalize`` is that
    normalizer's definition (``lengthgen.functional.normalizers``)."""

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return self.normalizer().probs(scores).to(scores.dtype)


@register_attention()
class Softmax(SoftmaxFamilyBackend):
    name = "softmax"
    description = "standard softmax attention (disperses as length grows)"

    def normalizer(self) -> normalizers.Normalizer:
        return normalizers.Softmax()


class SSMaxOptions(BackendOptions):
    LATE = ("length_cap",)
    length_cap: int | None = length_cap_field()


@register_attention()
class SSMax(ScaledQueriesBackend, Softmax):
    """Scalable-Softmax (Nakanishi): softmax of σ_h · log n · scores, σ_h learned per head."""

    name = "ssmax"
    description = "Scalable-Softmax: softmax with a learned per-head scale σ·log n"
    Options = SSMaxOptions
    options: SSMaxOptions

    def make_scale(self, spec: LayerSpec) -> SSMaxScale:
        return SSMaxScale(spec.n_heads, self.options.length_cap)


class AdaptiveTemperatureOptions(BackendOptions):
    apply_in_training: bool = Field(False, description="also sharpen during training (original: off)")


@register_attention()
class AdaptiveTemperature(SoftmaxFamilyBackend):
    """Softmax sharpened per row by θ(entropy) (``lengthgen.functional.temperature``).

    By default θ is applied at inference only, as in the original.
    """

    name = "adaptive_temperature"
    description = "softmax sharpened at inference by an entropy-dependent temperature (Veličković et al.)"
    Options = AdaptiveTemperatureOptions
    options: AdaptiveTemperatureOptions

    def normalizer(self) -> normalizers.Normalizer:
        if self.training and not self.options.apply_in_training:
            return normalizers.Softmax()
        return normalizers.AdaptiveTemperature()


class TopKOptions(BackendOptions):
    k: int = Field(8, ge=1, description="number of keys kept per row")


@register_attention()
class TopK(SoftmaxFamilyBackend):
    """Softmax over the k largest scores of each row (a hard-sparsity baseline)."""

    name = "topk"
    description = "softmax over the k highest-scoring keys of each row (default k = 8)"
    Options = TopKOptions
    options: TopKOptions

    def normalizer(self) -> normalizers.Normalizer:
        return normalizers.TopK(self.options.k)

