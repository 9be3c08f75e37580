"""Stick-breaking attention on CPU in float32: BLAS score tiles and one vectorized numba pass per tile.

The walk is the torch path's (``reference/stickbreaking.py``): per head and block of query rows,
key tiles from the nearest back, the log of the stick left carried from tile to tile, and an exact
stop once it is below what float32 holds. What differs is the cost per score. In torch a tile
takes a dozen passes (softplus alone, with its log1p, costs more than the scores' BLAS product);
here the scores come transposed, keys × rows, so that one numba loop over a key's rows does
everything in registers and vectorizes across rows: the stick's running sum along the keys is then
a plain vector add. numba has no vector math library here, so e^x is ``jit.exp_f32`` and
log(1 + e) for e = e^(−|z|) ∈ (0, 1] is 2·atanh(e / (2 + e)) by its series (``_log1p_unit``):
both are polynomials that vectorize, each within a few float32 ulps.

softplus(z) = max(z, 0) + log(1 + e^(−|z|)) and −log σ(z) = softplus(−z) = max(−z, 0) + the same
log term, so one exponential and one logarithm give both. Diagnostics (−Σ w·log w and w > 0) are
summed for every row in the same loop, which costs less than picking rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

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


def _build_kernel() -> Any:
    """Define the tile kernel (numba compiles it, or loads it from its cache, on the first call)."""
    from lengthgen.kernels.cpu.jit import exp_f32, njit

    @njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def log1p_unit(e):  # noqa: ANN001, ANN202
        """log(1 + e) for float32 e in [0, 1]: 2·atanh(s), s = e / (2 + e) ≤ 1/3, to the s^15 term
        (the next is below 2e-9 of the sum)."""
        s = e / (np.float32(2.0) + e)
        s2 = s * s
        p = np.float32(1.0 / 15.0)
        p = p * s2 + np.float32(1.0 / 13.0)
        p = p * s2 + np.float32(1.0 / 11.0)
        p = p * s2 + np.float32(1.0 / 9.0)
        p = p * s2 + np.float32(1.0 / 7.0)
        p = p * s2 + np.float32(1.0 / 5.0)
        p = p * s2 + np.float32(1.0 / 3.0)
        p = p * s2 + np.float32(1.0)
        return np.float32(2.0) * s * p

    # Each loop below writes at most two arrays: LLVM vectorizes a loop only when it can check at
    # run time that its arrays do not overlap, and gives up past a handful of such checks (one loop
    # doing all of it ran 20 ns per score, scalar; split, about 1.5 ns).
    @njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def logs(z_row, start, run, keep, log_w):  # noqa: ANN001, ANN202
        """Per row: log(1 − β) into keep, log w = start + run + log β into log_w."""
        for r in range(z_row.shape[0]):
            z = z_row[r]
            lg = log1p_unit(exp_f32(-abs(z)))
            keep[r] = -(max(z, np.float32(0.0)) + lg)
            log_w[r] = (start[r] + run[r]) - (max(-z, np.float32(0.0)) + lg)

    @njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def weights(log_w, w_row, ent, sup, zero_below):  # noqa: ANN001, ANN202
        """w = e^(log w) (0 at or below ``zero_below``); −w·log w into ent, w > 0 into sup."""
        for r in range(log_w.shape[0]):
            x = log_w[r]
            positive = x > zero_below
            w = exp_f32(x) if positive else np.float32(0.0)
            w_row[r] = w
            ent[r] -= w * x
            sup[r] += np.float32(1.0) if positive else np.float32(0.0)

    @njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def add(run, keep):  # noqa: ANN001, ANN202
        for r in range(run.shape[0]):
            run[r] += keep[r]

    @njit(cache=True, fastmath=FASTMATH, nogil=True, error_model="numpy")
    def tile(ST, base, W, ent, sup, zero_below):  # noqa: ANN001, ANN202
        """One tile of C keys for R rows, scores ST (C, R) transposed, nearest key last.

        ``base`` (R,) float64 is each row's log-stick left by the nearer tiles and gets this tile's
        Σ log(1 − β) added. A key that does not break a row's stick scores ``MASKED`` there: weight
        0, and log(1 − β) = −e^(−87), nothing. Writes the weights W (C, R) (0 at or below
        ``zero_below``, where float32's e^x is 0), adds −w·log w and w > 0 into ent and sup (R,) and
        returns the largest log-stick left.
        """
        C, R = ST.shape
        start = base.astype(np.float32)
        run = np.zeros(R, np.float32)  # this tile's own sum, small: the carry stays in float64
        keep = np.empty(R, np.float32)
        log_w = np.empty(R, np.float32)
        for jj in range(C):
            j = C - 1 - jj
            logs(ST[j], start, run, keep, log_w)
            weights(log_w, W[j], ent, sup, zero_below)
            add(run, keep)
        top = -np.inf
        for r in range(R):
            base[r] += np.float64(run[r])
            top = max(top, base[r])
        return top

    return tile


def _check(kernel: Any) -> None:
    """One row, two keys before its own token, scores 1 and −1 (the nearer): w = σ(−1), σ(1)·σ(1)."""
    W = np.zeros((2, 1), np.float32)
    base, ent, sup = np.zeros(1, np.float64), np.zeros(1, np.float32), np.zeros(1, np.float32)
    kernel(np.array([[1.0], [-1.0]], np.float32), base, W, ent, sup, np.float32(-104.0))
    sig = 1.0 / (1.0 + np.exp(-1.0))  # σ(1); σ(−1) = 1 − σ(1)
    want = np.array([sig * sig, 1.0 - sig])
    kept = np.log(sig) + np.log(1.0 - sig)
    if not (np.abs(W[:, 0] - want).max() < 1e-6 and abs(base[0] - kept) < 1e-6 and sup[0] == 2):
        raise RuntimeError(f"stick-breaking tile self-test gave {W[:, 0]}, not {want}")


#: The tile kernel, compiled and checked on first use.
KERNEL = Kernel("the CPU stick-breaking kernel", _build_kernel, _check)


@torch.no_grad()
def fused_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The engine's ``fused`` path for ``StickBreaking`` on float32 CPU tensors."""
    assert isinstance(normalizer, StickBreaking)
    if q.device.type != "cpu":
        raise ValueError(f"the fused CPU path runs on CPU tensors, got {q.device}")
    kernel = KERNEL.get()
    B, H, Nq = prob.B, prob.H, prob.Nq
    qs = (q.float() * prob.scale).contiguous()
    kf, vf = k.float().contiguous(), v.float().contiguous()
    out = torch.empty((B, H, Nq, v.shape[-1]), dtype=torch.float32)
    entropy = np.zeros((B * H, Nq), np.float64)
    support = np.zeros((B * H, Nq), np.float64)
    last = limits(prob, normalizer)
    pos = prob.q_positions
    block_rows, width = tile_sizes(1)
    zero_below = np.float32(exhausted_below(torch.float32) + 1.0)
    stop_below = exhausted_below(torch.float32)
    slopes = prob.slopes.tolist()
    cum = prob.cumulative

    def work(bh: int, r0: int, n_rows: int, keys: int, buf: Tensor) -> int:
        b, h = divmod(bh, H)
        r1 = r0 + n_rows
        base = np.zeros(n_rows, np.float64)
        ent, sup = np.zeros(n_rows, np.float32), np.zeros(n_rows, np.float32)
        lim = last[r0:r1]
        lim_min = int(lim.min())
        acc = torch.zeros((n_rows, vf.shape[-1]), dtype=torch.float32)
        scores, weights = buf[: width * n_rows], buf[width * n_rows : 2 * width * n_rows]
        for t1 in range(keys, 0, -width):
            t0 = max(0, t1 - width)
            ST = scores[: (t1 - t0) * n_rows].view(t1 - t0, n_rows)
            W = weights[: (t1 - t0) * n_rows].view(t1 - t0, n_rows)
            torch.mm(kf[b, h, t0:t1], qs[b, h, r0:r1].t(), out=ST)
            if slopes[h] != 0.0 or cum is not None:
                ST += _bias_tile(slopes[h], None if cum is None else cum[b, h], pos[r0:r1], t0, t1)
            if t1 > lim_min:  # keys that do not break some row's stick: its own token and later ones
                ST.masked_fill_(torch.arange(t0, t1)[:, None] >= lim[None, :], MASKED)
            top = kernel(ST.numpy(), base, W.numpy(), ent, sup, zero_below)
            acc.addmm_(W.t(), vf[b, h, t0:t1])
            if top < stop_below:
                break
        if normalizer.current == "leftover":
            own = np.exp(base)
            acc += torch.from_numpy(own).float()[:, None] * vf[b, h, pos[r0:r1]]
            ent[:] -= own * base
            sup[:] += own > 0
        out[b, h, r0:r1] = acc
        entropy[bh, r0:r1] = ent
        support[bh, r0:r1] = sup
        return 0

    items = [(bh, r0, min(Nq, r0 + block_rows) - r0, int(last[r0 : r0 + block_rows].max()))
             for bh in range(B * H) for r0 in range(0, Nq, block_rows)]
    run_blocks(work, items, 2 * width * block_rows, None)
    if rows is None:
        return out.to(v.dtype), None, None
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
