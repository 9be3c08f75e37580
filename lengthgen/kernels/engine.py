"""The attention engine: one entry point for every backend, every path, every device.

``attend(q, k, v, normalizer, …)`` takes queries already multiplied by their query scale, the
absolute positions of the query rows, per-head ALiBi slopes and a ``Normalizer``, and returns the
output and, on request, the diagnostics (``lengthgen.kernels.diagnostics``). It picks the path:

* ``materialized`` — the whole score matrix and ``normalizer.probs``: differentiable, used
  whenever gradients are needed and for small problems (one chunking policy decides,
  ``lengthgen.kernels.chunking``); α-entmax materializes only for gradients (its exact
  reference sorts every row, which its fused kernel beats at every size);
* ``chunked`` — exact, bounded memory: query blocks × visible keys. Generic (scores →
  ``normalizer.probs`` → P·V) for any normalizer, with a candidate-pruning variant for α-entmax
  (``torch_entmax``). Runs on any device; the path for plugin normalizers;
* ``fused`` — CPU kernels: α-entmax and top-k (``cpu_entmax``: BLAS score blocks + numba rows),
  softmax and adaptive temperature (``cpu_softmax``: the CPU flash-attention kernel);
* ``triton`` — α-entmax on CUDA (on CPU tensors too under ``TRITON_INTERPRET=1``, for tests);
* ``flex`` — the softmax family on CUDA through ``torch.nn.attention.flex_attention``.

``auto`` chooses; a fused kernel that cannot run (numba or triton missing, an old torch) falls
back to the chunked path with one ``KernelFallbackWarning`` per process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from lengthgen.kernels import chunking
from lengthgen.kernels.diagnostics import Diagnostics, diagnostic_rows
from lengthgen.kernels.fallback import warn_fallback
from lengthgen.kernels.generic import chunked_path, materialized_path
from lengthgen.kernels.normalizers import (
    Entmax,
    Normalizer,
    Softmax,
    TopK,
    alpha_per_head,
    is_differentiable_parameter,
)
from lengthgen.kernels.problem import AttnProblem, prepare

__all__ = ["IMPLS", "Impl", "attend"]

IMPLS = ("auto", "materialized", "chunked", "fused", "triton", "flex")
Impl = Literal["auto", "materialized", "chunked", "fused", "triton", "flex"]
#: Paths that support autograd.
DIFFERENTIABLE = ("materialized", "triton", "flex")

PathResult = tuple[Tensor, Tensor | None, Tensor | None]
Path = Callable[[Tensor, Tensor, Tensor, AttnProblem, Normalizer, Tensor | None], PathResult]


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    normalizer: Normalizer,
    *,
    q_positions: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    scale: float | None = None,
    causal: bool = True,
    diagnostics: bool = False,
    impl: Impl = "auto",
) -> tuple[Tensor, Diagnostics | None]:
    """Attention of (B, H, Nq, D) queries over (B, H, Nk, D) keys and (B, H, Nk, Dv) values.

    q_positions: (Nq,) absolute positions of the query rows (default: the last Nq positions).
    alibi_slopes: (H,) or None; slope 0 means no bias on that head. scale: default 1/sqrt(D); a
    per-row query scale is folded into q by the caller. causal: key j visible iff j ≤ pos_i.
    Returns the output in v's dtype and, with ``diagnostics``, the entropy and support of the
    diagnostic rows. Raises ValueError for bad arguments: integer inputs, and (without gradients)
    NaN or infinite ones.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(IMPLS)}")
    grad = _needs_grad(q, k, v) or is_differentiable_parameter(normalizer)
    prob = prepare(q, k, v, causal, alibi_slopes, scale, q_positions, needs_grad=grad)
    if isinstance(normalizer, Entmax):
        alpha_per_head(normalizer, prob.H)  # validates α before any path runs
    rows = diagnostic_rows(prob.Nq, q.device) if diagnostics else None
    chosen = _choose(q, prob, normalizer, grad) if impl == "auto" else impl
    if grad and chosen not in DIFFERENTIABLE:
        raise RuntimeError(f"impl={chosen!r} is not differentiable; use impl='materialized' (or 'auto')")
    if prob.Nq == 0 or prob.Nk == 0:
        out, entropy, support = _empty(v, prob, rows)
    else:
        out, entropy, support = _path(chosen, normalizer)(q, k, v, prob, normalizer, rows)
    if rows is None:
        return out, None
    assert entropy is not None and support is not None
    return out, Diagnostics(rows, entropy, support)


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _choose(q: Tensor, prob: AttnProblem, normalizer: Normalizer, grad: bool) -> str:
    """The path ``auto`` takes (see the module docstring)."""
    cuda = q.device.type == "cuda"
    if isinstance(normalizer, Entmax):
        if cuda:
            from lengthgen.kernels.triton_entmax import triton_unavailable_reason

            reason = triton_unavailable_reason()
            if not reason and (not grad or prob.full_rows):
                return "triton"
            if grad:
                return "materialized"
            if reason:
                warn_fallback("the Triton α-entmax kernel", reason, "chunked torch path")
            return "chunked"
        if grad:
            return "materialized"
        return _fused_or_chunked(normalizer, prob)
    entries = prob.B * prob.H * prob.Nq * prob.Nk
    if chunking.should_materialize(entries, grad):
        return "materialized"
    if cuda:
        if not isinstance(normalizer, Softmax):
            return "chunked"
        from lengthgen.kernels.flex_softmax import flex_unavailable_reason

        reason = flex_unavailable_reason()
        if reason:
            warn_fallback("FlexAttention", reason, "chunked torch path")
            return "chunked"
        return "flex"
    return _fused_or_chunked(normalizer, prob)


