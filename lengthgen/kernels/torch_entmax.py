"""Pure-torch α-entmax attention: the materialized (differentiable) and chunked (exact, bounded) paths.

* ``materialized``: the full (B, H, Nq, Nk) score matrix through the ``entmax`` autograd Function;
  for training lengths, where gradients are needed and the matrix is small.
* ``chunked``: query blocks × visible keys, never an Nq×Nk allocation. Per row only keys with
  x = (α−1)(z − max z) > −1 can be in the support (τ ≥ −1); if that leaves too many, τ of the row's
  top 64 keys is a tighter lower bound. When every row of a block has at most ``cap`` candidates we
  take the top-K of each row (K = the block's largest count), solve τ exactly on them and gather V;
  otherwise the block takes the dense exact path. Works on any device; it is the fallback when
  numba is unavailable.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lengthgen.functional.entmax import entmax, entmax_forward, entmax_threshold
from lengthgen.kernels.common import AttnProblem, row_stats, visible_counts

__all__ = ["materialized_entmax_attention", "chunked_entmax_attention"]

#: Keys per row used for the τ lower bound when the max − 1 candidate set is too large.
_BOUND_KEYS = 64


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _bias_and_mask(
    prob: AttnProblem, pos: Tensor, n_keys: int, dtype: torch.dtype, slopes: Tensor | None
) -> tuple[Tensor | None, Tensor | None]:
    """ALiBi bias −slope_h·(pos_i − j) as (H, R, n_keys) (or None) and the causal mask (R, n_keys)."""
    j = torch.arange(n_keys, device=pos.device)
    bias = None
    if slopes is not None:
        dist = (pos[:, None] - j[None, :]).to(dtype)
        bias = -slopes.to(device=pos.device, dtype=dtype).view(-1, 1, 1) * dist
    mask = (j[None, :] > pos[:, None]) if prob.causal else None
    return bias, mask


def materialized_entmax_attention(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, alpha: float | Tensor, return_stats: bool
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Full score matrix + ``entmax`` autograd Function; gradients flow to q, k, v (and a tensor α)."""
    cd = _compute_dtype(q.dtype)
    z = torch.matmul(q.to(cd), k.to(cd).transpose(-1, -2)) * prob.scale
    pos = prob.q_positions
    bias, mask = _bias_and_mask(prob, pos, prob.Nk, cd, prob.slopes if prob.has_alibi else None)
    if bias is not None:
        z = z + bias
    if mask is not None:
        z = z.masked_fill(mask, float("-inf"))
    if isinstance(alpha, Tensor) and alpha.numel() > 1:
        a_arg: float | Tensor = alpha.reshape(prob.H, 1, 1).to(device=z.device, dtype=cd)
    else:
        a_arg = float(alpha) if not isinstance(alpha, Tensor) else alpha.reshape(()).to(z.device, cd)
    p = entmax(z, a_arg, dim=-1)
    out = torch.matmul(p, v.to(cd)).to(v.dtype)
    if not return_stats:
        return out, None, None
    ent, sup = row_stats(p, visible_counts(prob).to(p.device))
    return out, ent, sup


def _rows_per_block(prob: AttnProblem, block_entries: int) -> int:
    keys = prob.Nk if prob.Nq else 1
    return max(1, min(prob.Nq, block_entries // max(1, prob.B * prob.H * keys)))


@torch.no_grad()
def chunked_entmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    prob: AttnProblem,
    return_stats: bool,
    *,
    cap: int = 512,
    block_entries: int = 1 << 21,
) -> tuple[Tensor, Tensor | None, Tensor | None, int]:
    """Exact α-entmax attention by query blocks; returns (out, entropy, support, dense_rows).

    ``dense_rows`` counts the (batch, head, row) triples that went through the dense path because
    their block had more than ``cap`` candidates (a test hook for the overflow path).
    """
    B, H, Nq, Nk, D = prob.B, prob.H, prob.Nq, prob.Nk, prob.D
    cd = _compute_dtype(q.dtype)
    dev = q.device
    out = torch.zeros((B, H, Nq, D), dtype=cd, device=dev)
    ent = torch.zeros((B, H, Nq), dtype=torch.float32, device=dev) if return_stats else None
    sup = torch.zeros((B, H, Nq), dtype=torch.float32, device=dev) if return_stats else None
    if Nq == 0 or Nk == 0:
        return out.to(v.dtype), ent, sup, 0
    am1 = (prob.alpha - 1).to(device=dev, dtype=cd)
    # Work in x = (α−1)·z: fold scale·(α−1) into q and (α−1) into the slopes.
    qs = q.to(cd) * (prob.scale * am1).view(1, H, 1, 1)
    kc, vc = k.to(cd), v.to(cd)
    slopes = (prob.slopes.to(device=dev, dtype=cd) * am1) if prob.has_alibi else None
    a_s = prob.alpha_scalar
    a_arg: float | Tensor = a_s if a_s is not None else prob.alpha.to(device=dev, dtype=cd).view(H, 1, 1)
    pos_all = prob.q_positions
    n_vis_all = visible_counts(prob)
    rows = _rows_per_block(prob, block_entries)
    dense_rows = 0
    for r0 in range(0, Nq, rows):
        r1 = min(Nq, r0 + rows)
        pos = pos_all[r0:r1]
        kmax = min(Nk, int(pos.max()) + 1) if prob.causal else Nk
        x = torch.matmul(qs[:, :, r0:r1], kc[:, :, :kmax].transpose(-1, -2))
        if slopes is not None:
            bias, _ = _bias_and_mask(prob, pos, kmax, cd, slopes)
            assert bias is not None
            x += bias
        if prob.causal:
            # Only keys after the block's first position can be in anyone's future.
            lo = min(kmax, int(pos.min()) + 1)
            if lo < kmax:
                future = torch.arange(lo, kmax, device=dev)[None, :] > pos[:, None]
                x[..., lo:kmax].masked_fill_(future, float("-inf"))
        m = x.amax(-1, keepdim=True)
        thr = m - 1
        n_cand = int((x > thr).sum(-1).max())
        if n_cand > cap and kmax > _BOUND_KEYS:
            # τ of each row's top keys is a lower bound of the row's τ (a subset's τ is never
            # larger), usually a far tighter one than max − 1: candidates shrink to ~ the support.
            top, _ = x.topk(_BOUND_KEYS, dim=-1)
            thr = entmax_threshold(top, a_arg, dim=-1, scaled=True).to(x.dtype)
            n_cand = int((x > thr).sum(-1).max())
        if n_cand <= cap:
            vals, idx = x.topk(n_cand, dim=-1)
            p = entmax_forward(vals - m, a_arg, dim=-1, scaled=True)
            vg = vc[:, :, :kmax].unsqueeze(2).expand(B, H, r1 - r0, kmax, D)
            vg = vg.gather(3, idx.unsqueeze(-1).expand(B, H, r1 - r0, n_cand, D))
            out[:, :, r0:r1] = torch.einsum("bhrk,bhrkd->bhrd", p, vg)
        else:
            p = entmax_forward(x, a_arg, dim=-1, scaled=True)
            out[:, :, r0:r1] = torch.matmul(p, vc[:, :, :kmax])
            dense_rows += B * H * (r1 - r0)
        if ent is not None and sup is not None:
            e, s = row_stats(p, n_vis_all[r0:r1])
            ent[:, :, r0:r1] = e
            sup[:, :, r0:r1] = s
    return out.to(v.dtype), ent, sup, dense_rows
