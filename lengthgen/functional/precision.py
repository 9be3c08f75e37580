"""The one precision rule of attention arithmetic: normalizers, thresholds and scores are computed in
fp32 or better, whatever the activations' dtype, so half-precision inputs never see a
half-precision normalizer."""

from __future__ import annotations

import torch

__all__ = ["compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp64 stays fp64; everything else (fp32, fp16, bf16) is computed in fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32
