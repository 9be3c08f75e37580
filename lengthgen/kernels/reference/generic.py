"""The two generic exact paths, in pure torch on any device: they need nothing of a normalizer but
``probs`` (or, on the materialized path, the row function the engine chose for it).

* ``materialized_path`` — the whole score matrix; differentiable (training, small problems);
* ``chunked_path`` — query blocks over their visible keys (``chunking.plan_chunks``), never an
  Nq×Nk tensor; the long-sequence path of plugin normalizers and the fallback of every fused one.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from lengthgen.functional.precision import compute_dtype
from lengthgen.kernels import chunking
from lengthgen.kernels.diagnostics import DiagnosticSink, row_diagnostics
from lengthgen.kernels.normalizers import Normalizer
from lengthgen.kernels.problem import AttnProblem, score_block

__all__ = ["chunked_path", "materialized_path"]

PathResult = tuple[Tensor, Tensor | None, Tensor | None]


def materialized_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None,
    *, probs: Callable[[Tensor], Tensor] | None = None,
) -> PathResult:
    """The whole (B, H, Nq, Nk) score matrix through ``probs`` (default ``normalizer.probs``);
    differentiable."""
    cd = compute_dtype(q.dtype)
    scores = score_block(q.to(cd), k.to(cd), prob.q_positions, prob.slopes_or_none(), prob.scale, prob.causal,
                         prob.cumulative)
    p = (probs or normalizer.probs)(scores)
    out = torch.matmul(p.to(cd), v.to(cd)).to(v.dtype)
    if rows is None:
        return out, None, None
    with torch.no_grad():
        entropy, support = row_diagnostics(p[:, :, rows], prob.visible()[rows])
    return out, entropy, support


@torch.no_grad()
def chunked_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None
) -> PathResult:
    """Exact generic path: query blocks over their visible keys, never an Nq×Nk tensor."""
    cd = compute_dtype(q.dtype)
    out = torch.empty((prob.B, prob.H, prob.Nq, v.shape[-1]), dtype=cd, device=q.device)
    sink = DiagnosticSink(rows, prob.B, prob.H, prob.visible()) if rows is not None else None
    pos = prob.q_positions
    slopes = prob.slopes_or_none()
    for start, stop, keys in chunking.plan_chunks(pos.tolist(), prob.Nk, prob.causal, prob.B * prob.H):
        q_block, k_block = q[:, :, start:stop].to(cd), k[:, :, :keys].to(cd)
        scores = score_block(q_block, k_block, pos[start:stop], slopes, prob.scale, prob.causal,
                             prob.cumulative)
        p = normalizer.probs(scores)
        out[:, :, start:stop] = torch.matmul(p.to(cd), v[:, :, :keys].to(cd))
        if sink is not None:
            sink.add_block(start, stop, p)
    if sink is None:
        return out.to(v.dtype), None, None
    return (out.to(v.dtype), *sink.result())
