"""Learned query scales s_{h,i} that multiply <q_i, k_j>/sqrt(d).

Heads outside the layer's ``scaled_heads`` (the ALiBi half under NAPE) keep s = 1.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from lengthgen.functional.positions import log_visible
from lengthgen.functional.precision import compute_dtype


def capped_log_visible(q_pos: torch.Tensor, length_cap: int | None) -> torch.Tensor:
    """log n_i, with n_i held at ``length_cap`` beyond it: the scale a model would use if it never
    grew past that length (an ablation of what the growth contributes)."""
    log_n = log_visible(q_pos)
    return log_n if length_cap is None else log_n.clamp(max=math.log(length_cap))


def _only_scaled(scale: torch.Tensor, scaled_heads: torch.Tensor) -> torch.Tensor:
    """Put s = 1 on heads that must not be scaled; scale is (B, H, Nq)."""
    return torch.where(scaled_heads[None, :, None], scale, torch.ones_like(scale))


class SSMaxScale(nn.Module):
    """Scalable-Softmax: s_{h,i} = σ_h · log n_i with σ_h learned per head (init 1)."""

    def __init__(self, n_heads: int, length_cap: int | None = None) -> None:
        super().__init__()
        self.sigma = nn.Parameter(torch.ones(n_heads))
        self.length_cap = length_cap

    def forward(self, x: torch.Tensor, q_pos: torch.Tensor, scaled_heads: torch.Tensor) -> torch.Tensor:
        scale = self.sigma[None, :, None] * capped_log_visible(q_pos, self.length_cap)[None, None, :]
        return _only_scaled(scale.expand(x.shape[0], -1, -1), scaled_heads)


def softplus_inverse(y: float) -> float:
    return y + math.log(-math.expm1(-y))


def _computed(weight: torch.Tensor) -> torch.Tensor:
    """The scale is part of the scores, so it is computed in their precision (fp32 or better) even
    from a model whose weights are bfloat16 (``lengthgen eval --precision bf16``)."""
    return weight.to(compute_dtype(weight.dtype))


def _linear_in(x: torch.Tensor, proj: nn.Linear) -> torch.Tensor:
    """``proj(x)`` in x's precision (the layer input, already in the scores' precision)."""
    return F.linear(x, proj.weight.to(x.dtype), proj.bias.to(x.dtype))


class AdaptiveScale(nn.Module):
    """ASEntmax's length-aware scale s = δ + β · (log n)^γ.

    Dynamic (default): β = softplus(W_β x + b_β), γ = 2·tanh(W_γ x + b_γ) from the layer input.
    Static: β, γ learned per head. Init (``init="near_one"``) W = 0, b_γ = 0, b_β =
    softplus⁻¹(beta_init) so s = 1 + beta_init everywhere at step 0 — the paper code's init was
    found to stall MQMTAR training. ``init="paper"`` is that init, for ablations: W ~ N(0, 0.02²)
    drawn from the global generator (seeded per run), biases 0, so s varies per token from step 0.
    """

    def __init__(
        self, d_model: int, n_heads: int, delta: float = 1.0, beta_init: float = 0.05, static: bool = False,
        init: str = "near_one", length_cap: int | None = None,
    ) -> None:
        super().__init__()
        self.delta = delta
        self.static = static
        self.length_cap = length_cap
        if static:
            self.beta_raw = nn.Parameter(torch.full((n_heads,), softplus_inverse(beta_init)))
            self.gamma_raw = nn.Parameter(torch.zeros(n_heads))
        else:
            self.beta_proj = nn.Linear(d_model, n_heads)
            self.gamma_proj = nn.Linear(d_model, n_heads)
            with torch.no_grad():
                for proj in (self.beta_proj, self.gamma_proj):
                    if init == "paper":
                        proj.weight.normal_(0.0, 0.02)
                    else:
                        proj.weight.zero_()
                    proj.bias.zero_()
                if init != "paper":
                    self.beta_proj.bias.fill_(softplus_inverse(beta_init))

    def beta_gamma(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """β, γ of shape (B, H, Nq) (static: broadcast per head)."""
        if self.static:
            beta = F.softplus(_computed(self.beta_raw))[None, :, None].expand(x.shape[0], -1, x.shape[1])
            gamma = (2.0 * torch.tanh(_computed(self.gamma_raw)))[None, :, None].expand_as(beta)
            return beta, gamma
        beta = F.softplus(_linear_in(x, self.beta_proj)).transpose(1, 2)
        gamma = (2.0 * torch.tanh(_linear_in(x, self.gamma_proj))).transpose(1, 2)
        return beta, gamma

    def forward(self, x: torch.Tensor, q_pos: torch.Tensor, scaled_heads: torch.Tensor) -> torch.Tensor:
        beta, gamma = self.beta_gamma(x.float())
        log_n = capped_log_visible(q_pos, self.length_cap)[None, None, :]
        scale = self.delta + beta * torch.pow(log_n, gamma)
        return _only_scaled(scale, scaled_heads)
