"""Fast exact α-entmax attention on CPU: BLAS score blocks + a numba row kernel.

Why this split. The one expensive thing is QKᵀ (2·D flops per visible pair); everything else is
linear in the number of candidate keys. The best QKᵀ a CPU can do is a BLAS sgemm, which torch
already ships (MKL/oneDNN; several times what numba's auto-vectorized loops reached on the
development machine). So the work is cut into (head, query block) items whose score block fits a
reused per-thread buffer (no Nq×Nk allocation); each worker thread computes its block with one
single-threaded ``torch.mm`` and hands it to a single-threaded, GIL-free numba kernel that, per row:

1. adds the ALiBi bias (slope and α−1 folded in) and takes maxima of 16-key chunks, m = row max;
2. bounds τ from below by τ of the chunk maxima (a subset of the keys, so its τ is never larger),
   much tighter than the generic m − 1 (τ ∈ [m − 1, m − n^(1−α)] for x = (α−1)z);
3. collects the keys above that bound, scanning only chunks whose maximum is above it, into a small
   buffer (``cap``); a row with more candidates (flat scores) is a dense row: it keeps its scores
   in place, gets its probabilities written over them, and the caller finishes it with one BLAS P·V;
4. solves τ by Newton from the bound: f(τ) = Σ[x − τ]_+^(1/(α−1)) − 1 is convex and decreasing, so
   the iterates increase monotonically to the root and keys at or below the current τ are dropped
   for good; for α = 1.5 and α = 2 the final τ is the closed form on the found support;
5. o = Σ p_j v_j over the support only (sparse PV), plus entropy/support if asked.

Heads with an ALiBi slope skip keys further left than a proven bound (see ``window_start``). τ's
arithmetic is fp64 on the candidates; scores and outputs are fp32. Threads pull items biggest
first; one thread per torch intra-op thread.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels.cpu.blocks import RowJob
from lengthgen.kernels.cpu.entmax_newton import MAX_NEWTON, MODE_15, MODE_GENERAL, STEP_TOL, newton_params
from lengthgen.kernels.cpu.jit import CHUNK, FASTMATH, Kernel, njit, numba
from lengthgen.kernels.problem import AttnProblem

__all__ = ["KERNEL", "fused_entmax_attention"]

if numba is not None:
    from lengthgen.kernels.cpu.entmax_newton import newton as _newton
    from lengthgen.kernels.cpu.entmax_newton import newton_step as _step
    from lengthgen.kernels.cpu.entmax_newton import powm1 as _powm1
    from lengthgen.kernels.cpu.entmax_newton import threshold_sums as _sums
    from lengthgen.kernels.cpu.jit import chunk_max as _chunk_max
    from lengthgen.kernels.cpu.jit import collect as _collect


#: Dense rows: every this-many-th key goes into the sample that gives Newton its start.
_SAMPLE_STRIDE = 16
#: ...solved on the sample to this relative accuracy of S (the sample's own error is larger).
_SAMPLE_TOL = 1e-3
#: Dense rows, α = 1.5 and 2: the closed form of a pass is checked once its S is within this of 1.
_VERIFY_AT = 1e-3
#: Upper bound on query rows per score block (keeps enough blocks for the threads at small N).
_MAX_BLOCK_ROWS = 512


if numba is not None:

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _keys_above(s, n, c):  # noqa: ANN001, ANN202
        """#{j < n : s[j] > c} for an fp64 threshold c, compared in float32 (a 16-wide count)."""
        cf = np.float32(c)
        if np.float64(cf) > c:  # the largest float32 ≤ c: x > c ⟺ x > cf for every float32 x
            cf = np.nextafter(cf, np.float32(-np.inf))
        k = 0
        for j in range(n):
            k += np.int64(s[j] > cf)
        return k

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _sample_start(s, n, m, tau0, e, em1, em1_int, mode, smp):  # noqa: ANN001, ANN202
        """An estimate of τ (relative to m) from every ``_SAMPLE_STRIDE``-th key of the row.

        On the sample, Σ[x − t]_+^e is about the row's times the sampled fraction r, so Newton
        solves Σ_sample = r from the proven bound ``tau0``, in passes over a buffer that stays
        in L1. The row's solve then starts near its root (|S − 1| of a few percent on flat rows
        instead of 3-4 from the bound), which saves two to three full passes. Not a bound:
        ``_newton_dense`` converges from either side. Returns ``tau0`` when the sample gives
        nothing better.
        """
        ns = 0
        for j in range(0, n, _SAMPLE_STRIDE):
            smp[ns] = s[j]
            ns += 1
        r = ns / n
        tau = tau0
        for _ in range(MAX_NEWTON):
            S, W, _k = _sums(smp, ns, m + tau, em1, em1_int, mode)
            if W <= 0.0:
                return tau0
            S /= r
            step = _step(S, W / r, e)
            tau += step
            if abs(S - 1.0) <= _SAMPLE_TOL or abs(step) <= STEP_TOL:
                break
        return tau if tau0 < tau < 0.0 else tau0

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _newton_dense(s, n, m, tau, e, em1, em1_int, mode):  # noqa: ANN001, ANN202
        """τ (relative to m) over the whole row s[:n] in place of a candidate buffer (dense rows).

        Newton on h(τ) = S^(1/e) − 1 (``_step``) in full branch-free passes (``threshold_sums``),
        from a start on either side of the root: h is convex and decreasing, so a step from the
        right lands on the left, and from there the iterates increase monotonically.

        For α = 1.5 and α = 2 a pass at c left of the root also gives the closed-form τ_c of the
        support {x > c} (the sums of x − c over it are S, W and k). Near the root a 16-wide
        counting pass checks it: as many keys above τ_c as above c means no key in (c, τ_c],
        so {x > τ_c} is that support and τ_c is the exact threshold. That ends the solve a pass
        or two before Newton's step falls below its tolerance, with no closing pass.
        """
        for _ in range(MAX_NEWTON):
            c = m + tau
            S, W, k = _sums(s, n, c, em1, em1_int, mode)
            if W <= 0.0:
                break
            if S >= 1.0 and S - 1.0 <= _VERIFY_AT and mode != MODE_GENERAL:
                t_cf = -np.inf
                if mode == MODE_15:  # Σ(y − t)² = 1 over the support, y = x − c: Σy = W, Σy² = S
                    mean = W / k
                    delta = (1.0 - (S - W * mean)) / k
                    if delta >= 0.0:
                        t_cf = tau + mean - np.sqrt(delta)
                else:
                    t_cf = tau + (S - 1.0) / k
                if t_cf >= tau and _keys_above(s, n, m + t_cf) == k:
                    return t_cf
            step = _step(S, W, e)
            tau += step
            if abs(step) <= STEP_TOL:
                break
        return tau

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _dense_probs(s, n, L, m, tau, em1, em1_int, stats):  # noqa: ANN001, ANN202
        """Overwrite the score row s[:L] with unnormalized weights [x − τ]_+^e in one pass.

        Returns (their sum, the number of positive float32 weights, the entropy of the normalized
        row when ``stats``, else 0); the caller divides the row's P·V by the sum.
        """
        c = m + tau
        tot = 0.0
        k = 0
        for j in range(n):
            d = max(np.float64(s[j]) - c, 0.0)
            pj = np.float32(_powm1(d, em1, em1_int) * d if d > 0.0 else 0.0)
            s[j] = pj
            tot += pj
            k += pj > 0.0
        for j in range(n, L):
            s[j] = np.float32(0.0)
        if not stats or tot <= 0.0:
            return tot, k, 0.0
        hs = 0.0
        for j in range(n):
            pj = np.float64(s[j])
            if pj > 0.0:
                hs -= pj * np.log(pj)
        return tot, k, hs / tot + np.log(tot)

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def _task(S, V, out, ent, sup, dense, row0, pos, nvis, nstat, H, slope, expo, mode, em1_int, cap, group, want, task):  # noqa: ANN001, ANN202, E501
        """Rows g·group … of one batch·head; returns how many rows took the dense path.

        Dense rows (more than ``cap`` candidates) get their unnormalized weights written over
        their scores in S and dense[bh, r] = 1 / their sum (0 for the other rows): the caller
        finishes them with one BLAS P·V, scaled by it.
        """
        BH, R, L = S.shape
        D = V.shape[2]
        ngroups = (R + group - 1) // group
        bh = task // ngroups
        g = task % ngroups
        h = bh % H
        sl = np.float32(slope[h])
        e = expo[h]
        em1 = e - 1.0
        ei = em1_int[h]
        md = mode[h]
        n_chunk_max = L // min(CHUNK, _SAMPLE_STRIDE) + 1  # cmv also holds a dense row's sample
        cv = np.empty(cap + CHUNK, np.float32)
        ci = np.empty(cap + CHUNK, np.int64)
        cm = np.empty(n_chunk_max, np.float32)
        cmv = np.empty(n_chunk_max, np.float32)
        cmi = np.empty(n_chunk_max, np.int64)
        acc = np.empty(D, np.float64)
        n_dense = 0
        for r in range(g * group, min(R, g * group + group)):
            stats = want[r]
            s = S[bh, r]
            n = nvis[r]
            ms, nc = _chunk_max(s, n, sl, pos[r], cm)
            m = np.float64(ms)
            # Lower bound of τ from the chunk maxima (a subset of the keys: its τ is ≤ the row's).
            thr = np.float32(m - 1.0)
            kc = 0
            for c in range(nc):
                x = cm[c]
                cmv[kc] = x
                cmi[kc] = c
                kc += x > thr
            kc, tau0 = _newton(cmv, cmi, kc, m, -1.0, e, em1, ei, md)
            thr = np.float32(m + tau0)
            if np.float64(thr) > m + tau0:  # round the threshold down, never up
                thr = np.nextafter(thr, np.float32(-np.inf))
            # Candidates: keys above the bound, only in the chunks whose maximum is above it.
            k = _collect(s, n, cmi, kc, thr, cv, ci, cap) if kc <= cap else -1
            if k < 0:
                n_dense += 1
                tau = _sample_start(s, n, m, tau0, e, em1, ei, md, cmv)
                tau = _newton_dense(s, n, m, tau, e, em1, ei, md)
                tot, k, hs = _dense_probs(s, n, L, m, tau, em1, ei, stats)
                dense[bh, r] = 1.0 / tot if tot > 0.0 else 1.0
                if stats:
                    ns = nstat[r]
                    ent[bh, row0 + r] = hs / np.log(ns) if ns > 1 else 0.0
                    sup[bh, row0 + r] = k
                continue
            k, tau = _newton(cv, ci, k, m, tau0, e, em1, ei, md)
            # p_j = (x_j − τ)^e on the support, normalized by its exact sum; o = Σ p_j v_j.
            for dd in range(D):
                acc[dd] = 0.0
            c = m + tau
            tot = 0.0
            hs = 0.0
            for a in range(k):
                d = np.float64(cv[a]) - c
                pj = _powm1(d, em1, ei) * d
                tot += pj
                if stats and pj > 0.0:
                    hs -= pj * np.log(pj)
                vrow = V[bh, ci[a]]
                for dd in range(D):
                    acc[dd] += pj * vrow[dd]
            inv = 1.0 / tot if tot > 0.0 else 0.0
            orow = out[bh, row0 + r]
            for dd in range(D):
                orow[dd] = acc[dd] * inv
            if stats:
                # −Σ p̂ log p̂ with p̂ = p/tot equals (−Σ p log p)/tot + log tot.
                h_row = hs * inv + np.log(tot) if tot > 0.0 else 0.0
                ns = nstat[r]
                ent[bh, row0 + r] = h_row / np.log(ns) if ns > 1 else 0.0
                sup[bh, row0 + r] = k
        return n_dense

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def rows_kernel(S, V, out, ent, sup, dense, row0, pos, nvis, nstat, H, slope, expo, mode, em1_int, cap, want):  # noqa: ANN001, ANN202, E501
        """One block of scores S (BH, R, L) into out/ent/sup rows row0 …; returns #dense rows.

        Key t of S and V is key j0 + t of the sequence for a window start j0 the caller chose:
        ``pos`` and ``nvis`` are relative to it, ``nstat`` holds the true visible counts (entropy).
        ``want`` (R,) flags the rows whose entropy and support are wanted (the diagnostic rows).
        Single-threaded and GIL-free: the wrapper runs one block per worker thread.
        """
        BH, R, L = S.shape
        n_dense = 0
        for bh in range(BH):
            n_dense += _task(
                S, V, out, ent, sup, dense, row0, pos, nvis, nstat, H, slope, expo, mode, em1_int, cap, R,
                want, bh,
            )
        return n_dense


