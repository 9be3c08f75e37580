"""Exact top-k softmax attention on CPU: BLAS score blocks + a numba row kernel.

The work is ``cpu/entmax.py``'s with another row rule (BLAS QKᵀ per (head, query block) into a reused
buffer, one GIL-free numba pass per row, sparse P·V). Per row: add the ALiBi bias and take the
maxima of 16-key chunks; the k-th largest chunk maximum is a score, so it bounds the k-th largest
score from below; only the chunks above it are scanned for candidates; the k-th largest candidate
is the row's threshold and every key at or above it is kept (ties kept, as in
``lengthgen.functional.normalizers.topk_softmax``); softmax over the kept keys; o = Σ p_j v_j.

ALiBi heads skip keys further left than a proven bound: among the k nearest visible keys each
scores at least −scale·|q|·max|k| − slope·(k − 1), so the k-th largest score does too, while a key
d positions back scores at most scale·|q|·max|k| − slope·d.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels.cpu.blocks import RowJob
from lengthgen.kernels.cpu.jit import CHUNK, FASTMATH, Kernel
from lengthgen.kernels.normalizers import Normalizer, TopK
from lengthgen.kernels.problem import AttnProblem

__all__ = ["KERNEL", "fused_path", "fused_topk_attention"]

_MAX_BLOCK_ROWS = 512


def _build_kernel() -> Any:
    """Define the row kernel (numba compiles it, or loads it from its cache, on the first call)."""
    from lengthgen.kernels.cpu.jit import chunk_max, collect, njit

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def kth_largest(values, n, kk, top):  # noqa: ANN001, ANN202
        """The kk-th largest of values[:n] (n ≥ kk) with a small running buffer ``top``."""
        for a in range(kk):
            top[a] = values[a]
        low = 0
        for a in range(kk):
            if top[a] < top[low]:
                low = a
        for a in range(kk, n):
            x = values[a]
            if x > top[low]:
                top[low] = x
                for b in range(kk):
                    if top[b] < top[low]:
                        low = b
        return top[low]

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def rows(S, V, out, ent, sup, row0, pos, nvis, nstat, slope, kk, want):  # noqa: ANN001, ANN202
        """Rows of one (head, block): scores S (R, L), values V (L, Dv) → out/ent/sup rows row0 …"""
        R, L = S.shape
        Dv = V.shape[1]
        cm = np.empty(L // CHUNK + 1, np.float32)
        cmi = np.empty(L // CHUNK + 1, np.int64)
        cv = np.empty(L + CHUNK, np.float32)
        ci = np.empty(L + CHUNK, np.int64)
        top = np.empty(kk, np.float32)
        w = np.empty(L + CHUNK, np.float64)
        acc = np.empty(Dv, np.float64)
        for r in range(R):
            s = S[r]
            n = nvis[r]
            ms, nc = chunk_max(s, n, np.float32(slope), pos[r], cm)
            if n <= kk:
                count = n
                for j in range(n):
                    cv[j] = s[j]
                    ci[j] = j
            else:
                bound = kth_largest(cm, nc, kk, top) if nc >= kk else np.float32(-np.inf)
                thr = np.nextafter(bound, np.float32(-np.inf))  # keep keys equal to the bound
                kc = 0
                for c in range(nc):
                    cmi[kc] = c
                    kc += cm[c] > thr
                count = collect(s, n, cmi, kc, thr, cv, ci, L)
                kth = kth_largest(cv, count, kk, top)
                kept = 0
                for a in range(count):
                    if cv[a] >= kth:
                        cv[kept] = cv[a]
                        ci[kept] = ci[a]
                        kept += 1
                count = kept
            m = np.float64(ms)
            tot = 0.0
            for a in range(count):
                w[a] = np.exp(np.float64(cv[a]) - m)
                tot += w[a]
            for d in range(Dv):
                acc[d] = 0.0
            for a in range(count):
                vrow = V[ci[a]]
                for d in range(Dv):
                    acc[d] += w[a] * vrow[d]
            orow = out[row0 + r]
            for d in range(Dv):
                orow[d] = acc[d] / tot
            if want[r]:
                h = 0.0
                nonzero = 0
                for a in range(count):
                    p = w[a] / tot
                    if np.float32(p) > 0.0:
                        nonzero += 1
                        h -= p * np.log(p)
                ent[row0 + r] = h / np.log(nstat[r]) if nstat[r] > 1 else 0.0
                sup[row0 + r] = nonzero

    return rows


def _check(kernel: Any) -> None:
    """Top-1 of keys scoring (0.5, −0.25, 2.0) for a row that sees the first two: value 1 of key 0."""
    out = np.zeros((1, 1), np.float32)
    stats = np.zeros(1, np.float32)
    pos, visible = np.array([1], np.int64), np.array([2], np.int64)
    kernel(np.array([[0.5, -0.25, 2.0]], np.float32), np.array([[1.0], [-1.0], [5.0]], np.float32), out,
           stats, stats.copy(), 0, pos, visible, visible, 0.0, 1, np.ones(1, np.bool_))
    if out[0, 0] != 1.0:
        raise RuntimeError(f"top-k kernel self-test gave {out[0, 0]}")


#: The row kernel, compiled and checked on first use.
KERNEL = Kernel("the fused CPU top-k kernel", _build_kernel, _check)


def fused_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The engine's ``fused`` path for a ``TopK`` normalizer."""
    assert isinstance(normalizer, TopK)
    return fused_topk_attention(q, k, v, prob, normalizer.k, rows)


@torch.no_grad()
def fused_topk_attention(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, top: int, rows: Tensor | None,
    *, threads: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Exact top-k softmax attention on CPU; returns (out, entropy, support) (diagnostic rows)."""
    kernel = KERNEL.get()
    job = RowJob.prepare(q, k, v, prob, np.full(prob.H, prob.scale), np.ones(prob.H), rows)

    def work(bh: int, r0: int, n_rows: int, kmax: int, buf: Tensor) -> int:
        r1 = r0 + n_rows
        # The k-th largest score is at least that of the k nearest keys: a margin of ``top``.
        j0 = job.window_start(bh, r0, r1, extra=top + 1)
        S = buf[: n_rows * (kmax - j0)].view(n_rows, kmax - j0)
        torch.mm(job.qs[bh, r0:r1], job.kf[bh, j0:kmax].t(), out=S)
        kernel(S.numpy(), job.vf[bh, j0:], job.out[bh], job.ent[bh], job.sup[bh], r0, job.pos[r0:r1] - j0,
               job.nvis[r0:r1] - j0, job.nvis[r0:r1], float(job.slope[bh % prob.H]), int(top),
               job.want[r0:r1])
        return 0

    job.run(work, threads, _MAX_BLOCK_ROWS)
    return job.result(v, rows)
