"""Stick-breaking attention in pure torch by query blocks × key tiles, nearest tile first (any device:
the CUDA path, the float64 path and the CPU fallback without numba).

Why key tiles. A stick-breaking weight depends on every nearer key of its row (the reverse
cumulative sum Σ_{j<k<i} softplus(z_k), ``functional/stickbreaking.py``), so a row cannot be cut
into independent key ranges merged afterwards, as softmax's log-sum-exp allows. It can be walked
from the query's own token outwards instead: a tile's keys need only the log of the stick the
nearer tiles left, one number per row carried from tile to tile. The walk also stops exactly: every
farther weight is at most the stick left, so once that is below what the float type can hold
(``exhausted_below``), the farther keys weigh exactly 0 and are never scored. With rows that break
the stick early (β ≈ ½ at random scores: a few hundred keys) a row costs that many keys, not its
length; a row that reaches back over every key costs them all.

Diagnostics are exact too: the weights are distributions over the keys j ≤ i (``current="leftover"``)
and the diagnostic rows sum −w·log w and count w > 0 tile by tile.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.functional.precision import compute_dtype
from lengthgen.kernels import chunking
from lengthgen.kernels.diagnostics import normalize_entropy
from lengthgen.kernels.normalizers import Normalizer, StickBreaking
from lengthgen.kernels.problem import AttnProblem, score_block

__all__ = ["ROW_BLOCK", "TILE_KEYS", "exhausted_below", "scan_path", "tile_sizes"]

#: Keys per tile and query rows per block, within the chunking policy's score budget. On the CPU
#: kernel 256 × 512 ran 10% faster than 512 × 256 (fewer tiles for the same scores, each in L2).
TILE_KEYS = 256
ROW_BLOCK = 512
#: Fewest keys per tile, whatever the budget: the smallest budgets are the tests' (``forced_chunking``),
#: where tiles of one key would only add per-tile overhead; tiles of 4 still carry the sum across many.
MIN_TILE_KEYS = 4


def tile_sizes(width: int) -> tuple[int, int]:
    """(rows per block, keys per tile) for ``width`` score rows per query row (B·H when every head is
    scored at once, 1 per head), within ``chunking.CHUNK_ENTRIES`` (``forced_chunking`` shrinks it)."""
    budget = max(1, chunking.CHUNK_ENTRIES // max(1, width))
    keys = max(MIN_TILE_KEYS, min(TILE_KEYS, budget))
    return max(1, min(ROW_BLOCK, budget // keys)), keys


def exhausted_below(dtype: torch.dtype) -> float:
    """A log-stick below which every farther weight (at most the stick) rounds to exactly 0 in ``dtype``."""
    info = torch.finfo(dtype)  # half the smallest subnormal, in logs: for float64 it is itself 0.0
    return math.log(info.smallest_normal) + math.log(info.eps) - math.log(2.0) - 1.0


def limits(prob: AttnProblem, normalizer: StickBreaking) -> Tensor:
    """Per query row, the keys before this index break the stick: before the own token (leftover)
    or through it (key)."""
    if not prob.causal:
        raise ValueError("stick-breaking attention is causal: a row's own token closes its stick")
    return prob.q_positions + (1 if normalizer.current == "key" else 0)


@torch.no_grad()
def scan_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The engine's ``chunked`` path for ``StickBreaking``: exact, bounded memory, any device."""
    assert isinstance(normalizer, StickBreaking)
    cd = compute_dtype(q.dtype)
    B, H, Nq = prob.B, prob.H, prob.Nq
    out = torch.empty((B, H, Nq, v.shape[-1]), dtype=cd, device=q.device)
    entropy = torch.zeros((B, H, Nq), dtype=cd, device=q.device)
    support = torch.zeros_like(entropy)
    lim = limits(prob, normalizer)
    wanted = torch.zeros(Nq, dtype=torch.bool)
    if rows is not None:
        wanted[rows.cpu()] = True
    block_rows, tile = tile_sizes(B * H)
    stop_below = exhausted_below(cd)
    slopes = prob.slopes_or_none()
    for start in range(0, Nq, block_rows):
        stop = min(Nq, start + block_rows)
        pos, last = prob.q_positions[start:stop], lim[start:stop]
        chosen = torch.nonzero(wanted[start:stop]).flatten().to(q.device)
        stick = torch.zeros((B, H, stop - start), dtype=cd, device=q.device)
        acc = torch.zeros((B, H, stop - start, v.shape[-1]), dtype=cd, device=q.device)
        q_block = q[:, :, start:stop].to(cd)
        for t1 in range(int(last.max()), 0, -tile):
            t0 = max(0, t1 - tile)
            shifted = None if prob.cumulative is None else prob.cumulative[..., t0:]
            z = score_block(q_block, k[:, :, t0:t1].to(cd), pos - t0, slopes, prob.scale, False, shifted)
            breaking = torch.arange(t0, t1, device=q.device)[None, :] < last[:, None]
            safe = z.masked_fill(~breaking, 0.0)
            log_keep = torch.where(breaking, -F.softplus(safe), 0.0)
            kept = log_keep.flip(-1).cumsum(-1).flip(-1)
            log_w = torch.where(breaking, F.logsigmoid(safe), float("-inf"))
            log_w += F.pad(kept[..., 1:], (0, 1)) + stick[..., None]
            w = torch.exp(log_w)
            acc += torch.matmul(w, v[:, :, t0:t1].to(cd))
            if chosen.numel():
                _tally(entropy[:, :, start:stop], support[:, :, start:stop], chosen, w, log_w)
            stick += kept[..., 0]
            if float(stick.max()) < stop_below:
                break
        if normalizer.current == "leftover":
            own = torch.exp(stick)
            acc += own[..., None] * v[:, :, pos].to(cd)
            if chosen.numel():
                _tally(entropy[:, :, start:stop], support[:, :, start:stop], chosen, own[..., None],
                       stick[..., None])
        out[:, :, start:stop] = acc
    if rows is None:
        return out.to(v.dtype), None, None
    return (out.to(v.dtype), normalize_entropy(entropy[:, :, rows], prob.visible()[rows]),
            support[:, :, rows].float())


def _tally(entropy: Tensor, support: Tensor, chosen: Tensor, w: Tensor, log_w: Tensor) -> None:
    """Add −Σ w·log w and #{w > 0} over the last dim of (B, H, R, K) weights to the chosen rows."""
    w, log_w = w[:, :, chosen], log_w[:, :, chosen]
    positive = w > 0
    entropy[:, :, chosen] -= torch.where(positive, w * log_w, 0.0).sum(-1)
    support[:, :, chosen] += positive.sum(-1).to(support.dtype)
