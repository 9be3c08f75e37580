"""Row normalizers: score rows (…, Nk) → attention weights, −inf marking keys a row cannot see.

These are the definitions every execution path must reproduce. Weights come out in fp32 (fp64
for fp64 scores): half-precision scores are normalized in fp32.
"""

from __future__ import annotations

import torch

from lengthgen.functional.precision import compute_dtype
from lengthgen.functional.temperature import adaptive_theta


def softmax(scores: torch.Tensor) -> torch.Tensor:
    return torch.softmax(scores.to(compute_dtype(scores.dtype)), dim=-1)


def adaptive_temperature_softmax(scores: torch.Tensor) -> torch.Tensor:
    """softmax(θ z) with θ from the entropy of softmax(z), per row."""
    z = scores.to(compute_dtype(scores.dtype))
    return torch.softmax(z * adaptive_theta(z).to(z.dtype), dim=-1)


def topk_softmax(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Softmax over the keys scoring at least the k-th largest score of the row (ties are kept)."""
    z = scores.to(compute_dtype(scores.dtype))
    kth = torch.topk(z, min(k, z.shape[-1]), dim=-1).values[..., -1:]
    return torch.softmax(z.masked_fill(z < kth, float("-inf")), dim=-1)
