"""The monotone Newton solve of α-entmax's threshold τ, compiled with numba.

Why its own module: both the fused attention kernel (``cpu/entmax.py``) and the training row
solver (``cpu/entmax_rows.py``) find τ the same way.
"""

from __future__ import annotations

import numpy as np

from lengthgen.kernels.cpu.jit import FASTMATH, njit, numba

__all__ = ["MAX_NEWTON", "MODE_15", "MODE_2", "MODE_GENERAL", "STEP_TOL", "newton_params"]

MAX_NEWTON = 200
STEP_TOL = 1e-14
MODE_GENERAL, MODE_15, MODE_2 = 0, 1, 2


def newton_params(alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per α: the exponent e = 1/(α−1), the closed-form mode, and e − 1 as an integer (−1 if it
    is not a small integer), the arguments ``newton`` takes."""
    expo = 1.0 / (alpha - 1.0)
    mode = np.where(alpha == 1.5, MODE_15, np.where(alpha == 2.0, MODE_2, MODE_GENERAL)).astype(np.int64)
    em1 = expo - 1.0
    em1_int = np.where(np.abs(em1 - np.round(em1)) < 1e-12, np.round(em1), -1).astype(np.int64)
    em1_int = np.where(em1_int > 16, -1, em1_int).astype(np.int64)
    return expo.astype(np.float64), mode, em1_int


if numba is not None:

    @njit(cache=True, fastmath=FASTMATH, nogil=True, inline="always")
    def powm1(d: float, em1: float, em1_int: int) -> float:
        # d^(e−1) for d > 0; integer exponents (α = 2, 1.5, 4/3, 1.25, …) by multiplication.
        if em1_int == 0:
            return 1.0
        if em1_int > 0:
            r = d
            for _ in range(em1_int - 1):
                r *= d
            return r
        return d**em1

    @njit(cache=True, fastmath=FASTMATH, nogil=True, inline="always")
    def newton_step(S, W, e):  # noqa: ANN001, ANN202
        """Newton step on h(τ) = S(τ)^(1/e) − 1, S = Σ[x − τ]_+^e, W = Σ[x − τ]_+^(e−1).

        h is convex and decreasing like S − 1, so Newton from the left still never overshoots,
        and h is linear in τ when the live scores are equal: a flat row (dense support) needs one
        step where Newton on S − 1 needed ten and more (h' = −S^(1/e − 1)·W).
        """
        return (S - S ** (1.0 - 1.0 / e)) / W

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def compact(cv, ci, k, c):  # noqa: ANN001, ANN202
        """Keep the entries of cv[:k] (and ci) above c, in order; returns how many.

        Branch-free (every entry is written, the index advances by the comparison): with about
        half the entries dropping out, a branch here is mispredicted that often."""
        kk = 0
        for a in range(k):
            x = cv[a]
            i = ci[a]
            cv[kk] = x
            ci[kk] = i
            kk += np.int64(np.float64(x) - c > 0.0)
        return kk

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def threshold_sums(s, n, c, em1, em1_int, mode):  # noqa: ANN001, ANN202
        """One pass over s[:n] at the threshold c (absolute): S = Σ[x − c]_+^e,
        W = Σ[x − c]_+^(e−1) and k = #{x > c}, in fp64.

        Every term is a select, never a branch, so the loop vectorizes: a branch on x > c is
        mispredicted for about half the keys of a dense row (a closing pass written that way once
        cost more than all the Newton passes together).
        """
        S = 0.0
        W = 0.0
        k = 0
        if mode == MODE_15:
            for j in range(n):
                d = max(np.float64(s[j]) - c, 0.0)
                S += d * d
                W += d
                k += np.int64(d > 0.0)
        elif mode == MODE_2:
            for j in range(n):
                d = max(np.float64(s[j]) - c, 0.0)
                S += d
                k += np.int64(d > 0.0)
            W = np.float64(k)
        else:
            for j in range(n):
                d = max(np.float64(s[j]) - c, 0.0)
                pw = powm1(d, em1, em1_int) if d > 0.0 else 0.0
                S += pw * d
                W += pw
                k += np.int64(d > 0.0)
        return S, W, k

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def newton(cv, ci, k, m, tau, e, em1, em1_int, mode):  # noqa: ANN001, ANN202
        """τ (relative to m) on the values cv[:k] (float32, each > m − 1), from a lower bound ``tau``.

        f(τ) = Σ[cv − m − τ]_+^e − 1 is convex and decreasing, so Newton from the left increases
        monotonically to the root. Entries at or below the current τ can never return, so the buffer
        is compacted whenever half of it has dropped out; on return cv[:k] is exactly the support.
        For α = 1.5 and α = 2 the final τ is the closed form on that support.
        """
        for _ in range(MAX_NEWTON):
            c = m + tau
            S, fp, act = threshold_sums(cv, k, c, em1, em1_int, mode)
            f = S - 1.0
            if 2 * act < k:
                k = compact(cv, ci, k, c)
            if f <= 0.0 or fp <= 0.0:
                break
            step = newton_step(S, fp, e)
            tau += step
            if step <= STEP_TOL:
                break
        k = compact(cv, ci, k, m + tau)
        if mode != MODE_GENERAL and k > 0:
            s1 = 0.0
            s2 = 0.0
            lo = np.inf
            for a in range(k):
                x = np.float64(cv[a]) - m
                s1 += x
                s2 += x * x
                lo = min(lo, x)
            if mode == MODE_15:
                mean = s1 / k
                delta = (1.0 - (s2 - s1 * mean)) / k
                t = mean - np.sqrt(max(delta, 0.0))
            else:
                t = (s1 - 1.0) / k
            if t < lo:  # consistent with the support found (guards ties at its edge)
                tau = t
        return k, tau
