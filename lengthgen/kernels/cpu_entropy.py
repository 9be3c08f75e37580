"""Softmax log-sum-exp and entropy of every query row on CPU: BLAS scores, one numba pass.

Why. Adaptive temperature needs each row's entropy H = LSE − E_p[z] before it renormalizes (and
the diagnostics need it for their rows). Through the CPU flash-attention kernel that is one more
attention pass with values [k, j − p]; on ALiBi heads that pass is one small kernel call per
block of rows, which is where it lost time. Only the scores are needed, so here they come from
one single-threaded BLAS QKᵀ per (head, query block) into a reused buffer, as in ``cpu_entmax``;
then per row the maximum m and one pass of Σ e^u and Σ u·e^u with u = z − m, which give
LSE = m + log Σe^u and H = log Σe^u − Σu·e^u / Σe^u.

numba has no vector math library on this machine: its ``np.exp`` is a scalar call (2.3 ns per
score, measured). ``exp_nonpositive`` is a branch-free Cody–Waite reduction and a degree-7
polynomial that vectorizes (0.24 ns per score alone, the maximum 0.18 ns; the BLAS scores cost
more than both). Its relative error is below 1e-7; the sums run in float32 over 128 keys and in
fp64 across them; H ends within 2e-6 nats of fp64 (``tests/test_cpu_entropy.py``), most of it
the float32 rounding of the scores themselves.

ALiBi heads read only the keys that can carry more than ``window_eps`` of a row's weight (the bound
of ``RowJob.window_start``), like the flash path's windows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels.cpu_blocks import RowJob
from lengthgen.kernels.cpu_entmax import fused_available, fused_unavailable_reason
from lengthgen.kernels.problem import AttnProblem

__all__ = ["entropy_available", "softmax_lse_entropy"]

_MAX_BLOCK_ROWS = 512
#: Keys summed in float32 before the sums move to fp64.
_SUM_BLOCK = 128
#: Keys per chunk of the row-maximum pass.
_MAX_CHUNK = 16
_kernel: Any = None


def _build_kernel() -> Any:
    """Compile (or load from numba's cache) the row kernel; needs numba."""
    from numba import njit

    # No "reassoc" here: it would let LLVM fold the two-part ln 2 of the reduction back into one.
    exact_order = {"nsz", "arcp", "contract", "nnan"}
    fastmath = exact_order | {"reassoc"}

    @njit(cache=True, fastmath=exact_order, nogil=True)
    def exp_nonpositive(u):  # noqa: ANN001, ANN202
        """e^u for float32 u ≤ 0 (u < −87 is taken as −87: a weight below 1.7e-38 of the max)."""
        u = max(u, np.float32(-87.0))
        k = np.floor(u * np.float32(1.4426950408889634) + np.float32(0.5))
        r = u - k * np.float32(0.693145751953125)  # ln 2 = 0.693145751953125 + 1.4286068e-06
        r = r - k * np.float32(1.428606765330187e-06)
        p = np.float32(1.0 / 5040.0)
        p = p * r + np.float32(1.0 / 720.0)
        p = p * r + np.float32(1.0 / 120.0)
        p = p * r + np.float32(1.0 / 24.0)
        p = p * r + np.float32(1.0 / 6.0)
        p = p * r + np.float32(0.5)
        p = p * r + np.float32(1.0)
        p = p * r + np.float32(1.0)
        return p * np.int32((np.int32(k) + np.int32(127)) << np.int32(23)).view(np.float32)

    @njit(cache=True, fastmath=fastmath, nogil=True)
    def row_lse_entropy(s, n):  # noqa: ANN001, ANN202
        """(log Σ e^s, H in nats) of softmax(s[:n]); (−inf, 0) for an empty row."""
        if n <= 0:
            return -np.inf, 0.0
        # The maximum by 16-key chunks: one running maximum is a chain of dependent scalar
        # max operations (0.55 ns per score, measured), 16-wide chunks vectorize (0.18 ns).
        m = s[0]
        chunks = n // _MAX_CHUNK
        for c in range(chunks):
            mc = s[c * _MAX_CHUNK]
            for t in range(_MAX_CHUNK):
                mc = max(mc, s[c * _MAX_CHUNK + t])
            m = max(m, mc)
        for j in range(chunks * _MAX_CHUNK, n):
            m = max(m, s[j])
        total = 0.0
        moment = 0.0
        blocks = n // _SUM_BLOCK
        for b in range(blocks):
            t32 = np.float32(0.0)
            tu32 = np.float32(0.0)
            base = b * _SUM_BLOCK
            for j in range(_SUM_BLOCK):
                u = s[base + j] - m
                e = exp_nonpositive(u)
                t32 += e
                tu32 += e * u
            total += np.float64(t32)
            moment += np.float64(tu32)
        for j in range(blocks * _SUM_BLOCK, n):
            u = s[j] - m
            e = exp_nonpositive(u)
            total += np.float64(e)
            moment += np.float64(e) * np.float64(u)
        return np.float64(m) + np.log(total), np.log(total) - moment / total

    @njit(cache=True, fastmath=fastmath, nogil=True)
    def rows(S, pos, nvis, slope, lse, ent, row0):  # noqa: ANN001, ANN202
        """Log-sum-exp and entropy of the score rows S (R, L) into lse/ent[row0 …]; ``slope`` adds
        the ALiBi bias slope·(j − pos) in place (key t of S is key j0 + t, positions relative
        to j0)."""
        R = S.shape[0]
        sl = np.float32(slope)
        for r in range(R):
            s = S[r]
            n = nvis[r]
            if sl != 0.0:
                p_r = pos[r]
                for j in range(n):
                    s[j] += sl * np.float32(j - p_r)
            lse[row0 + r], ent[row0 + r] = row_lse_entropy(s, n)

    return rows


def _get_kernel() -> Any:
    global _kernel
    if _kernel is None and fused_available():
        _kernel = _build_kernel()
    return _kernel


def entropy_available() -> bool:
    """True when numba is there to run the pass."""
    return _get_kernel() is not None


@torch.no_grad()
def softmax_lse_entropy(
    q: Tensor, k: Tensor, prob: AttnProblem, window_eps: float, *, threads: int | None = None
) -> tuple[Tensor, Tensor]:
    """Log-sum-exp and entropy in nats, each (B, H, Nq) float64, of softmax(z) for every query row
    (ALiBi included; rows in any order).

    ``window_eps``: sloped heads skip keys whose summed weight is at most this fraction of the
    row's. ``threads``: worker threads (default: torch's intra-op thread count).
    """
    kernel = _get_kernel()
    if kernel is None:
        raise RuntimeError(f"the CPU entropy pass needs numba: {fused_unavailable_reason()}")
    B, H, Nq = prob.B, prob.H, prob.Nq
    no_values = k.new_empty((*k.shape[:3], 0))  # this pass reads scores only
    job = RowJob.prepare(q, k, no_values, prob, np.full(H, prob.scale), np.ones(H), None)
    lse = np.zeros((B * H, Nq), np.float64)
    entropy = np.zeros((B * H, Nq), np.float64)
    log_eps = math.log(1.0 / window_eps)

    def work(bh: int, r0: int, n_rows: int, kmax: int, buf: Tensor) -> int:
        r1 = r0 + n_rows
        slope = float(job.slope[bh % H])
        # Beyond the window every key scores at least 1 + slope·extra below the row's own key, so
        # together they weigh at most e^(−1 − slope·extra) / (1 − e^(−slope)) ≤ window_eps of it.
        extra = (log_eps - math.log(-math.expm1(-slope))) / slope if slope > 0.0 else 0.0
        j0 = job.window_start(bh, r0, r1, extra=extra)
        S = buf[: n_rows * (kmax - j0)].view(n_rows, kmax - j0)
        torch.mm(job.qs[bh, r0:r1], job.kf[bh, j0:kmax].t(), out=S)
        kernel(S.numpy(), job.pos[r0:r1] - j0, job.nvis[r0:r1] - j0, slope, lse[bh], entropy[bh], r0)
        return 0

    job.run(work, threads, _MAX_BLOCK_ROWS)
    return torch.from_numpy(lse).view(B, H, Nq), torch.from_numpy(entropy).view(B, H, Nq)
