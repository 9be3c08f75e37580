"""The α-entmax attention seam: one function, several exact execution paths.

Every entmax-family backend calls :func:`entmax_attention`; the path is chosen here so that the
backends never need to know about kernels:

* ``"materialized"`` — full score matrix and the ``entmax`` autograd Function (differentiable);
* ``"chunked"`` — pure torch, query blocks × visible keys, top-K candidates, never Nq×Nk;
* ``"fused"`` — CPU: BLAS score blocks + a parallel numba row kernel (``cpu_entmax``);
* ``"triton"`` — CUDA: the fused Triton kernel (``triton_entmax``), full causal rows only;
* ``"auto"`` — CUDA → triton when it applies; gradients needed → materialized; CPU → fused, or
  chunked with a one-time warning when numba is unavailable.

All paths compute the same thing (design.md §2): z_ij = scale·<q_i, k_j> − slope_h·(pos_i − j) over
the keys j ≤ pos_i (causal), p_i = α-entmax(z_i), o_i = Σ_j p_ij v_j.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from lengthgen.kernels.common import AttnProblem, prepare

__all__ = ["entmax_attention", "IMPLS"]

IMPLS = ("auto", "materialized", "chunked", "fused", "triton")
Impl = Literal["auto", "materialized", "chunked", "fused", "triton"]

_warned_fallback = False


def _warn_fallback(reason: str) -> None:
    global _warned_fallback
    if not _warned_fallback:
        _warned_fallback = True
        import warnings

        warnings.warn(
            f"fast CPU entmax attention unavailable ({reason}); using the slower chunked torch path",
            RuntimeWarning,
            stacklevel=4,
        )


def _needs_grad(*tensors: Any) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, Tensor) and t.requires_grad for t in tensors)


def _triton_fn() -> Any | None:
    """The Triton entry point, or None when triton (or the module) cannot be used."""
    try:
        from lengthgen.kernels.triton_entmax import triton_available, triton_entmax_attention
    except Exception:
        return None
    try:
        return triton_entmax_attention if triton_available() else None
    except Exception:
        return None


def _triton_applies(q: Tensor, k: Tensor, prob: AttnProblem, return_stats: bool) -> bool:
    return q.is_cuda and prob.full_rows and not return_stats and k.shape[2] == q.shape[2]


def _choose(q: Tensor, k: Tensor, v: Tensor, alpha: Any, prob: AttnProblem, return_stats: bool) -> str:
    if q.is_cuda and _triton_applies(q, k, prob, return_stats) and _triton_fn() is not None:
        return "triton"
    if _needs_grad(q, k, v, alpha):
        return "materialized"
    if q.device.type == "cpu":
        from lengthgen.kernels.cpu_entmax import fused_available, fused_unavailable_reason

        if fused_available():
            return "fused"
        _warn_fallback(fused_unavailable_reason())
    return "chunked"


def entmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float | Tensor = 1.5,
    causal: bool = True,
    alibi_slopes: Tensor | None = None,
    scale: float | None = None,
    *,
    q_positions: Tensor | None = None,
    impl: Impl = "auto",
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, dict[str, Tensor]]:
    """Exact α-entmax attention for (B, H, Nq, D) queries over (B, H, Nk, D) keys and values.

    alpha: float or (H,) tensor in (1, 2]. alibi_slopes: (H,) or None (slope 0 = no bias for that
    head). scale: None → 1/sqrt(D) (fold per-query scales into q). q_positions: (Nq,) absolute
    positions of the query rows; default the last Nq positions. causal: key j visible iff j ≤ pos_i.
    Returns the output in v's dtype, and with ``return_stats`` also
    ``{"entropy": (B, H, Nq) H(p)/log n_i (0 where n_i = 1), "support": (B, H, Nq) #nonzero}``.
    Only the materialized (and Triton) paths are differentiable; ``auto`` picks one when needed.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(IMPLS)}")
    prob = prepare(q, k, v, alpha, causal, alibi_slopes, scale, q_positions)
    chosen = _choose(q, k, v, alpha, prob, return_stats) if impl == "auto" else impl
    if chosen in ("chunked", "fused") and _needs_grad(q, k, v, alpha):
        raise RuntimeError(f"impl={chosen!r} is not differentiable; use impl='materialized' (or 'auto')")
    ent: Tensor | None
    sup: Tensor | None
    if chosen == "triton":
        if not _triton_applies(q, k, prob, return_stats):
            raise ValueError(
                "impl='triton' needs CUDA tensors, full causal rows (no q_positions subset) and no stats"
            )
        fn = _triton_fn()
        if fn is None:
            raise RuntimeError("impl='triton' requested but triton is unavailable")
        a_arg = alpha if isinstance(alpha, Tensor) else float(alpha)
        out = fn(q, k, v, a_arg, prob.causal, alibi_slopes, prob.scale)
        return out
    if chosen == "materialized":
        from lengthgen.kernels.torch_entmax import materialized_entmax_attention

        out, ent, sup = materialized_entmax_attention(q, k, v, prob, alpha, return_stats)
    elif chosen == "chunked":
        from lengthgen.kernels.torch_entmax import chunked_entmax_attention

        out, ent, sup, _ = chunked_entmax_attention(q, k, v, prob, return_stats)
    else:
        from lengthgen.kernels.cpu_entmax import fused_available, fused_entmax_attention

        if q.device.type == "cpu" and fused_available():
            out, ent, sup, _ = fused_entmax_attention(q, k, v, prob, return_stats)
        elif q.device.type != "cpu":
            raise ValueError(f"impl='fused' runs on CPU tensors, got {q.device}")
        else:
            from lengthgen.kernels.cpu_entmax import fused_unavailable_reason
            from lengthgen.kernels.torch_entmax import chunked_entmax_attention

            _warn_fallback(fused_unavailable_reason())
            out, ent, sup, _ = chunked_entmax_attention(q, k, v, prob, return_stats)
    if not return_stats:
        return out
    assert ent is not None and sup is not None
    return out, {"entropy": ent, "support": sup}
