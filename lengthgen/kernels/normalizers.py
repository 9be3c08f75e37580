"""What the engine is asked to run: a description of the row normalizer.

A backend hands the engine one of these instead of a bare function, so that the engine can pick a
fused kernel for the normalizers it knows (softmax, adaptive temperature, top-k, α-entmax) and
fall back to the generic exact paths, which only need ``probs``, for anything else (a plugin's
``normalize``). ``probs`` is the exact torch computation of the definitions in
``lengthgen.functional``: what the generic paths run and what the fused kernels are tested
against. It never picks a kernel; the engine does (``lengthgen.kernels.engine``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from lengthgen.functional import normalizers as F
from lengthgen.functional.entmax import check_alpha, entmax
from lengthgen.functional.precision import compute_dtype
from lengthgen.functional.stickbreaking import CURRENT, Current, stick_breaking
from lengthgen.kernels.problem import per_head

__all__ = ["AdaptiveTemperature", "Custom", "Entmax", "Normalizer", "Softmax", "StickBreaking", "TopK"]


class Normalizer:
    """Base: ``probs(scores)`` maps score rows (B, H, R, K) to weights of the same shape."""

    #: True for the normalizers whose weights are softmax(θ·z) of some row factor θ (≥ 1).
    softmax_like = False

    def probs(self, scores: Tensor) -> Tensor:
        raise NotImplementedError


@dataclass(frozen=True)
class Softmax(Normalizer):
    softmax_like = True

    def probs(self, scores: Tensor) -> Tensor:
        return F.softmax(scores)


@dataclass(frozen=True)
class AdaptiveTemperature(Normalizer):
    """softmax(θ z), θ = θ(entropy of softmax(z)) per row (``lengthgen.functional.temperature``)."""

    softmax_like = True

    def probs(self, scores: Tensor) -> Tensor:
        return F.adaptive_temperature_softmax(scores)


@dataclass(frozen=True)
class TopK(Normalizer):
    k: int

    def probs(self, scores: Tensor) -> Tensor:
        return F.topk_softmax(scores, self.k)


@dataclass(frozen=True, eq=False)
class Entmax(Normalizer):
    """α-entmax with one α for every head (a float) or one per head (an (H,) tensor)."""

    alpha: float | Tensor

    def probs(self, scores: Tensor, checked: bool = False) -> Tensor:
        """``checked``: α was checked by the caller (the engine, once per call)."""
        alpha = self.alpha
        if isinstance(alpha, Tensor) and alpha.numel() > 1 and scores.dim() >= 3:
            alpha = alpha.reshape(-1, 1, 1).to(device=scores.device)
        z = scores.to(compute_dtype(scores.dtype))
        return entmax(z, alpha if isinstance(alpha, Tensor) else float(alpha), dim=-1, checked=checked)


@dataclass(frozen=True)
class StickBreaking(Normalizer):
    """Stick-breaking rows (``lengthgen.functional.stickbreaking``): order-dependent, built from the
    nearest key outwards, unnormalized with ``current="key"``. Causal attention only: a row's own
    token is its last visible key."""

    current: Current = "leftover"

    def __post_init__(self) -> None:
        if self.current not in CURRENT:
            raise ValueError(f"current must be one of {', '.join(CURRENT)}, got {self.current!r}")

    def probs(self, scores: Tensor) -> Tensor:
        return stick_breaking(scores, self.current)


@dataclass(frozen=True, eq=False)
class Custom(Normalizer):
    """Any function of score rows (a plugin's ``normalize``): run by the generic paths only.

    Its output is checked, since a plugin is code the engine cannot vouch for: a tensor of the
    scores' shape, of a floating-point type, without negative weights (``ValueError`` otherwise,
    which fails the run instead of scoring integer or negative "probabilities").
    """

    fn: Callable[[Tensor], Tensor]

    def probs(self, scores: Tensor) -> Tensor:
        p = self.fn(scores)
        if not isinstance(p, Tensor) or p.shape != scores.shape:
            shape = tuple(p.shape) if isinstance(p, Tensor) else type(p).__name__
            raise ValueError(f"normalize returned {shape} for scores of shape {tuple(scores.shape)}: it must "
                             "return weights of the scores' shape")
        if not p.is_floating_point():
            raise ValueError(f"normalize returned {p.dtype} weights: they must be floating point")
        if bool((p < 0).any()):
            raise ValueError("normalize returned negative weights: probabilities must be ≥ 0")
        return p


def alpha_per_head(normalizer: Entmax, heads: int) -> Tensor:
    """The entmax α of every head as an (H,) float64 CPU tensor, checked to lie in (1, 2]: the one
    check of α on the engine's paths, which get this tensor (or know α was checked)."""
    alpha = per_head(normalizer.alpha, heads, "alpha", 1.5)
    check_alpha(alpha)
    return alpha


def is_differentiable_parameter(normalizer: Normalizer) -> bool:
    """True when the normalizer itself carries a tensor that wants a gradient (a learned α)."""
    alpha = getattr(normalizer, "alpha", None)
    return isinstance(alpha, torch.Tensor) and alpha.requires_grad
