"""The attention engine: one entry point for every backend, every path, every device, and the one
place that chooses how a call runs.

``attend(q, k, v, normalizer, …)`` takes queries already multiplied by their query scale, the
absolute positions of the query rows, per-head ALiBi slopes and a ``Normalizer``, and returns the
output and, on request, the diagnostics (``lengthgen.kernels.diagnostics``). It picks the path:

* ``materialized`` — the whole score matrix, row by row through the normalizer: differentiable,
  used whenever gradients are needed and for small problems (one chunking policy decides,
  ``lengthgen.kernels.chunking``); α-entmax materializes only for gradients (its exact
  reference sorts every row, which its fused kernel beats at every size). α-entmax rows with
  one α, in float32 on CPU, go through the numba row solver (``cpu/entmax_rows.py``), all
  other rows through ``normalizer.probs``;
* ``chunked`` — exact, bounded memory, pure torch on any device (``reference/``): query blocks ×
  visible keys, generic (scores → ``normalizer.probs`` → P·V) for any normalizer, with a
  candidate-pruning variant for α-entmax (``reference/entmax.py``); the path for plugin
  normalizers and the fallback of every fused kernel;
* ``fused`` — CPU kernels (``cpu/``): α-entmax (``cpu/entmax.py``) and top-k (``cpu/topk.py``),
  BLAS score blocks + numba rows; softmax and adaptive temperature through the CPU
  flash-attention kernel (``cpu/softmax.py``), with its entropy and support passes on numba
  where that is available (``cpu/entropy.py``, ``cpu/jit.py``);
* ``triton`` — α-entmax on CUDA (``triton/entmax.py``; on CPU tensors too under
  ``TRITON_INTERPRET=1``, for tests);
* ``flex`` — plain softmax on CUDA through ``torch.nn.attention.flex_attention``
  (``triton/flex_softmax.py``).

Two additions reach these paths from the plugin API. A cumulative bias (``bias_increments``: a
per-position, data-dependent ALiBi, Forgetting Attention's gates) runs on the softmax family's
fused and flex paths; every other normalizer takes the generic paths with it. Stick-breaking rows
(``StickBreaking``: order-dependent, built nearest key first) have paths of their own: ``chunked``
walks key tiles from the query outwards carrying the reverse cumulative sum
(``reference/stickbreaking.py``, also CUDA's), ``fused`` is its numba kernel on float32 CPU
tensors (``cpu/stickbreaking.py``).

``auto`` chooses; a fused kernel that cannot run (numba or triton missing, an old torch) falls
back to the exact torch path with one ``KernelFallbackWarning`` per process and cause. Each kernel
says itself whether it can run; only this module decides what runs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from lengthgen.functional.precision import compute_dtype
from lengthgen.kernels import chunking
from lengthgen.kernels.diagnostics import Diagnostics, diagnostic_rows
from lengthgen.kernels.fallback import warn_fallback
from lengthgen.kernels.normalizers import (
    Entmax,
    Normalizer,
    Softmax,
    StickBreaking,
    TopK,
    alpha_per_head,
    is_differentiable_parameter,
)
from lengthgen.kernels.problem import AttnProblem, prepare
from lengthgen.kernels.reference.generic import chunked_path, materialized_path

if TYPE_CHECKING:
    from lengthgen.kernels.cpu.softmax import Passes

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
    bias_increments: Tensor | None = None,
) -> tuple[Tensor, Diagnostics | None]:
    """Attention of (B, H, Nq, D) queries over (B, H, Nk, D) keys and (B, H, Nk, Dv) values.

    q_positions: (Nq,) absolute positions of the query rows (default: the last Nq positions).
    alibi_slopes: (H,) or None; slope 0 means no bias on that head. scale: default 1/sqrt(D); a
    per-row query scale is folded into q by the caller. causal: key j visible iff j ≤ pos_i.
    bias_increments: (B, H, Nk) increments g of a cumulative bias, or None: query i's score on key
    j gets Σ_{j<t≤pos_i} g_t (``problem.py``; a constant −slope is ALiBi).
    Returns the output in v's dtype and, with ``diagnostics``, the entropy and support of the
    diagnostic rows. Raises ValueError for bad arguments: integer inputs, and (without gradients)
    NaN or infinite ones.
    """
    if impl not in IMPLS:
        raise ValueError(f"unknown impl {impl!r}; choose one of {', '.join(IMPLS)}")
    grad = _needs_grad(q, k, v) or is_differentiable_parameter(normalizer)
    if bias_increments is not None:
        grad = grad or _needs_grad(bias_increments)
    prob = prepare(q, k, v, causal, alibi_slopes, scale, q_positions, needs_grad=grad,
                   bias_increments=bias_increments)
    # α is checked here, once, before any path runs; the paths get the checked per-head values
    alpha = alpha_per_head(normalizer, prob.H) if isinstance(normalizer, Entmax) else None
    if isinstance(normalizer, StickBreaking) and not prob.causal:
        raise ValueError("stick-breaking attention is causal: a row's own token closes its stick")
    rows = diagnostic_rows(prob.Nq, q.device) if diagnostics else None
    chosen = _choose(q, prob, normalizer, grad) if impl == "auto" else impl
    if grad and chosen not in DIFFERENTIABLE:
        raise RuntimeError(f"impl={chosen!r} is not differentiable; use impl='materialized' (or 'auto')")
    if prob.Nq == 0 or prob.Nk == 0:
        out, entropy, support = _empty(v, prob, rows)
    else:
        # Paths compute scores and normalizers in fp32 (``functional.precision``); a caller's
        # autocast (bf16 training) would run their matrix products in bf16 behind their back.
        with _without_autocast(q.device):
            out, entropy, support = _path(chosen, normalizer, q, prob, alpha)(q, k, v, prob, normalizer, rows)
    if rows is None:
        return out, None
    assert entropy is not None and support is not None
    return out, Diagnostics(rows, entropy, support)


def _without_autocast(device: torch.device) -> AbstractContextManager[object]:
    if device.type in ("cpu", "cuda") and torch.is_autocast_enabled(device.type):
        return torch.autocast(device.type, enabled=False)
    return nullcontext()


def _needs_grad(*tensors: Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _choose(q: Tensor, prob: AttnProblem, normalizer: Normalizer, grad: bool) -> str:
    """The path ``auto`` takes (see the module docstring)."""
    cuda = q.device.type == "cuda"
    scan = isinstance(normalizer, StickBreaking)
    # of the fused kernels only softmax's take a cumulative bias; other normalizers run generically
    if scan or (prob.cumulative is not None and not normalizer.softmax_like):
        if chunking.should_materialize(prob.B * prob.H * prob.Nq * prob.Nk, grad, heavy=True):
            return "materialized"
        if scan and not cuda and compute_dtype(q.dtype) == torch.float32:
            return _fused_or_chunked(normalizer, prob)
        return "chunked"
    if isinstance(normalizer, Entmax):
        if cuda:
            from lengthgen.kernels.triton import entmax as triton_entmax

            reason = triton_entmax.unavailable_reason()
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
    if chunking.should_materialize(entries, grad, heavy=prob.cumulative is not None):
        return "materialized"
    if cuda:
        if not isinstance(normalizer, Softmax):
            return "chunked"
        from lengthgen.kernels.triton import flex_softmax

        reason = flex_softmax.unavailable_reason()
        if reason:
            warn_fallback("FlexAttention", reason, "chunked torch path")
            return "chunked"
        return "flex"
    return _fused_or_chunked(normalizer, prob)


def _fused_or_chunked(normalizer: Normalizer, prob: AttnProblem) -> str:
    if normalizer.softmax_like:
        from lengthgen.kernels.cpu import softmax as cpu_softmax

        if not prob.causal and (prob.has_alibi or prob.cumulative is not None):
            return "chunked"  # keys on both sides of a biased row: no window, no key split
        reason, kernel = cpu_softmax.unavailable_reason(), "the CPU flash-attention kernel"
    elif isinstance(normalizer, StickBreaking):
        from lengthgen.kernels.cpu import stickbreaking as cpu_stickbreaking

        reason, kernel = cpu_stickbreaking.KERNEL.unavailable_reason(), cpu_stickbreaking.KERNEL.what
    elif isinstance(normalizer, Entmax):
        from lengthgen.kernels.cpu import entmax as cpu_entmax

        reason, kernel = cpu_entmax.KERNEL.unavailable_reason(), cpu_entmax.KERNEL.what
    elif isinstance(normalizer, TopK):
        from lengthgen.kernels.cpu import topk as cpu_topk

        reason, kernel = cpu_topk.KERNEL.unavailable_reason(), cpu_topk.KERNEL.what
    else:
        return "chunked"
    if reason:
        warn_fallback(kernel, reason, "chunked torch path")
        return "chunked"
    return "fused"


def _path(name: str, normalizer: Normalizer, q: Tensor, prob: AttnProblem, alpha: Tensor | None) -> Path:
    """The function that runs path ``name`` for this normalizer, with its kernels chosen; ``alpha``:
    α-entmax's checked per-head values."""
    if name == "materialized":
        return partial(materialized_path, probs=_materialized_rows(normalizer, q))
    if isinstance(normalizer, StickBreaking):
        from lengthgen.kernels.cpu import stickbreaking as cpu_stickbreaking
        from lengthgen.kernels.reference import stickbreaking as reference_stickbreaking

        scan_paths: dict[str, Path] = {"chunked": reference_stickbreaking.scan_path,
                                       "fused": cpu_stickbreaking.fused_path}
        if name in scan_paths:
            return scan_paths[name]
    elif prob.cumulative is not None and not normalizer.softmax_like:
        if name == "chunked":
            return chunked_path
    elif isinstance(normalizer, Entmax):
        from lengthgen.kernels.cpu import entmax as cpu_entmax
        from lengthgen.kernels.reference import entmax as reference_entmax
        from lengthgen.kernels.triton import entmax as triton_entmax

        assert alpha is not None
        entmax_paths: dict[str, Path] = {
            "chunked": _entmax_kernel_path(reference_entmax.chunked_entmax_attention, alpha),
            "fused": _entmax_kernel_path(cpu_entmax.fused_entmax_attention, alpha),
            "triton": partial(triton_entmax.triton_path, alpha=alpha),
        }
        if name in entmax_paths:
            return entmax_paths[name]
    elif name == "chunked":
        return chunked_path
    elif name == "flex":
        from lengthgen.kernels.triton import flex_softmax

        return flex_softmax.flex_path
    elif name == "fused" and normalizer.softmax_like:
        from lengthgen.kernels.cpu import softmax as cpu_softmax

        return partial(cpu_softmax.fused_path, passes=_softmax_passes(q))
    elif name == "fused" and isinstance(normalizer, TopK):
        from lengthgen.kernels.cpu import topk as cpu_topk

        return cpu_topk.fused_path
    raise ValueError(f"impl={name!r} does not run {type(normalizer).__name__} attention")