def _fused_or_chunked(normalizer: Normalizer, prob: AttnProblem) -> str:
    if normalizer.softmax_like:
        from lengthgen.kernels.cpu_softmax import flash_unavailable_reason

        if not prob.causal and prob.has_alibi:
            return "chunked"  # keys on both sides of a sloped row: no window, no key split
        reason, kernel = flash_unavailable_reason(), "the CPU flash-attention kernel"
    elif isinstance(normalizer, Entmax | TopK):
        from lengthgen.kernels.cpu_entmax import fused_unavailable_reason

        reason, kernel = fused_unavailable_reason(), "the fused CPU row kernels (numba)"
    else:
        return "chunked"
    if reason:
        warn_fallback(kernel, reason, "chunked torch path")
        return "chunked"
    return "fused"


def _path(name: str, normalizer: Normalizer) -> Path:
    if name == "materialized":
        return materialized_path
    if isinstance(normalizer, Entmax):
        from lengthgen.kernels import cpu_entmax, torch_entmax, triton_entmax

        entmax_paths: dict[str, Path] = {
            "chunked": torch_entmax.chunked_path,
            "fused": cpu_entmax.fused_path,
            "triton": triton_entmax.triton_path,
        }
        if name in entmax_paths:
            return entmax_paths[name]
    elif name == "chunked":
        return chunked_path
    elif name == "flex":
        from lengthgen.kernels import flex_softmax

        return flex_softmax.flex_path
    elif name == "fused" and normalizer.softmax_like:
        from lengthgen.kernels import cpu_softmax

        return cpu_softmax.fused_path
    elif name == "fused" and isinstance(normalizer, TopK):
        from lengthgen.kernels import cpu_topk

        return cpu_topk.fused_path
    raise ValueError(f"impl={name!r} does not run {type(normalizer).__name__} attention")


def _empty(v: Tensor, prob: AttnProblem, rows: Tensor | None) -> PathResult:
    """No query rows or no keys: zero output; a row that sees nothing has entropy and support 0."""
    out = torch.zeros((prob.B, prob.H, prob.Nq, v.shape[-1]), dtype=v.dtype, device=v.device)
    if rows is None:
        return out, None, None
    zeros = torch.zeros((prob.B, prob.H, rows.numel()), dtype=torch.float32, device=v.device)
    return out, zeros, zeros.clone()
