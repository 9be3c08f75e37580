"""Adaptive-temperature softmax (Veličković et al., "softmax is not enough"): the θ polynomial.

Per row: H = Shannon entropy (nats) of softmax(z); θ = max(poly(H), 1) when H > 0.5, else 1; the
row's weights are then softmax(θ z). The polynomial's coefficients are in *descending* powers
(numpy.polyval order). θ carries no gradient.
"""

from __future__ import annotations

import torch

#: poly(H) = −0.037 H⁴ + 0.481 H³ − 2.3 H² + 4.917 H − 1.791
POLY_COEFFS: tuple[float, ...] = (-0.037, 0.481, -2.3, 4.917, -1.791)
#: Rows at or below this entropy (nats) keep θ = 1.
ENTROPY_THRESHOLD = 0.5


def polyval_descending(coeffs: tuple[float, ...], x: torch.Tensor) -> torch.Tensor:
    result = torch.zeros_like(x)
    for c in coeffs:
        result = result * x + c
    return result


def theta_from_entropy(entropy: torch.Tensor) -> torch.Tensor:
    """Inverse temperature θ for rows of the given softmax entropy (nats); same shape."""
    theta = torch.clamp(polyval_descending(POLY_COEFFS, entropy), min=1.0)
    return torch.where(entropy > ENTROPY_THRESHOLD, theta, torch.ones_like(theta))


def adaptive_theta(scores: torch.Tensor) -> torch.Tensor:
    """Inverse temperature θ per row (…, 1) from the entropy of softmax(scores)."""
    with torch.no_grad():
        z = scores.double() if scores.dtype == torch.float64 else scores.float()
        logp = torch.log_softmax(z, dim=-1)
        p = logp.exp()
        entropy = -torch.where(p > 0, p * logp, torch.zeros_like(p)).sum(-1, keepdim=True)
        return theta_from_entropy(entropy)
