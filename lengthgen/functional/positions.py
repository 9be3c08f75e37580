"""Position schemes: how position enters the scores (ALiBi bias slopes, rotary q/k, or nothing).

A scheme answers three questions for a layer with H heads: the per-head ALiBi slopes (0 = no
bias), whether q/k are rotated (RoPE), and which heads take a learned query scale (under NAPE only
the NoPE half; everywhere else all heads).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def alibi_slopes(n_heads: int) -> list[float]:
    """Press et al.'s geometric slopes 2^(-8h/H); for H not a power of two, interleave the next."""

    def power_of_two(n: int) -> list[float]:
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]

    if n_heads & (n_heads - 1) == 0:
        return power_of_two(n_heads)
    lower = 2 ** int(math.floor(math.log2(n_heads)))
    return power_of_two(lower) + power_of_two(2 * lower)[0::2][: n_heads - lower]


@dataclass(frozen=True)
class PositionScheme:
    name: str
    description: str
    rope: bool = False

    def slopes(self, n_heads: int) -> list[float]:
        if self.name == "alibi":
            return alibi_slopes(n_heads)
        if self.name == "nape":
            half = n_heads // 2
            return [1.0 / k for k in range(1, half + 1)] + [0.0] * (n_heads - half)
        return [0.0] * n_heads

    def scaled_heads(self, n_heads: int) -> list[bool]:
        if self.name == "nape":
            half = n_heads // 2
            return [False] * half + [True] * (n_heads - half)
        return [True] * n_heads

    def has_bias(self) -> bool:
        return self.name in ("alibi", "nape")


POSITION_SCHEMES: dict[str, PositionScheme] = {
    s.name: s
    for s in (
        PositionScheme("nape", "NoPE + ALiBi (default): first half of heads ALiBi with slopes 1/k, "
                       "the other half position-free and query-scaled"),
        PositionScheme("alibi", "ALiBi on every head, slopes 2^(-8h/H)"),
        PositionScheme("rope", "rotary embeddings on q and k (base 10000)", rope=True),
        PositionScheme("nope", "no positional information (causal mask only)"),
    )
}


def apply_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotate pairs of channels of x (B, H, N, D) by angles positions · base^(-2i/D)."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = base ** (-torch.arange(half, device=x.device, dtype=torch.float32) / half)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (N, D/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half : 2 * half]
    rotated = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    if 2 * half < d:
        rotated = torch.cat((rotated, x[..., 2 * half :]), dim=-1)
    return rotated


def log_visible(q_pos: torch.Tensor) -> torch.Tensor:
    """log n_i with n_i = i + 2 (visible keys + 1, so position 0 is not scaled to zero)."""
    return torch.log(q_pos.to(torch.float32) + 2.0)
