"""Execution of attention, behind one engine (``lengthgen.kernels.engine.attend``).

Here: the engine, which chooses every path; the normalizer descriptions it is handed
(``normalizers``); one validated call (``problem``), the chunking policy (``chunking``), the
diagnostics (``diagnostics``) and the fallback warning (``fallback``). The paths live in one
folder per execution target: ``reference/`` (exact torch, any device), ``cpu/`` (BLAS, numba and
the CPU flash-attention kernel) and ``triton/`` (CUDA). All paths compute, over the keys
j ≤ pos_i (causal), z_ij = scale·<q_i, k_j> − slope_h·(pos_i − j) + c_{pos_i} − c_j (c: an optional
cumulative bias, ``problem.py``), p_i = normalizer(z_i) and o_i = Σ_j p_ij v_j.

``entmax_attention`` is the α-entmax entry point of the engine, kept for callers that only need
α-entmax (the Triton benchmark, tests, other projects).
"""

from __future__ import annotations

from torch import Tensor

from lengthgen.kernels.engine import IMPLS, Impl, attend
from lengthgen.kernels.normalizers import Entmax

__all__ = ["IMPLS", "attend", "entmax_attention"]


def entmax_attention(
    q: Tensor, k: Tensor, v: Tensor, alpha: float | Tensor = 1.5, causal: bool = True,
    alibi_slopes: Tensor | None = None, scale: float | None = None, *, q_positions: Tensor | None = None,
    impl: Impl = "auto", return_stats: bool = False,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    """Exact α-entmax attention for (B, H, Nq, D) queries over (B, H, Nk, D) keys and values.

    alpha: float or (H,) tensor in (1, 2]. alibi_slopes: (H,) or None (slope 0 = no bias for that
    head). scale: None → 1/sqrt(D) (fold per-query scales into q). q_positions: (Nq,) absolute
    positions of the query rows; default the last Nq positions. causal: key j visible iff j ≤ pos_i.
    impl: one of ``IMPLS`` (see ``lengthgen.kernels.engine``). Returns the output in v's dtype and,
    with ``return_stats``, ``{"rows": (R,), "entropy": (B, H, R), "support": (B, H, R)}`` for the
    diagnostic rows (every row when Nq ≤ ``diagnostics.DIAGNOSTIC_ROWS``).
    """
    out, diag = attend(
        q, k, v, Entmax(alpha), q_positions=q_positions, alibi_slopes=alibi_slopes, scale=scale,
        causal=causal, diagnostics=return_stats, impl=impl,
    )
    if diag is None:
        return out
    return out, {"rows": diag.rows, "entropy": diag.entropy, "support": diag.support}
