"""Stick-breaking of dense CPU score rows with numba: the materialized (training) path.

Training materializes B·H·N rows of a few hundred scores and differentiates through them. The
definition in torch (``functional/stickbreaking.py``) is a dozen passes over the (B, H, N, N) block
(softplus and log-sigmoid with their log1p, two flips, a cumulative sum, exp, masks), and autograd
keeps most of their results for a backward of as many passes again: on the flip_flop model's
(64, 4, 130, 130) block its forward alone took 78 ms where softmax's takes 3.3 ms (one thread).

Here a row costs three short loops forward and three backward. Forward: per key one exponential
and one logarithm give both log(1 − β) = −softplus(z) and log β = −softplus(−z) (as in
``cpu/stickbreaking.py``, vectorized: ``jit.exp_f32`` and ``jit.log1p_unit``); a
scalar walk from the nearest key back adds the stick left by the nearer keys (in float64); a third
loop exponentiates. Backward, in closed form from w and z alone, with G = g·w:

    ∂L/∂z_k = σ(−z_k)·G_k − σ(z_k)·(Σ_{j<k} G_j + G_own),

since log w_j gains log σ(z_j) from its own key and −softplus(z_k) from each nearer key k; G_own,
the own token's leftover (``current="leftover"``), depends on every breaking key's log(1 − β).

The arithmetic differs from the torch definition's by a few float32 ulps per weight (its exp and
log1p, summation order), so it is a numerics change (``provenance.NUMERICS_VERSION``); it agrees
with the float64 definition to 1e-6 (``tests/test_stickbreaking_rows.py``). Single-threaded for the
reason ``cpu/entmax_rows.py`` gives.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.functional.stickbreaking import Current, stick_breaking
from lengthgen.kernels.cpu import jit
from lengthgen.kernels.cpu.jit import FASTMATH_WITH_NAN, Kernel, njit, numba

__all__ = ["KERNEL", "stick_breaking_rows"]

#: A weight whose log is at or below this is 0: float32's e^x is below its smallest normal there.
_ZERO_BELOW = np.float32(-87.0)

if numba is not None:
    _exp, _log1p_unit = jit.exp_f32, jit.log1p_unit

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _open_row(row, out, leftover):  # noqa: ANN001, ANN202
        """Zero the output row; return (last visible key, number of keys that break the stick): the
        keys before the last one it sees with ``leftover``, through it without; (−1, 0) for a row
        that sees none."""
        for j in range(out.shape[0]):
            out[j] = 0.0
        last = -1
        for j in range(row.shape[0] - 1, -1, -1):
            if row[j] > -np.inf:
                last = j
                break
        if last < 0:
            return -1, 0
        return last, last if leftover else last + 1

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _logs(row, m, keep, log_claim):  # noqa: ANN001, ANN202
        """Keys 0 … m − 1: log(1 − β) into keep and log β into log_claim (0 and −1e30 for masked keys);
        e^(−|z|) at |z| ≤ 40 (beyond, log1p's term is below 4e-18)."""
        for j in range(m):
            x = row[j]
            seen = x > -np.inf
            z = x if seen else np.float32(0.0)
            lg = _log1p_unit(_exp(-min(abs(z), np.float32(40.0))))
            keep[j] = -(max(z, np.float32(0.0)) + lg) if seen else np.float32(0.0)
            log_claim[j] = -(max(-z, np.float32(0.0)) + lg) if seen else np.float32(-1e30)

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _exp_row(log_w, m, out):  # noqa: ANN001, ANN202
        for j in range(m):
            x = log_w[j]
            out[j] = _exp(x) if x > _ZERO_BELOW else np.float32(0.0)

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _forward_rows(z, leftover, w):  # noqa: ANN001, ANN202
        """w[r] = stick-breaking weights of the score row z[r] (−inf: a key the row cannot see)."""
        R, n = z.shape
        keep = np.empty(n, np.float32)
        log_w = np.empty(n, np.float32)
        for r in range(R):
            row, out = z[r], w[r]
            last, m = _open_row(row, out, leftover)
            if last < 0:
                continue
            _logs(row, m, keep, log_w)
            run = 0.0  # log of the stick the nearer keys left, float64
            for jj in range(m):
                j = m - 1 - jj
                log_w[j] = np.float32(log_w[j] + run)
                run += keep[j]
            _exp_row(log_w, m, out)
            if leftover:
                out[last] = _exp(np.float32(run)) if run > _ZERO_BELOW else np.float32(0.0)

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _products(g, w, m, gw):  # noqa: ANN001, ANN202
        for j in range(m):
            gw[j] = g[j] * w[j]

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _score_gradient(row, gw, farther, m, out):  # noqa: ANN001, ANN202
        """out_k = σ(−z_k)·G_k − σ(z_k)·farther_k, 0 for masked keys; σ(z) = 1/(1 + e^(−z)),
        σ(−z) = e^(−z)·σ(z), both accurate at either tail (z clamped to ±87: σ then differs from
        0 or 1 by less than float32 holds)."""
        for j in range(m):
            x = row[j]
            seen = x > -np.inf
            z = min(max(x if seen else np.float32(0.0), np.float32(-87.0)), np.float32(87.0))
            e = _exp(-z)
            s = np.float32(1.0) / (np.float32(1.0) + e)
            d = (e * s) * gw[j] - s * farther[j]
            out[j] = d if seen else np.float32(0.0)

    @njit(cache=True, fastmath=FASTMATH_WITH_NAN, nogil=True, error_model="numpy")
    def _backward_rows(z, w, g, leftover, dz):  # noqa: ANN001, ANN202
        """dz[r] = ∂L/∂z of row r from its scores z, weights w and ∂L/∂w = g."""
        R, n = z.shape
        gw = np.empty(n, np.float32)
        farther = np.empty(n, np.float32)
        for r in range(R):
            row, out = z[r], dz[r]
            last, m = _open_row(row, out, leftover)
            if last < 0:
                continue
            _products(g[r], w[r], m, gw)
            total = np.float64(g[r, last]) * np.float64(w[r, last]) if leftover else 0.0
            for j in range(m):  # Σ of G over the farther keys, plus the own token's leftover
                farther[j] = np.float32(total)
                total += gw[j]
            _score_gradient(row, gw, farther, m, out)


def _check(kernels: Any) -> None:
    """Both passes against the float64 definition, both ways of treating the own token: weights of
    a row with keys 1, −2, 0.5 before its own token and a masked key, and of a row that sees only
    its own token; ∂L/∂z of a row with a masked key inside it against autograd."""
    forward, backward = kernels
    inf = np.inf
    z = torch.tensor([[1.0, -2.0, 0.5, -inf, 7.0, -inf], [-inf, -inf, 3.0, -inf, -inf, -inf]])
    g = torch.tensor([[0.5, -1.0, 2.0, 3.0, 1.5, -4.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]])
    for current in ("leftover", "key"):
        with torch.enable_grad():  # first use may come inside a backward, where grad mode is off
            z64 = z.double().requires_grad_()
            w64 = stick_breaking(z64, current)
            (want,) = torch.autograd.grad(w64, z64, g.double())
        w, dz = np.empty((2, 6), np.float32), np.empty((2, 6), np.float32)
        forward(z.numpy(), current == "leftover", w)
        backward(z.numpy(), w64.detach().float().numpy(), g.numpy(), current == "leftover", dz)
        if not (np.allclose(w, w64.detach().numpy(), atol=1e-6) and np.allclose(dz, want.numpy(), atol=1e-6)):
            raise RuntimeError(f"stick-breaking row self-test ({current}) gave {w.tolist()}, {dz.tolist()}")


#: The forward and backward row kernels, compiled and checked together on first use.
KERNEL = Kernel("the CPU stick-breaking row kernels",
                lambda: (_forward_rows, _backward_rows) if numba is not None else None, _check)


class _RowStickBreaking(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor, current: Current) -> Tensor:  # type: ignore[override]
        flat = z.detach().contiguous().view(-1, z.shape[-1])
        w = torch.empty_like(flat)
        if flat.numel():
            KERNEL.get()[0](flat.numpy(), current == "leftover", w.numpy())
        w = w.view(z.shape)
        ctx.current = current
        ctx.save_for_backward(flat, w)
        return w

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        flat, w = ctx.saved_tensors
        g = grad.contiguous().view(flat.shape)
        dz = torch.empty_like(flat)
        if flat.numel():
            KERNEL.get()[1](flat.numpy(), w.view(flat.shape).numpy(), g.numpy(), ctx.current == "leftover",
                           dz.numpy())
        return dz.view(w.shape), None


def stick_breaking_rows(z: Tensor, current: Current) -> Tensor:
    """Stick-breaking weights along the last dim of float32 CPU scores (−inf: keys a row cannot
    see), differentiable in z. NaN or +inf scores go to the torch definition, which defines them
    (the kernels assume finite arithmetic)."""
    if z.numel() and not bool(z.max() < math.inf):
        return stick_breaking(z, current)
    return _RowStickBreaking.apply(z, current)
