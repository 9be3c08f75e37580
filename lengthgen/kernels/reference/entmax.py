"""Exact α-entmax attention in pure torch by query blocks (any device; the fallback without numba).

Query blocks × visible keys, never an Nq×Nk allocation. Per row only keys with
x = (α−1)(z − max z) > −1 can be in the support (τ ≥ −1); if that leaves too many, τ of the row's
top 64 keys is a tighter lower bound. When every row of a block has at most ``cap`` candidates we
take the top-K of each row (K = the block's largest count), solve τ exactly on them and gather V;
otherwise the block takes the dense exact path.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lengthgen.functional.entmax import entmax_forward, entmax_threshold
from lengthgen.functional.precision import compute_dtype
from lengthgen.kernels import chunking
from lengthgen.kernels.diagnostics import DiagnosticSink
from lengthgen.kernels.problem import AttnProblem, on_device

__all__ = ["chunked_entmax_attention"]

#: Keys per row used for the τ lower bound when the max − 1 candidate set is too large.
_BOUND_KEYS = 64


@torch.no_grad()
def chunked_entmax_attention(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, alpha: Tensor, rows: Tensor | None, *, cap: int = 512,
) -> tuple[Tensor, Tensor | None, Tensor | None, int]:
    """Exact α-entmax attention by query blocks; returns (out, entropy, support, dense_rows).

    ``alpha`` is (H,) float64, checked by the engine. ``rows``: the diagnostic rows (or None).
    ``dense_rows`` counts the (batch, head, row) triples that went through the dense path because
    their block had more than ``cap`` candidates (a test hook for the overflow path).
    """
    B, H, Nq, Nk = prob.B, prob.H, prob.Nq, prob.Nk
    cd = compute_dtype(q.dtype)
    dev = q.device
    out = torch.zeros((B, H, Nq, v.shape[-1]), dtype=cd, device=dev)
    sink = DiagnosticSink(rows, B, H, prob.visible()) if rows is not None else None
    am1 = (alpha - 1).to(device=dev, dtype=cd)
    # Work in x = (α−1)·z: fold scale·(α−1) into q and (α−1) into the slopes.
    qs = q.to(cd) * (prob.scale * am1).view(1, H, 1, 1)
    kc, vc = k.to(cd), v.to(cd)
    slopes = (on_device(prob.slopes, dev, cd) * am1) if prob.has_alibi else None
    shared = bool((alpha == alpha[0]).all())
    a_arg: float | Tensor = float(alpha[0]) if shared else alpha.to(device=dev, dtype=cd).view(H, 1, 1)
    pos_all = prob.q_positions
    dense_rows = 0
    for r0, r1, kmax in chunking.plan_chunks(pos_all.tolist(), Nk, prob.causal, B * H):
        pos = pos_all[r0:r1]
        x = torch.matmul(qs[:, :, r0:r1], kc[:, :, :kmax].transpose(-1, -2))
        j = torch.arange(kmax, device=dev)
        if slopes is not None:
            x -= slopes.view(-1, 1, 1) * (pos[:, None] - j[None, :]).to(cd)
        if prob.causal:
            # Only keys after the block's first position can be in anyone's future.
            lo = min(kmax, int(pos.min()) + 1)
            if lo < kmax:
                x[..., lo:kmax].masked_fill_(j[None, lo:] > pos[:, None], float("-inf"))
        m = x.amax(-1, keepdim=True)
        thr = m - 1
        n_cand = int((x > thr).sum(-1).max())
        if n_cand > cap and kmax > _BOUND_KEYS:
            # τ of each row's top keys is a lower bound of the row's τ (a subset's τ is never
            # larger), usually a far tighter one than max − 1: candidates shrink to ~ the support.
            top, _ = x.topk(_BOUND_KEYS, dim=-1)
            thr = entmax_threshold(top, a_arg, dim=-1, scaled=True, checked=True).to(x.dtype)
            n_cand = int((x > thr).sum(-1).max())
        if n_cand <= cap:
            vals, idx = x.topk(n_cand, dim=-1)
            p = entmax_forward(vals - m, a_arg, dim=-1, scaled=True, checked=True)
            vg = vc[:, :, :kmax].unsqueeze(2).expand(B, H, r1 - r0, kmax, vc.shape[-1])
            vg = vg.gather(3, idx.unsqueeze(-1).expand(B, H, r1 - r0, n_cand, vc.shape[-1]))
            out[:, :, r0:r1] = torch.einsum("bhrk,bhrkd->bhrd", p, vg)
        else:
            p = entmax_forward(x, a_arg, dim=-1, scaled=True, checked=True)
            out[:, :, r0:r1] = torch.matmul(p, vc[:, :, :kmax])
            dense_rows += B * H * (r1 - r0)
        if sink is not None:
            sink.add_block(r0, r1, p)
    if sink is None:
        return out.to(v.dtype), None, None, dense_rows
    return (out.to(v.dtype), *sink.result(), dense_rows)
