"""Stick-breaking attention (Tan et al., ICLR 2025, arXiv 2410.17980): no softmax and no position
embedding; keys, nearest first, each break off β = σ(z) of the stick the nearer keys left.

    A_ij = β_ij · Π_{j<k<i} (1 − β_ik),   log A_ij = −softplus(−z_ij) − Σ_{j<k<i} softplus(z_ik),

with z_ij = <q_i, k_j>/√d. The paper's choices (its reference code's defaults): the keys strictly
before the query break the stick, and the query's own token takes what is left,
A_ii = Π_{k<i} (1 − β_ik), so every row sums to 1 (``current="leftover"``). The option
``current="key"`` lets the own token break the stick too and drops the leftover: an unnormalized
row, for ablations. lengthgen's ``StickBreakingRows`` runs both on every path (its CPU kernel walks
key tiles from the query outwards, carrying the reverse cumulative sum).
"""

from __future__ import annotations

from typing import Literal

import torch
from lengthgen.api import AttentionBackend, BackendOptions, Normalizer, StickBreakingRows
from pydantic import Field


class StickBreakingOptions(BackendOptions):
    current: Literal["leftover", "key"] = Field(
        "leftover", description="the query's own token: takes the stick left (paper), or breaks it like "
                                "the other keys and the leftover is dropped (unnormalized rows)")


class StickBreakingAttention(AttentionBackend):
    name = "stickbreaking"
    description = "stick-breaking attention: nearest keys first take σ(z) of what is left (paper: nope)"
    Options = StickBreakingOptions
    options: StickBreakingOptions

    def normalizer(self) -> Normalizer:
        return StickBreakingRows(current=self.options.current)

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return self.normalizer().probs(scores).to(scores.dtype)
