"""Stick-breaking rows (Tan et al., ICLR 2025, arXiv 2410.17980): the definition every path must reproduce.

A row's keys, nearest first, each break off the fraction β = σ(z) of the stick the nearer keys left:

    w_j = σ(z_j) · Π_{j<k<i} (1 − σ(z_k)),   log w_j = −softplus(−z_j) − Σ_{j<k<i} softplus(z_k),

for the keys j before the query's own token i. Which keys a row sees is read from its scores (−inf
marks a key it cannot see), and under causal masking the last key a row sees is its own token.
``current`` says what that token does:

* ``"leftover"`` (the paper's reference code: keys strictly before the query break the stick, and
  the output adds what is left times the query's own value): the own token gets the stick left
  after every earlier key, w_i = Π_{k<i} (1 − σ(z_k)), and its score is not used; every row sums to 1;
* ``"key"``: the own token breaks the stick like the others (the product runs over j < k ≤ i) and
  what is left is dropped: rows sum to 1 − Π_{k≤i} (1 − σ(z_k)) < 1.

The weights are order-dependent (a key's weight depends on every nearer key) and, with ``"key"``,
unnormalized. The log form is summed nearest key first, as the long-sequence paths carry it across
key chunks, so a float32 row loses precision only where its weights have already become tiny.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from lengthgen.functional.precision import compute_dtype

__all__ = ["CURRENT", "Current", "stick_breaking"]

Current = Literal["leftover", "key"]
#: The ways of treating the query's own token.
CURRENT: tuple[str, ...] = ("leftover", "key")


def stick_breaking(scores: torch.Tensor, current: Current = "leftover") -> torch.Tensor:
    """Stick-breaking weights of score rows (…, Nk) in key order, −inf on keys a row cannot see."""
    if current not in CURRENT:
        raise ValueError(f"current must be one of {', '.join(CURRENT)}, got {current!r}")
    z = scores.to(compute_dtype(scores.dtype))
    visible = z > float("-inf")
    keys = torch.arange(z.shape[-1], device=z.device)
    last = z.shape[-1] - 1 - visible.flip(-1).to(torch.uint8).argmax(-1, keepdim=True)  # the last visible
    own = visible & (keys == last)
    breaking = visible & ~own if current == "leftover" else visible
    safe = z.masked_fill(~breaking, 0.0)  # finite everywhere: no NaN in the unused branch's gradient
    log_keep = torch.where(breaking, -F.softplus(safe), 0.0)
    log_claim = torch.where(breaking, F.logsigmoid(safe), float("-inf"))
    kept = log_keep.flip(-1).cumsum(-1).flip(-1)  # Σ over this key and the nearer ones, nearest first
    nearer = F.pad(kept[..., 1:], (0, 1))
    weights = torch.exp(log_claim + nearer)
    if current == "leftover":
        weights = torch.where(own, torch.exp(kept[..., :1]), weights)
    return weights
