"""Adaptive-temperature softmax (Veličković et al., "softmax is not enough").

Per row: H = entropy of softmax(z); θ = max(poly(H), 1) when H > 0.5, else 1; p = softmax(θ z).
The polynomial's coefficients are in *descending* powers (numpy.polyval order). θ carries no
gradient; by default it is applied at inference only, as in the original.
"""

from __future__ import annotations

import torch
from pydantic import Field

from lengthgen.attention import register_attention
from lengthgen.attention.backend import AttentionBackend, BackendOptions

#: poly(H) = −0.037 H⁴ + 0.481 H³ − 2.3 H² + 4.917 H − 1.791
POLY_COEFFS: tuple[float, ...] = (-0.037, 0.481, -2.3, 4.917, -1.791)


def polyval_descending(coeffs: tuple[float, ...], x: torch.Tensor) -> torch.Tensor:
    result = torch.zeros_like(x)
    for c in coeffs:
        result = result * x + c
    return result


def adaptive_theta(scores: torch.Tensor) -> torch.Tensor:
    """Inverse temperature θ per row (…, 1) from the entropy of softmax(scores)."""
    with torch.no_grad():
        logp = torch.log_softmax(scores.float(), dim=-1)
        p = logp.exp()
        entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1, keepdim=True)
        theta = torch.clamp(polyval_descending(POLY_COEFFS, entropy), min=1.0)
        return torch.where(entropy > 0.5, theta, torch.ones_like(theta))


class AdaptiveTemperatureOptions(BackendOptions):
    apply_in_training: bool = Field(False, description="also sharpen during training (original: off)")


@register_attention()
class AdaptiveTemperature(AttentionBackend):
    name = "adaptive_temperature"
    description = "softmax sharpened at inference by an entropy-dependent temperature (Veličković et al.)"
    Options = AdaptiveTemperatureOptions
    options: AdaptiveTemperatureOptions

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        if self.training and not self.options.apply_in_training:
            return torch.softmax(scores.float(), dim=-1).to(scores.dtype)
        theta = adaptive_theta(scores)
        return torch.softmax(scores.float() * theta, dim=-1).to(scores.dtype)
