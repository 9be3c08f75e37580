"""α-entmax of dense CPU score rows with a numba row solver: the materialized (training) path.

Training materializes B·H·N rows of at most a few hundred scores and differentiates through
them. The exact torch reference sorts every row (α = 1.5 and 2) or bisects it (other α), and
that solve was most of an α-entmax model's training step on a CPU: 224 ms of a 992 ms step of
the quick copy model (B = 64, 8 heads, 67 tokens, one thread), against 37 ms for this kernel.
Per row, only keys within 1 of the maximum (in (α−1)·z units) can be in the support, and the
monotone Newton solve of ``cpu/entmax_newton.py`` finds τ on them in a few passes, ending with the
closed form for α = 1.5 and α = 2. The backward is the closed-form Jacobian-vector product of
``lengthgen.functional.entmax`` with the same roundings, in fewer passes over the (B, H, N, N)
gradient: torch still computes u = p^(2−α) (its pow is not the correctly rounded one numba would
use) and the two row sums (their order is torch's own), and three numba passes do the masking,
products and differences that were eight torch operations, each writing a fresh score-sized tensor
(20 ms of a 107 ms ASEntmax MQMTAR step at ``paper-tasks``, one thread; 7 ms this way).

The kernel is single-threaded on purpose: numba's parallel loops start an OpenMP pool of their
own, whose spinning threads slowed torch's matrix products in the same step about fourfold.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.functional.entmax import entmax, entmax_backward
from lengthgen.kernels.cpu import entmax_newton
from lengthgen.kernels.cpu.jit import FASTMATH_WITH_NAN, Kernel, njit, numba

__all__ = ["BACKWARD", "KERNEL", "entmax_rows", "entmax_rows_backward"]

if numba is not None:
    _newton = entmax_newton.newton
    MODE_15, MODE_2 = entmax_newton.MODE_15, entmax_newton.MODE_2

    @njit(cache=True, nogil=True, fastmath=FASTMATH_WITH_NAN)
    def _entmax_rows(z, am1, e, em1, em1_int, mode, p):  # noqa: ANN001, ANN202
        """p[r] = α-entmax(z[r]) for every row; −inf entries (and all −inf rows) get 0."""
        R, n = z.shape
        cv = np.empty(n, np.float32)
        ci = np.empty(n, np.int64)
        for r in range(R):
            row = z[r]
            out = p[r]
            m = -np.inf
            for j in range(n):
                out[j] = 0.0
                m = max(m, row[j] * am1)
            if m == -np.inf:
                continue
            k = 0
            for j in range(n):
                x = row[j] * am1
                cv[k] = x
                ci[k] = j
                k += x > m - 1.0
            k, tau = _newton(cv, ci, k, m, -1.0, e, em1, em1_int, mode)
            c = m + tau
            total = 0.0
            for a in range(k):
                d = np.float64(cv[a]) - c
                if mode == MODE_15:
                    w = d * d
                elif mode == MODE_2:
                    w = d
                else:
                    w = d**e
                total += w
                out[ci[a]] = w
            inv = 1.0 / total
            for a in range(k):
                out[ci[a]] = np.float32(out[ci[a]] * inv)


    @njit(cache=True, nogil=True)
    def _zero_off_support(p, u):  # noqa: ANN001, ANN202
        """u = 0 where p is not > 0 (``masked_fill_(~(p > 0), 0)``)."""
        for i in range(p.size):
            if not p[i] > 0:
                u[i] = 0.0

    @njit(cache=True, nogil=True)
    def _normalized_products(u, su, g, n, w):  # noqa: ANN001, ANN202
        """w = (u / su) · g per row, su replaced by 1 where it is not > 0 (rows without support)."""
        for r in range(su.size):
            d = su[r]
            if not d > 0:
                d = np.float32(1.0)
            for j in range(r * n, r * n + n):
                w[j] = (u[j] / d) * g[j]

    @njit(cache=True, nogil=True)
    def _score_gradient(u, g, s, n, out):  # noqa: ANN001, ANN202
        """out = u · g − u · s per row (two rounded products, then their rounded difference)."""
        for r in range(s.size):
            t = s[r]
            for j in range(r * n, r * n + n):
                out[j] = u[j] * g[j] - u[j] * t


def _check(kernel: Any) -> None:
    """Sparsemax of (1, 0, −inf) is (1, 0, 0): one key wins by a margin of 1."""
    p = np.empty((1, 3), np.float32)
    expo, mode, em1_int = entmax_newton.newton_params(np.array([2.0]))
    kernel(np.array([[1.0, 0.0, -np.inf]], np.float32), 1.0, float(expo[0]), float(expo[0]) - 1.0,
           int(em1_int[0]), int(mode[0]), p)
    if not np.allclose(p, [[1.0, 0.0, 0.0]], atol=1e-6):
        raise RuntimeError(f"row solver self-test gave {p.tolist()}")


#: The row solver, compiled and checked on first use.
KERNEL = Kernel("the CPU α-entmax row solver", lambda: _entmax_rows, _check)


def _check_backward(passes: Any) -> None:
    """Bit for bit the torch backward on rows with ties, a one-key support and no support."""
    z = torch.tensor([[0.5, 0.5, -1.0, 0.25], [3.0, 0.0, -0.5, 1.0], [-math.inf] * 4])
    for alpha in (1.5, 2.0, 1.25):
        p = entmax(z, alpha, checked=True)
        g = torch.tensor([[1.0, -2.0, 0.5, 3.0], [0.25, 1.0, -1.0, 2.0], [1.0, 1.0, 1.0, 1.0]])
        if not torch.equal(_fused_backward(passes, p, g, alpha), entmax_backward(p, g, alpha)):
            raise RuntimeError(f"fused entmax backward differs from the torch one at alpha={alpha}")


#: The backward's three passes, compiled and checked on first use.
BACKWARD = Kernel("the CPU α-entmax row backward", lambda: (_zero_off_support, _normalized_products,
                                                          _score_gradient), _check_backward)


def _forward(z: Tensor, alpha: float) -> Tensor:
    flat = z.detach().contiguous().view(-1, z.shape[-1]).numpy()
    p = np.empty_like(flat)
    expos, modes, em1_ints = entmax_newton.newton_params(np.array([alpha]))
    expo, mode, em1_int = float(expos[0]), int(modes[0]), int(em1_ints[0])
    em1 = expo - 1.0
    KERNEL.get()(flat, alpha - 1.0, expo, em1, em1_int, mode, p)
    return torch.from_numpy(p).view(z.shape)


class _RowEntmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor, alpha: float) -> Tensor:  # type: ignore[override]
        p = _forward(z, alpha)
        ctx.alpha = alpha
        ctx.save_for_backward(p)
        return p

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (p,) = ctx.saved_tensors
        return entmax_rows_backward(p, grad, ctx.alpha), None


def _fused_backward(passes: Any, p: Tensor, g: Tensor, alpha: float) -> Tensor:
    """``entmax_backward(p, g, alpha)`` for contiguous float32 CPU tensors of one shape."""
    zero_off_support, normalized_products, score_gradient = passes
    n = p.shape[-1]
    u = p.clamp_min(torch.finfo(p.dtype).tiny).pow_(2 - alpha)
    flat_u, flat_g = u.view(-1).numpy(), g.view(-1).numpy()
    zero_off_support(p.view(-1).numpy(), flat_u)
    out = torch.empty_like(p)
    normalized_products(flat_u, u.sum(-1).view(-1).numpy(), flat_g, n, out.view(-1).numpy())
    row_sums = out.sum(-1).view(-1).numpy()  # Σ ũ·g, in torch's order, before out is overwritten
    score_gradient(flat_u, flat_g, row_sums, n, out.view(-1).numpy())
    return out


def entmax_rows_backward(p: Tensor, grad: Tensor, alpha: float) -> Tensor:
    """∂L/∂z of α-entmax from p and ∂L/∂p: bit for bit ``entmax_backward``, in fewer passes where
    both are contiguous float32 CPU tensors of one shape (the torch expression elsewhere)."""
    fused = (p.dtype == grad.dtype == torch.float32 and p.device.type == grad.device.type == "cpu"
             and p.shape == grad.shape and p.is_contiguous() and grad.is_contiguous() and p.numel() > 0)
    if not fused or BACKWARD.unavailable_reason():
        return entmax_backward(p, grad, alpha)
    return _fused_backward(BACKWARD.get(), p, grad, alpha)


def entmax_rows(z: Tensor, alpha: float) -> Tensor:
    """α-entmax along the last dim of float32 CPU scores, α in (1, 2] (checked by the caller: the
    engine, once per call); differentiable in z.

    Scores must be finite or −inf (masked keys): NaN or +inf rows go to the torch reference,
    which defines them (the kernel is compiled for finite arithmetic).
    """
    # one reduction finds both: max is NaN when any score is, +inf when any is
    if z.numel() and not bool(z.max() < float("inf")):
        return entmax(z, alpha, dim=-1, checked=True)
    return _RowEntmax.apply(z, alpha)
