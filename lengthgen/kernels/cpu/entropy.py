"""Softmax log-sum-exp and entropy of every query row on CPU: BLAS score tiles, one numba pass.

Why. Adaptive temperature needs each row's entropy H = LSE − E_p[z] before it renormalizes (and
the diagnostics need it for their rows). Through the CPU flash-attention kernel that is one more
attention pass with values [k, j − p]: it computes a P·V this pass does not need, and on ALiBi
heads it runs as one small kernel call per block of rows. Only the scores are needed, so here
each worker thread computes tiles of them (128 rows × 2,048 keys, in L2) with one
single-threaded BLAS QKᵀ into a reused buffer, and a numba pass folds each tile into every row's
running (shift m, T = Σ e^(z − m), M = Σ (z − m)·e^(z − m)); at the end LSE = m + log T and
H = log T − M / T. The shift is a sampled score (every 16th), not the exact maximum, which
would cost a pass of its own; ``tile_stats`` says why that is safe and when a tile is redone.

numba has no vector math library on this machine: its ``np.exp`` is a scalar call (2.3 ns per
score, measured). ``exp_f32`` (``cpu/jit.py``) is a branch-free Cody–Waite reduction and a degree-7
polynomial that vectorizes (0.24 ns per score; the BLAS tile costs more). Its relative error is below 1e-7;
the sums run in float32 over 128 keys and in fp64 across them; H ends within 2e-6 nats of fp64
(``tests/test_cpu_entropy.py``), most of it the float32 rounding of the scores themselves.

ALiBi heads read only the keys that can carry more than ``window_eps`` of a row's weight (the bound
of ``RowJob.window_start``), like the flash path's windows.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels.cpu.blocks import RowJob, run_blocks
from lengthgen.kernels.cpu.jit import FASTMATH, Kernel
from lengthgen.kernels.problem import AttnProblem

__all__ = ["KERNEL", "add_cumulative_bias", "softmax_lse_entropy"]

#: Query rows per work item, and score entries per BLAS tile (rows × keys, 1 MiB of float32 in
#: L2): a row's keys go through in tiles, merged exactly, instead of one block of all its keys
#: (16 rows × 65,536 keys: BLAS ran 1.3-2× slower per score than on 128 × 2,048 tiles).
_BLOCK_ROWS = 128
_TILE_ENTRIES = 1 << 18
#: Keys summed in float32 before the sums move to fp64.
_SUM_BLOCK = 128
#: A tile's shift is the row's shift so far or the largest of every this-many-th of its scores…
_SAMPLE_STRIDE = 16
#: …unless its Σ e^u comes out above this (tiles hold at most 2,048 keys of one row).
_REDO_ABOVE = 2.0**16


def add_cumulative_bias(S: Tensor, cum: Tensor, pos: Tensor, t0: int, theta: Tensor | None = None) -> None:
    """S (R, L) += θ·(c_pos − c_j) for the keys j = t0 … t0 + L − 1 of one head, in float32, in one
    numba pass over the tile.

    c (float64) reaches 10⁴ at long lengths, where float32 holds it only to 10⁻³; differencing in
    float64 for every score cost more than the scores' BLAS tile. So c is split into float32 parts
    hi + lo, and c_pos − c_j = (hi_pos − hi_j) + (lo_pos − lo_j): the first difference of exact
    float32 numbers rounds once, by 6e-8 of itself (small for the keys that matter), the second
    carries the rest. Without numba (the support count's torch fallback), the same in torch."""
    from lengthgen.kernels.cpu import jit

    rows, keys = cum[pos], cum[t0 : t0 + S.shape[1]]
    rows_hi, keys_hi = rows.float(), keys.float()
    rows_lo, keys_lo = (rows - rows_hi.double()).float(), (keys - keys_hi.double()).float()
    factor = torch.ones(len(rows)) if theta is None else theta.float()
    if jit.NUMBA_ERROR is None:
        jit.add_row_key_bias(S.numpy(), rows_hi.numpy(), rows_lo.numpy(), keys_hi.numpy(), keys_lo.numpy(),
                             factor.numpy())
        return
    bias = (rows_hi[:, None] - keys_hi[None, :]) + (rows_lo[:, None] - keys_lo[None, :])
    S.addcmul_(factor[:, None], bias)


def _build_kernel() -> Any:
    """Define the row kernel (numba compiles it, or loads it from its cache, on the first call)."""
    from lengthgen.kernels.cpu.jit import exp_f32, njit

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def shifted_sums(s, n, c):  # noqa: ANN001, ANN202
        """(Σ e^u, Σ u·e^u) over s[:n] with u = s − c."""
        cf = np.float32(c)
        total = 0.0
        moment = 0.0
        blocks = n // _SUM_BLOCK
        for b in range(blocks):
            t32 = np.float32(0.0)
            tu32 = np.float32(0.0)
            base = b * _SUM_BLOCK
            for j in range(_SUM_BLOCK):
                u = s[base + j] - cf
                e = exp_f32(u)
                t32 += e
                tu32 += e * u
            total += np.float64(t32)
            moment += np.float64(tu32)
        for j in range(blocks * _SUM_BLOCK, n):
            u = s[j] - cf
            e = exp_f32(u)
            total += np.float64(e)
            moment += np.float64(e) * np.float64(u)
        return total, moment

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def tile_stats(s, n, c):  # noqa: ANN001, ANN202
        """(shift m, Σ e^u, Σ u·e^u) over s[:n], n ≥ 1, with u = s − m.

        The shift is the largest of ``c`` (the row's shift so far, −inf at first) and every
        ``_SAMPLE_STRIDE``-th score: one of the row's scores, so the row's Σ e^u stays ≥ 1 and
        keys taken at u = −87 weigh nothing next to it. A key far above the shift shows in the
        sum, Σ e^u ≥ e^(max − shift): above ``_REDO_ABOVE`` the tile is summed again from its exact
        maximum (far above, e^u would overflow; well above, H = log Σe^u − Σu·e^u / Σe^u would be
        a difference of two large terms, each with float32's relative error). Below it, the
        shift is within log(_REDO_ABOVE) of the maximum.
        """
        m = np.float32(c) if c > -np.inf else s[0]
        for j in range(0, n, _SAMPLE_STRIDE):
            m = max(m, s[j])
        total, moment = shifted_sums(s, n, m)
        if total > _REDO_ABOVE:
            # The exact maximum by 16-key chunks: one running maximum is a chain of dependent
            # scalar max operations (0.55 ns per score, measured), 16-wide chunks vectorize.
            chunks = n // _SAMPLE_STRIDE
            for a in range(chunks):
                mc = s[a * _SAMPLE_STRIDE]
                for t in range(_SAMPLE_STRIDE):
                    mc = max(mc, s[a * _SAMPLE_STRIDE + t])
                m = max(m, mc)
            for j in range(chunks * _SAMPLE_STRIDE, n):
                m = max(m, s[j])
            total, moment = shifted_sums(s, n, m)
        return np.float64(m), total, moment

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def rows(S, t0, pos, last, slope, m, T, M):  # noqa: ANN001, ANN202
        """Fold the score tile S (R, L) of keys t0 … t0 + L − 1 into each row's running (m, T, M):
        its shift (one of its scores so far; ``tile_stats``), T = Σ e^(z − m) and
        M = Σ (z − m)·e^(z − m) over the keys seen.

        Row r sees the keys up to ``last[r]``; ``slope`` (R,) adds the ALiBi bias
        slope[r]·(j − pos[r]) in place (positions relative to the same origin as t0).
        """
        R = S.shape[0]
        L = S.shape[1]
        for r in range(R):
            n = min(L, last[r] - t0 + 1)
            if n <= 0:
                continue
            s = S[r]
            sl = np.float32(slope[r])
            if sl != 0.0:
                p_r = pos[r] - t0
                for j in range(n):
                    s[j] += sl * np.float32(j - p_r)
            mt, tt, mm = tile_stats(s, n, m[r] if T[r] > 0.0 else -np.inf)
            if T[r] <= 0.0:
                m[r], T[r], M[r] = mt, tt, mm
                continue
            # Both sums move to the larger shift m': e^(z − m') = e^(z − m)·e^(m − m') and
            # z − m' = (z − m) + (m − m').
            top = max(m[r], mt)
            fa = np.exp(m[r] - top)
            fb = np.exp(mt - top)
            M[r] = (M[r] + (m[r] - top) * T[r]) * fa + (mm + (mt - top) * tt) * fb
            T[r] = T[r] * fa + tt * fb
            m[r] = top

    return rows


def _check(kernel: Any) -> None:
    """Scores (0.5, −0.25) of one row: LSE = log(e^0.5 + e^−0.25), entropy from its weights."""
    top, total, moment = np.zeros(1), np.zeros(1), np.zeros(1)
    kernel(np.array([[0.5, -0.25]], np.float32), 0, np.array([1], np.int64), np.array([1], np.int64),
           np.zeros(1, np.float32), top, total, moment)
    lse = top[0] + math.log(total[0])
    if not abs(lse - math.log(math.exp(0.5) + math.exp(-0.25))) < 1e-6:
        raise RuntimeError(f"entropy pass self-test gave LSE {lse}")


#: The row kernel, compiled and checked on first use.
KERNEL = Kernel("the CPU entropy pass", _build_kernel, _check)


@torch.no_grad()
def softmax_lse_entropy(
    q: Tensor, k: Tensor, prob: AttnProblem, window_eps: float, *, theta: Tensor | None = None,
    threads: int | None = None,
) -> tuple[Tensor, Tensor]:
    """Log-sum-exp and entropy in nats, each (B, H, Nq) float64, of softmax(θ·z) for every query
    row (ALiBi included; rows in any order).

    ``theta``: (B, H, Nq) inverse temperatures ≥ 1 (adaptive temperature's diagnostics), or None
    for θ = 1. ``window_eps``: sloped heads skip keys whose summed weight is at most this fraction
    of the row's. ``threads``: worker threads (default: torch's intra-op thread count). A
    cumulative bias (``prob.cumulative``) is added to each score tile before the numba pass; the
    sloped heads keep their windows only when it never increases (it then only lowers far keys).
    """
    kernel = KERNEL.get()
    pos = prob.q_positions
    if not bool((pos[1:] >= pos[:-1]).all()):  # blocks of neighbouring rows share their keys
        order = torch.argsort(pos, stable=True)
        lse, entropy = softmax_lse_entropy(q[:, :, order], k, replace(prob, q_positions=pos[order]),
                                           window_eps, theta=None if theta is None else theta[:, :, order],
                                           threads=threads)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel())
        return lse[:, :, inverse], entropy[:, :, inverse]
    B, H, Nq = prob.B, prob.H, prob.Nq
    if theta is not None:  # θ·z: θ into the queries here, into the slopes per row below
        q = q * theta[..., None].to(q.dtype)
        row_factor = theta.to(torch.float32).reshape(B * H, Nq).numpy()
    else:
        row_factor = np.ones((B * H, Nq), np.float32)
    no_values = k.new_empty((*k.shape[:3], 0))  # this pass reads scores only
    job = RowJob.prepare(q, k, no_values, prob, np.full(H, prob.scale), np.ones(H), None)
    top = np.zeros((B * H, Nq), np.float64)
    total = np.zeros((B * H, Nq), np.float64)
    moment = np.zeros((B * H, Nq), np.float64)
    last = job.nvis - 1
    log_eps = math.log(1.0 / window_eps)
    cum = None if prob.cumulative is None else prob.cumulative.reshape(B * H, -1)
    windows = prob.cumulative_monotone()
    positions = torch.from_numpy(job.pos)

    def work(bh: int, r0: int, n_rows: int, kmax: int, buf: Tensor) -> int:
        r1 = r0 + n_rows
        slope = float(job.slope[bh % H])
        # Beyond the window every key scores at least 1 + slope·extra below the row's own key, so
        # together they weigh at most e^(−1 − slope·extra) / (1 − e^(−slope)) ≤ window_eps of it
        # (with θ ≥ 1 the bias θ·slope only drops them further; the bound has θ in the queries).
        extra = (log_eps - math.log(-math.expm1(-slope))) / slope if slope > 0.0 else 0.0
        j0 = job.window_start(bh, r0, r1, extra=extra) if windows else 0
        row_slope = slope * row_factor[bh, r0:r1]
        width = max(1, _TILE_ENTRIES // n_rows)
        for t0 in range(j0, kmax, width):
            t1 = min(kmax, t0 + width)
            S = buf[: n_rows * (t1 - t0)].view(n_rows, t1 - t0)
            torch.mm(job.qs[bh, r0:r1], job.kf[bh, t0:t1].t(), out=S)
            if cum is not None:  # θ·(c_pos − c_j), θ per row
                add_cumulative_bias(S, cum[bh], positions[r0:r1], t0, torch.from_numpy(row_factor[bh, r0:r1]))
            kernel(S.numpy(), t0, job.pos[r0:r1], last[r0:r1], row_slope, top[bh, r0:r1], total[bh, r0:r1],
                   moment[bh, r0:r1])
        return 0

    items = [(bh, r0, min(Nq, r0 + _BLOCK_ROWS) - r0, int(job.nvis[r0 : r0 + _BLOCK_ROWS].max()))
             for bh in range(B * H) for r0 in range(0, Nq, _BLOCK_ROWS)]
    if items:
        run_blocks(work, items, _TILE_ENTRIES, threads)
    with np.errstate(divide="ignore"):  # a row without keys: LSE −inf, entropy 0
        log_total = np.log(total)
    lse = np.where(total > 0.0, top + log_total, -np.inf)
    entropy = np.where(total > 0.0, log_total - moment / np.where(total > 0.0, total, 1.0), 0.0)
    return torch.from_numpy(lse).view(B, H, Nq), torch.from_numpy(entropy).view(B, H, Nq)