def _smoke(kernel: Any) -> None:
    """Compile (or load from numba's cache) and run the kernel once on a 1×1×2 problem."""
    S = np.array([[[0.5, -0.25]]], np.float32)
    V = np.ones((1, 2, 1), np.float32)
    out = np.zeros((1, 1, 1), np.float32)
    st = np.zeros((1, 1), np.float32)
    one = np.ones(1, np.float64)
    ints = np.array([1], np.int64)
    dense = np.zeros((1, 1), np.float32)
    n = ints + 1
    want = np.ones(1, np.bool_)
    kernel(S, V, out, st, st.copy(), dense, 0, ints, n, n, 1, one * 0, one * 2, ints, ints, 4, want)
    if not abs(float(out[0, 0, 0]) - 1.0) < 1e-6:
        raise RuntimeError(f"fused kernel smoke test gave {out[0, 0, 0]}")


#: The fused row kernel, compiled and checked on first use.
KERNEL = Kernel("the fused CPU α-entmax kernel", lambda: rows_kernel, _smoke)


@torch.no_grad()
def fused_entmax_attention(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, alpha: Tensor, rows: Tensor | None, *,
    cap: int = 2048, threads: int | None = None,
) -> tuple[Tensor, Tensor | None, Tensor | None, int]:
    """Exact α-entmax attention on CPU; returns (out, entropy, support, dense_rows).

    ``alpha`` (H,) float64; ``rows``: the diagnostic rows (or None). ``dense_rows`` counts
    (batch·head, row) pairs whose candidates exceeded ``cap`` and took the dense path (a test
    hook). Query blocks follow ``chunking.plan_chunks`` per head, one score buffer per thread.
    ``threads``: worker threads (default: torch's intra-op thread count).
    """
    kernel = KERNEL.get()
    a = alpha.numpy()
    # Work in x = (α−1)·z: scale·(α−1) into q, (α−1) into the slopes.
    job = RowJob.prepare(q, k, v, prob, prob.scale * (a - 1.0), a - 1.0, rows)
    H = prob.H
    expo, mode, em1_int = newton_params(a)
    vt = torch.from_numpy(job.vf)
    pos, nvis = job.pos, job.nvis

    def work(bh: int, r0: int, rows: int, kmax: int, buf: Tensor) -> int:
        """One head, one query block: BLAS scores, numba rows, BLAS P·V for dense rows."""
        r1 = r0 + rows
        # Every candidate has x_ij > max_j x_ij − 1 (τ ≥ max − 1): a margin of 1 in x units.
        j0 = job.window_start(bh, r0, r1, extra=2.0)
        width = kmax - j0
        h = slice(bh % H, bh % H + 1)
        one = slice(bh, bh + 1)
        S = buf[: rows * width].view(rows, width)
        torch.mm(job.qs[bh, r0:r1], job.kf[bh, j0:kmax].t(), out=S)
        dense = np.zeros((1, rows), np.float32)
        n_dense = int(
            kernel(
                S.numpy()[None], job.vf[one, j0:], job.out[one], job.ent[one], job.sup[one], dense, r0,
                pos[r0:r1] - j0, nvis[r0:r1] - j0, nvis[r0:r1], 1, job.slope[h], expo[h], mode[h], em1_int[h],
                int(cap), job.want[r0:r1],
            )
        )
        if n_dense:
            # Dense rows: S now holds their unnormalized weights; one BLAS P·V finishes them.
            if n_dense == rows:
                job.out[bh, r0:r1] = torch.mm(S, vt[bh, j0:kmax]).numpy() * dense[0, :, None]
            else:
                rows_d = np.nonzero(dense[0])[0]
                pv = torch.mm(S[torch.from_numpy(rows_d)], vt[bh, j0:kmax]).numpy()
                job.out[bh, r0 + rows_d] = pv * dense[0, rows_d, None]
        return n_dense

    n_over = job.run(work, threads, _MAX_BLOCK_ROWS)
    return (*job.result(v, rows), n_over)