def _entmax_kernel_path(run: Callable[..., tuple[Tensor, Tensor | None, Tensor | None, int]],
                        alpha: Tensor) -> Path:
    """An α-entmax kernel that takes the checked α per head, as a path (its count of dense rows
    dropped)."""

    def path(q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer,
             rows: Tensor | None) -> PathResult:
        out, entropy, support, _ = run(q, k, v, prob, alpha, rows)
        return out, entropy, support

    return path


def _materialized_rows(normalizer: Normalizer, q: Tensor) -> Callable[[Tensor], Tensor]:
    """What turns the materialized path's score rows into weights: on float32 CPU scores the numba
    row kernels of α-entmax with one α (``cpu/entmax_rows.py``; the torch reference sorts every
    row) and of stick-breaking (``cpu/stickbreaking_rows.py``; the torch definition is a dozen
    passes), else ``normalizer.probs`` (α-entmax's without checking α again: ``attend`` did)."""
    numba_rows = q.device.type == "cpu" and compute_dtype(q.dtype) == torch.float32
    if isinstance(normalizer, StickBreaking) and numba_rows:
        from lengthgen.kernels.cpu import stickbreaking_rows

        reason = stickbreaking_rows.KERNEL.unavailable_reason()
        if reason:
            warn_fallback(stickbreaking_rows.KERNEL.what, reason, "torch definition")
            return normalizer.probs
        current = normalizer.current
        return lambda scores: stickbreaking_rows.stick_breaking_rows(scores, current)
    if not isinstance(normalizer, Entmax):
        return normalizer.probs
    reference = partial(normalizer.probs, checked=True)
    if isinstance(normalizer.alpha, Tensor) or not numba_rows:
        return reference
    from lengthgen.kernels.cpu import entmax_rows

    reason = entmax_rows.KERNEL.unavailable_reason()
    if reason:
        warn_fallback(entmax_rows.KERNEL.what, reason, "torch reference")
        return reference
    alpha = float(normalizer.alpha)
    return lambda scores: entmax_rows.entmax_rows(scores, alpha)


def _softmax_passes(q: Tensor) -> Passes:
    """The fused softmax path's entropy and support passes (``cpu/softmax.py``: ``Passes``): on
    numba where its kernels are available, the entropy pass only for float32 inputs."""
    from lengthgen.kernels.cpu import entropy, jit
    from lengthgen.kernels.cpu.softmax import Passes

    return Passes(
        numba_entropy=compute_dtype(q.dtype) == torch.float32 and not entropy.KERNEL.unavailable_reason(),
        numba_count=not jit.COUNT_ABOVE.unavailable_reason(),
    )


def _empty(v: Tensor, prob: AttnProblem, rows: Tensor | None) -> PathResult:
    """No query rows or no keys: zero output; a row that sees nothing has entropy and support 0."""
    out = torch.zeros((prob.B, prob.H, prob.Nq, v.shape[-1]), dtype=v.dtype, device=v.device)
    if rows is None:
        return out, None, None
    zeros = torch.zeros((prob.B, prob.H, rows.numel()), dtype=torch.float32, device=v.device)
    return out, zeros, zeros.clone()
