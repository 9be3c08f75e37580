"""Stick-breaking attention on CPU in float32: BLAS score tiles and vectorized numba passes per tile.

The walk is the torch path's (``reference/stickbreaking.py``): per head and block of query rows,
key tiles from the nearest back, the log of the stick left carried from tile to tile in float64,
and an exact stop once it is below what float32 holds. What differs is the cost per score. In
torch a tile takes a dozen passes (softplus alone, with its log1p, costs more than the scores' BLAS
product); here the scores come transposed, keys × rows, so that numba's loops over a key's rows
vectorize across rows and the stick's running sum along the keys is a plain vector add. numba has
no vector math library here, so e^x is ``jit.exp_f32`` and log(1 + t) for t = e^(−|z|) ∈ (0, 1] a
polynomial (``jit.LOG1P_OVER_T``): both vectorize, each within a few float32 ulps.

softplus(z) = max(z, 0) + log(1 + e^(−|z|)) and −log σ(z) = softplus(−z) = max(−z, 0) + the same
log term, so one exponential and one logarithm give both; a second exponential gives the weight.
That is twice softmax's transcendental work per score, on AVX2 where torch's SDPA has AVX-512:
where every stick reaches back over every key this path costs about 2× SDPA, where sticks run out
(β ≈ ½: a few hundred keys) a fraction of it (``benchmarks/README.md``). The diagnostics (−Σ w·log w,
w > 0) are summed for the diagnostic rows alone, from the log-weights each tile leaves behind.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels.cpu import jit
from lengthgen.kernels.cpu.blocks import run_blocks
from lengthgen.kernels.cpu.jit import FASTMATH, Kernel
from lengthgen.kernels.diagnostics import normalize_entropy
from lengthgen.kernels.normalizers import Normalizer, StickBreaking
from lengthgen.kernels.problem import AttnProblem
from lengthgen.kernels.reference.stickbreaking import exhausted_below, limits, tile_sizes

__all__ = ["KERNEL", "MASKED", "fused_path"]

#: The score of a key that does not break a row's stick (its own token, later keys): β = 0 exactly
#: in the kernel's arithmetic, finite so that fast-math may assume no NaN or infinity.
MASKED = -1e30



# The kernels live at module level, not in a closure built on first use: numba's cache keeps them
# across processes only so (defined in a closure they compiled again in every process, 8 s).
if jit.NUMBA_ERROR is None:
    _exp, _njit, _log1p_unit = jit.exp_f32, jit.njit, jit.log1p_unit

    # Each loop below writes at most two arrays: LLVM vectorizes a loop only when it can check at
    # run time that its arrays do not overlap, and gives up past a handful of such checks (one loop
    # writing four arrays ran 20 ns per score, scalar). Split in two, 1.15 ns; as one loop writing
    # two, 1.6 ns (measured side by side).
    @_njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def _logs(z_row, start, run, keep, log_w):  # noqa: ANN001, ANN202
        """One key for every row: log(1 − β) into keep, log w = start + run + log β into log_w.

        e^(−|z|) is taken at |z| ≤ 40 at most: beyond, the term it adds is below 4e-18, and smaller
        arguments (the masked keys' −1e30) would make the polynomial's products subnormal, which
        costs a hundred cycles per value (measured: the masked half of a tile as long as the rest)."""
        for r in range(z_row.shape[0]):
            z = z_row[r]
            lg = _log1p_unit(_exp(-min(abs(z), np.float32(40.0))))
            keep[r] = -(max(z, np.float32(0.0)) + lg)
            log_w[r] = (start[r] + run[r]) - (max(-z, np.float32(0.0)) + lg)

    @_njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def _weights(log_w, w_row, zero_below):  # noqa: ANN001, ANN202
        """w = e^(log w), 0 at or below ``zero_below`` (where float32's e^x is 0). numba's exp, not
        torch's: its subnormal results and its −1e30 arguments cost 10-40 ns each (measured)."""
        for r in range(log_w.shape[0]):
            x = log_w[r]
            w_row[r] = _exp(x) if x > zero_below else np.float32(0.0)

    @_njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def _add(run, keep):  # noqa: ANN001, ANN202
        for r in range(run.shape[0]):
            run[r] += keep[r]

    @_njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def _tile(ST, base, W, zero_below):  # noqa: ANN001, ANN202
        """One tile of C keys for R rows, scores ST (C, R) transposed, nearest key last.

        ``base`` (R,) float64 is each row's log-stick left by the nearer tiles and gets this tile's
        Σ log(1 − β) added. A key that does not break a row's stick scores ``MASKED`` there: its
        log-weight is about −1e30 and its log(1 − β) −4e-18, nothing. Writes the weights W (C, R)
        and returns the largest log-stick left.
        """
        C, R = ST.shape
        start = base.astype(np.float32)
        run = np.zeros(R, np.float32)  # this tile's own sum, small: the carry stays in float64
        keep = np.empty(R, np.float32)
        log_w = np.empty(R, np.float32)
        for jj in range(C):
            j = C - 1 - jj
            _logs(ST[j], start, run, keep, log_w)
            _weights(log_w, W[j], zero_below)
            _add(run, keep)
        top = -np.inf
        for r in range(R):
            base[r] += np.float64(run[r])
            top = max(top, base[r])
        return top

    @_njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def _log(w):  # noqa: ANN001, ANN202
        """log w for a normal positive float32 w: its exponent times ln 2 plus log(m), m ∈ [1, 2)
        (a quarter of a call to the C library's log)."""
        bits = np.float32(w).view(np.int32)
        m = np.int32((bits & np.int32(0x007FFFFF)) | np.int32(0x3F800000)).view(np.float32)
        return np.float32((bits >> np.int32(23)) - np.int32(127)) * np.float32(0.6931471805599453) \
            + _log1p_unit(m - np.float32(1.0))

    @_njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def _tally(W, rows, ent, sup):  # noqa: ANN001, ANN202
        """For the diagnostic rows (columns of the weights W): −Σ w·log w and #{w > 0}; a few
        columns, key by key (a weight e^x with x below −87 is held as e^−87: its w·log w differs by
        less than 1e-36)."""
        for j in range(W.shape[0]):
            for r in rows:
                w = W[j, r]
                if w > 0.0:
                    ent[r] -= np.float64(w * _log(w))
                    sup[r] += 1.0


def _build_kernel() -> Any:
    """The tile kernels (numba compiles them, or loads them from its cache, on the first call)."""
    if jit.NUMBA_ERROR is not None:
        raise jit.NUMBA_ERROR
    return _tile, _tally


def _check(kernels: Any) -> None:
    """One row, two keys before its own token, scores 1 and −1 (the nearer): w = σ(−1), σ(1)·σ(1)."""
    tile, tally = kernels
    LW = np.zeros((2, 1), np.float32)
    base, ent, sup = np.zeros(1, np.float64), np.zeros(1, np.float64), np.zeros(1, np.float64)
    tile(np.array([[1.0], [-1.0]], np.float32), base, LW, np.float32(-104.0))
    tally(LW, np.zeros(1, np.int64), ent, sup)
    sig = 1.0 / (1.0 + np.exp(-1.0))  # σ(1); σ(−1) = 1 − σ(1)
    want = np.array([sig * sig, 1.0 - sig])
    kept = np.log(sig) + np.log(1.0 - sig)
    if not (np.abs(LW[:, 0] - want).max() < 1e-6 and abs(base[0] - kept) < 1e-6 and sup[0] == 2
            and abs(ent[0] + float((want * np.log(want)).sum())) < 1e-6):
        raise RuntimeError(f"stick-breaking tile self-test gave {LW[:, 0]}, not {want}")


#: The tile kernels, compiled and checked on first use.
KERNEL = Kernel("the CPU stick-breaking kernel", _build_kernel, _check)


@torch.no_grad()
def fused_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The engine's ``fused`` path for ``StickBreaking`` on float32 CPU tensors."""
    assert isinstance(normalizer, StickBreaking)
    if q.device.type != "cpu":
        raise ValueError(f"the fused CPU path runs on CPU tensors, got {q.device}")
    tile, tally = KERNEL.get()
    B, H, Nq = prob.B, prob.H, prob.Nq
    qs = (q.float() * prob.scale).contiguous()
    kf, vf = k.float().contiguous(), v.float().contiguous()
    out = torch.empty((B, H, Nq, v.shape[-1]), dtype=torch.float32)
    entropy = np.zeros((B * H, Nq), np.float64)
    support = np.zeros((B * H, Nq), np.float64)
    wanted = np.zeros(Nq, np.bool_)
    if rows is not None:
        wanted[rows.cpu().numpy()] = True
    last = limits(prob, normalizer)
    pos = prob.q_positions
    block_rows, width = tile_sizes(1)
    zero_below = np.float32(exhausted_below(torch.float32) + 1.0)
    stop_below = exhausted_below(torch.float32)
    slopes = prob.slopes.tolist()
    cum = prob.cumulative

    def work(bh: int, r0: int, n_rows: int, keys: int, buf: Tensor) -> int:
        """One head's block of rows, key tiles nearest first (the per-tile Python kept to a few calls:
        a tile of 256 × 512 scores costs about 0.2 ms)."""
        b, h = divmod(bh, H)
        r1 = r0 + n_rows
        k_bh, v_bh, q_t = kf[b, h], vf[b, h], qs[b, h, r0:r1].t()
        scores = buf[: width * n_rows].view(width, n_rows)
        weights = buf[width * n_rows : 2 * width * n_rows].view(width, n_rows)
        scores_np, weights_np = scores.numpy(), weights.numpy()
        base = np.zeros(n_rows, np.float64)
        chosen = np.flatnonzero(wanted[r0:r1])
        ent, sup = entropy[bh, r0:r1], support[bh, r0:r1]
        lim = last[r0:r1]
        lim_min = int(lim.min())
        acc = torch.zeros((n_rows, vf.shape[-1]), dtype=torch.float32)
        for t1 in range(keys, 0, -width):
            t0 = max(0, t1 - width)
            ST, W = scores[: t1 - t0], weights[: t1 - t0]
            torch.mm(k_bh[t0:t1], q_t, out=ST)
            if slopes[h] != 0.0 or cum is not None:
                ST += _bias_tile(slopes[h], None if cum is None else cum[b, h], pos[r0:r1], t0, t1)
            if t1 > lim_min:  # keys that do not break some row's stick: its own token and later ones
                ST.masked_fill_(torch.arange(t0, t1)[:, None] >= lim[None, :], MASKED)
            top = tile(scores_np[: t1 - t0], base, weights_np[: t1 - t0], zero_below)
            if chosen.size:
                tally(weights_np[: t1 - t0], chosen, ent, sup)
            acc.addmm_(W.t(), v_bh[t0:t1])
            if top < stop_below:
                break
        if normalizer.current == "leftover":
            own = np.exp(base)
            acc += torch.from_numpy(own).float()[:, None] * v_bh[pos[r0:r1]]
            ent[chosen] -= own[chosen] * base[chosen]
            sup[chosen] += own[chosen] > 0
        out[b, h, r0:r1] = acc
        return 0

    items = [(bh, r0, min(Nq, r0 + block_rows) - r0, int(last[r0 : r0 + block_rows].max()))
             for bh in range(B * H) for r0 in range(0, Nq, block_rows)]
    run_blocks(work, items, 2 * width * block_rows, None)
    if rows is None:
        return out.to(v.dtype), None, None
    rows = rows.cpu()
    ent_t = torch.from_numpy(entropy).view(B, H, Nq)[:, :, rows]
    return (out.to(v.dtype), normalize_entropy(ent_t, prob.visible()[rows]),
            torch.from_numpy(support).view(B, H, Nq)[:, :, rows].float())


def _bias_tile(slope: float, cum: Tensor | None, pos: Tensor, t0: int, t1: int) -> Tensor:
    """The ALiBi and cumulative bias of keys t0 … t1 − 1 (rows) for query rows at ``pos`` (columns)."""
    keys = torch.arange(t0, t1)
    bias = torch.zeros((t1 - t0, pos.numel()), dtype=torch.float64)
    if slope != 0.0:
        bias -= slope * (pos[None, :] - keys[:, None]).double()
    if cum is not None:
        bias += cum[pos][None, :] - cum[t0:t1, None]
    return bias.float()
