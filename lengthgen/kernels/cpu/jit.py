"""numba for the CPU kernels: whether it imports, its compiler flags, each kernel's own lazy
compile and self-test (``Kernel``), and the row helpers several kernels share.

Why one module: every numba kernel needs the same import guard and flags, and the helpers below are
used by more than one kernel. Each kernel is compiled and checked on its own (``Kernel``), so a
kernel that fails to compile or gives a wrong answer switches off that kernel alone; the engine
asks each one whether it is available (``lengthgen.kernels.engine``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from lengthgen.errors import exception_line

try:  # numba is a dependency, but keep the package importable (and the torch paths usable) without it
    import numba
    from numba import njit

    NUMBA_ERROR: BaseException | None = None
except Exception as exc:  # pragma: no cover - exercised only where numba is missing
    numba = None
    njit = None
    NUMBA_ERROR = exc

__all__ = ["CHUNK", "FASTMATH", "FASTMATH_EXACT_ORDER", "FASTMATH_WITH_NAN", "LOG1P_OVER_T", "NUMBA_ERROR",
           "Kernel", "exp_f32", "log1p_unit", "njit", "numba"]

# No "ninf": the kernels start reductions at −inf. "nnan" is safe because every score is finite (the
# callers reject or route away non-finite inputs) and lets LLVM vectorize the max reductions.
FASTMATH = {"nsz", "arcp", "contract", "reassoc", "nnan"}
#: The training row solver's flags: its rows hold −inf for masked keys, and it was measured and
#: validated without "nnan" (``cpu/entmax_rows.py``).
FASTMATH_WITH_NAN = FASTMATH - {"nnan"}
#: Without "reassoc", which would let LLVM fold a two-part constant back into one (``cpu/entropy.py``).
FASTMATH_EXACT_ORDER = FASTMATH - {"reassoc"}

#: Scores are scanned in chunks of this many keys; a chunk whose maximum is below a row's bound is
#: skipped without looking at its keys.
CHUNK = 16


#: log(1 + t)/t on [0, 1], least squares at 4,000 Chebyshev nodes by a degree-8 polynomial (ascending
#: powers): relative error 3e-8 in float64, 1.5e-7 evaluated in float32, without the division that
#: log1p's atanh series needs (measured 15% less time per score).
LOG1P_OVER_T = (
    1.0, -0.49999502301216125, 0.33319270610809326, -0.24844369292259216,
    0.19111430644989014, -0.13674770295619965, 0.07836166769266129,
    -0.02958850748836994, 0.005253457929939032,
)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7, _C8 = (np.float32(c) for c in LOG1P_OVER_T)


class Kernel:
    """A numba kernel, compiled (or loaded from numba's cache) on first use and checked once on a
    tiny problem with a known answer; unavailable, with the reason, when numba is missing or either
    step fails. ``build`` returns the kernel; ``check`` raises if it computes the wrong thing."""

    def __init__(self, what: str, build: Callable[[], Any], check: Callable[[Any], None]) -> None:
        self.what = what
        self._build = build
        self._check = check
        self._kernel: Any = None
        self._error: BaseException | None = NUMBA_ERROR

    def _load(self) -> None:
        if self._kernel is None and self._error is None:
            try:
                kernel = self._build()
                self._check(kernel)
                self._kernel = kernel
            except Exception as exc:  # pragma: no cover - numba present but broken: a fallback, not a crash
                self._error = exc

    def unavailable_reason(self) -> str:
        """Why the kernel cannot run ('' when it can)."""
        self._load()
        if self._kernel is not None:
            return ""
        assert self._error is not None  # _load either compiled the kernel or kept why not
        return exception_line(self._error)

    def get(self) -> Any:
        """The compiled kernel; RuntimeError when it is unavailable."""
        reason = self.unavailable_reason()
        if reason:
            raise RuntimeError(f"{self.what} needs numba: {reason}")
        return self._kernel


if numba is not None:

    # No "reassoc": it would let LLVM fold the two-part ln 2 of the reduction back into one.
    @njit(cache=True, fastmath=FASTMATH_EXACT_ORDER, nogil=True)
    def exp_f32(u):  # noqa: ANN001, ANN201
        """e^u for float32 u ≤ 88 (u < −87 is taken as −87: 1.7e-38), branch-free so that loops
        calling it vectorize (numba has no vector math library here: its ``np.exp`` is a scalar call,
        2.3 ns, against 0.24 ns for this): a Cody–Waite reduction and a degree-7 polynomial, relative
        error below 1e-7. Callers clamp what they feed it, or treat u < −87 themselves."""
        u = min(max(u, np.float32(-87.0)), np.float32(88.0))
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

    @njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def log1p_unit(t):  # noqa: ANN001, ANN201
        """log(1 + t) for float32 t in [0, 1], to a relative 1.5e-7 (tiny t included): ``LOG1P_OVER_T``
        times t, branch-free so that loops calling it vectorize (the stick-breaking kernels' softplus)."""
        p = _C8
        p = p * t + _C7
        p = p * t + _C6
        p = p * t + _C5
        p = p * t + _C4
        p = p * t + _C3
        p = p * t + _C2
        p = p * t + _C1
        p = p * t + _C0
        return t * p

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def chunk_max(s, n, sl, p_r, cm):  # noqa: ANN001, ANN201
        """Add the ALiBi bias in place (sl ≠ 0), fill chunk maxima cm; return (row max, #chunks)."""
        if sl != 0.0:
            for j in range(n):
                s[j] += sl * np.float32(j - p_r)
        nc = n // CHUNK
        ms = np.float32(-np.inf)
        for c in range(nc):
            mc = np.float32(-np.inf)
            for t in range(CHUNK):
                mc = max(mc, s[c * CHUNK + t])
            cm[c] = mc
            ms = max(ms, mc)
        if nc * CHUNK < n:
            mc = np.float32(-np.inf)
            for j in range(nc * CHUNK, n):
                mc = max(mc, s[j])
            cm[nc] = mc
            ms = max(ms, mc)
            nc += 1
        return ms, nc

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def collect(s, n, chunks, n_chunks, thr, cv, ci, lim):  # noqa: ANN001, ANN201
        """Keys x > thr of the listed chunks into cv/ci (branch-free); −1 if more than ``lim``."""
        k = 0
        for a in range(n_chunks):
            j0 = chunks[a] * CHUNK
            j1 = min(n, j0 + CHUNK)
            for j in range(j0, j1):
                x = s[j]
                cv[k] = x
                ci[k] = j
                k += x > thr
            if k > lim:
                return -1
        return k

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def add_row_key_bias(S, row_hi, row_lo, key_hi, key_lo, factor):  # noqa: ANN001, ANN201
        """S[r, j] += factor[r]·((row_hi[r] − key_hi[j]) + (row_lo[r] − key_lo[j])), in one pass: a
        float64 bias c_r − c_j carried as float32 parts (``cpu/entropy.py``, ``add_cumulative_bias``)."""
        R, L = S.shape
        for r in range(R):
            hi, lo, f = row_hi[r], row_lo[r], factor[r]
            for j in range(L):
                S[r, j] += f * ((hi - key_hi[j]) + (lo - key_lo[j]))

    @njit(cache=True, fastmath=FASTMATH, nogil=True)
    def count_above(S, pos, slope, thr, out):  # noqa: ANN001, ANN201
        """out[r] = #{j ≤ pos[r] : S[r, j] − slope·(pos[r] − j) > thr[r]} (a softmax row's support)."""
        R, L = S.shape
        for r in range(R):
            n = min(L, pos[r] + 1)
            t = thr[r]
            c = 0
            sl = np.float32(slope)
            for j in range(n):
                c += (S[r, j] - sl * np.float32(pos[r] - j)) > t
            out[r] = c


def _check_count(kernel: Any) -> None:
    out = np.zeros(1, np.float32)
    kernel(np.array([[0.5, -0.25, 2.0]], np.float32), np.array([1], np.int64), 0.0,
           np.array([0.0], np.float32), out)
    if out[0] != 1:
        raise RuntimeError(f"support count self-test gave {out[0]}, not 1")


#: The support counter of the fused softmax path's diagnostics (``cpu/softmax.py``).
COUNT_ABOVE = Kernel("the CPU support count", lambda: count_above, _check_count)
