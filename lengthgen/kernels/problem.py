"""One validated attention call: shapes, scale, ALiBi slopes, query positions, visible keys.

Every execution path sees the same ``AttnProblem``, built (and its inputs checked) in one place;
that is what lets the tests compare every path against one brute-force reference. The scores all
paths compute are

    z_ij = scale·<q_i, k_j> − slope_h·(pos_i − j) + (c_{pos_i} − c_j)   for the keys j ≤ pos_i (causal),

with keys at positions 0 … Nk−1, pos_i the absolute position of query row i, and c the optional
cumulative bias c = cumsum(g) of per-position increments g (B, H, Nk) (a data-dependent
generalization of ALiBi, whose increments are the constant −slope_h; Forgetting Attention's are
log forget gates). c is summed in float64: at 65,536 positions its values reach 10⁴ and more,
where float32 would lose 10⁻³ in every difference c_i − c_j.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["AttnProblem", "full_row_positions", "on_device", "per_head", "prepare", "score_block"]


@dataclass(frozen=True)
class AttnProblem:
    """A validated attention call."""

    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    scale: float
    causal: bool
    #: (H,) float64 CPU tensor of ALiBi slopes (zeros where a head has no bias).
    slopes: Tensor
    has_alibi: bool
    #: (Nq,) int64 tensor (on the inputs' device) of absolute query positions.
    q_positions: Tensor
    #: True when the rows are exactly positions 0..Nk−1 (full causal self-attention).
    full_rows: bool
    #: (B, H, Nk) float64 cumulative bias c (on the inputs' device), or None.
    cumulative: Tensor | None = None

    @property
    def device(self) -> torch.device:
        return self.q_positions.device

    def visible(self) -> Tensor:
        """Number of keys each query row sees, (Nq,) int64."""
        if self.causal:
            return (self.q_positions + 1).clamp(max=self.Nk)
        return torch.full_like(self.q_positions, self.Nk)

    def slopes_or_none(self) -> Tensor | None:
        """The slopes when some head has a bias, else None (the paths skip the bias then)."""
        return self.slopes if self.has_alibi else None

    def cumulative_monotone(self) -> bool:
        """True when c never increases along the keys (every increment ≤ 0, as log-gates are): then
        c_i − c_j ≤ 0 for every visible key and the bias only pushes keys further from their row."""
        c = self.cumulative
        return c is None or bool((c[..., 1:] <= c[..., :-1]).all())


@functools.lru_cache(maxsize=64)
def full_row_positions(n: int, device: torch.device) -> Tensor:
    """``arange(n)`` on ``device``, one shared tensor per (n, device): the query positions of a
    full causal layer. The engine recognizes this very tensor as full rows without reading it,
    which on an accelerator would wait for the device. Treat it as read-only."""
    return torch.arange(n, device=device)


@functools.lru_cache(maxsize=64)
def _constant_on(values: tuple[float, ...], device: torch.device, dtype: torch.dtype) -> Tensor:
    return torch.tensor(values, dtype=dtype, device=device)


def on_device(t: Tensor, device: torch.device, dtype: torch.dtype) -> Tensor:
    """A small CPU tensor of constants (per-head slopes) on ``device``: a copy per call from
    pageable memory would make the host wait for the device, so accelerator copies are made once
    per value and kept."""
    if t.device == device or device.type == "cpu":
        return t.to(device=device, dtype=dtype)
    return _constant_on(tuple(t.detach().cpu().reshape(-1).tolist()), device, dtype).view(t.shape)


def per_head(value: float | Tensor | None, H: int, name: str, default: float,
             device: torch.device | None = None, dtype: torch.dtype = torch.float64) -> Tensor:
    """An (H,) tensor from a float, a 1-element or an (H,) tensor, or None: float64 on the CPU for
    the engine's checks, or the kernels' dtype on their device (made there as ``on_device`` does)."""
    device = torch.device("cpu") if device is None else device
    if value is None:
        return torch.full((H,), default, dtype=dtype, device=device)
    if isinstance(value, Tensor):
        t = on_device(value.detach(), device, dtype).reshape(-1)
        if t.numel() == 1:
            return t.expand(H).clone()
        if t.numel() != H:
            raise ValueError(
                f"{name} must be a float or one value per head ({H}), got shape {tuple(value.shape)}")
        return t.clone()
    return torch.full((H,), float(value), dtype=dtype, device=device)


def _check_values(q: Tensor, k: Tensor, v: Tensor, needs_grad: bool) -> None:
    """Floating point, and finite when no gradient is needed; else a ValueError naming the input.

    One rule for every evaluation path: a NaN or an infinity in q, k or v is refused here, instead
    of each kernel doing something different with it (masking it, propagating it, or zeroing the
    row). With gradients (training) non-finite values propagate instead, so that a diverging run
    stops on its NaN loss, as diverged, at no cost of a device synchronization per layer.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not t.is_floating_point():
            raise ValueError(f"attention inputs must be floating point; {name} has dtype {t.dtype}")
    if needs_grad:
        return
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.numel() and not bool(torch.isfinite(t).all()):
            raise ValueError(f"attention input {name} contains NaN or infinite values")


def _check_positions(pos: Tensor, Nk: int, causal: bool) -> None:
    """Query positions in [0, Nk) (causal: keys after the last one do not exist). On CPU a
    ValueError; on an accelerator an assertion queued on the device, so the host never waits for
    it (a bad position then fails the next synchronizing call)."""
    if not pos.numel():
        return
    if pos.device.type == "cpu":
        if int(pos.min()) < 0 or (causal and int(pos.max()) >= Nk):
            raise ValueError(f"q_positions must lie in [0, {Nk}) (got {int(pos.min())}..{int(pos.max())})")
        return
    inside = (pos >= 0).all() & ((pos < Nk).all() if causal else True)
    torch._assert_async(inside, f"q_positions must lie in [0, {Nk})")


def _cumulative(increments: Tensor | None, B: int, H: int, Nk: int, device: torch.device,
                needs_grad: bool) -> Tensor | None:
    """c = cumsum(g) in float64 from increments g (B, H, Nk), checked (ValueError with the reason)."""
    if increments is None:
        return None
    if tuple(increments.shape) != (B, H, Nk):
        raise ValueError(f"cumulative bias increments must be (B, H, Nk) = {(B, H, Nk)}, "
                         f"got {tuple(increments.shape)}")
    if not increments.is_floating_point():
        raise ValueError(f"cumulative bias increments must be floating point, got {increments.dtype}")
    if increments.device != device:
        raise ValueError("cumulative bias increments must be on the device of q, k, v")
    if not needs_grad and increments.numel() and not bool(torch.isfinite(increments).all()):
        raise ValueError("cumulative bias increments contain NaN or infinite values")
    return torch.cumsum(increments.to(torch.float64), dim=-1)


def prepare(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    alibi_slopes: Tensor | None,
    scale: float | None,
    q_positions: Tensor | None,
    needs_grad: bool = False,
    bias_increments: Tensor | None = None,
) -> AttnProblem:
    """Validate shapes, dtypes, values and positions (ValueError with the reason)."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            f"q, k, v must be (B, H, N, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    if k.shape != (B, H, Nk, D) or v.shape[:3] != (B, H, Nk):
        raise ValueError(
            f"k, v must be (B, H, Nk, D) matching q {tuple(q.shape)}; got {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")
    _check_values(q, k, v, needs_grad)
    slopes = per_head(alibi_slopes, H, "alibi_slopes", 0.0)
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError("alibi_slopes must be finite")
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if not math.isfinite(sc):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if q_positions is None:
        if Nq > Nk:
            raise ValueError(f"without q_positions, Nq ({Nq}) must not exceed Nk ({Nk})")
        pos = torch.arange(Nk - Nq, Nk, device=q.device)
    else:
        if q_positions.is_floating_point() or q_positions.is_complex():
            raise ValueError(f"q_positions must be integers, got dtype {q_positions.dtype}")
        pos = q_positions.to(device=q.device, dtype=torch.long).reshape(-1)
        if pos.numel() != Nq:
            raise ValueError(f"q_positions has {pos.numel()} entries for {Nq} query rows")
        _check_positions(pos, Nk, causal)
    full_rows = Nq == Nk and (q_positions is None or q_positions is full_row_positions(Nk, q.device)
                              or bool((pos == torch.arange(Nk, device=pos.device)).all()))
    return AttnProblem(
        B=B, H=H, Nq=Nq, Nk=Nk, D=D, scale=sc, causal=bool(causal), slopes=slopes,
        has_alibi=bool((slopes != 0).any()), q_positions=pos, full_rows=full_rows,
        cumulative=_cumulative(bias_increments, B, H, Nk, q.device, needs_grad),
    )


def score_block(
    q: Tensor,
    k: Tensor,
    q_pos: Tensor,
    slopes: Tensor | None,
    scale: float,
    causal: bool = True,
    cumulative: Tensor | None = None,
) -> Tensor:
    """Scores (B, H, Nq, Nk) with ALiBi bias and −inf on future keys; keys are positions 0..Nk−1.

    ``cumulative``: (B, H, ≥ Nk) cumulative bias c (float64, ``AttnProblem.cumulative``), whose
    c[q_pos] − c[j] is added; differences are taken in c's precision, then rounded.
    Written to touch the block as few times as possible (it is the hot loop of the generic
    chunked path): the bias is one fused multiply-add with an exact integer distance, and the
    causal mask only covers the keys after the earliest query row.
    """
    scores = torch.matmul(q, k.transpose(-1, -2))
    k_pos = torch.arange(k.shape[-2], device=q.device)
    if scores.requires_grad and (slopes is None or not slopes.requires_grad):
        if cumulative is None:
            return _ScaledMaskedScores.apply(scores, scale, slopes, q_pos, k_pos, causal)
        return _BiasedScores.apply(scores, cumulative, scale, slopes, q_pos, k_pos, causal)
    _scale_and_slope(scores, scale, slopes, q_pos, k_pos)
    if cumulative is not None:
        if scores.requires_grad:  # slopes that learn: autograd records the expression
            rows = cumulative.index_select(-1, q_pos.to(cumulative.device))
            scores = scores + (rows[..., :, None] - cumulative[..., None, :k_pos.numel()]).to(scores.dtype)
        else:
            _add_bias_differences(scores, cumulative, q_pos)
    if causal and q_pos.numel():
        # the earliest query's position bounds the masked keys; reading it on an accelerator would
        # make the host wait, so there the mask covers every key (the same scores either way). A
        # differentiable block is masked whole: filling a slice of it in place makes autograd copy
        # the whole gradient block twice in the backward.
        on_cpu = q_pos.device.type == "cpu" and not scores.requires_grad
        first = int(q_pos.min()) + 1 if on_cpu else 0
        if first == 0:
            scores.masked_fill_(_future(q_pos, k_pos), float("-inf"))
        elif first < k_pos.numel():
            scores[..., first:].masked_fill_(_future(q_pos, k_pos[first:]), float("-inf"))
    return scores


def _add_bias_differences(scores: Tensor, cumulative: Tensor, q_pos: Tensor) -> None:
    """scores ← scores + round(c[q_pos] − c[j]), in place: the differences taken in c's float64 and
    rounded once to the scores' dtype as they are stored (no float64 block is kept)."""
    rows = cumulative.index_select(-1, q_pos.to(cumulative.device))
    bias = torch.empty_like(scores)
    torch.sub(rows[..., :, None], cumulative[..., None, :scores.shape[-1]], out=bias)
    scores.add_(bias)


def _scale_and_slope(scores: Tensor, scale: float, slopes: Tensor | None, q_pos: Tensor,
                     k_pos: Tensor) -> None:
    """scores ← scale·scores − slope·(pos_i − j), in place."""
    scores.mul_(scale)
    if slopes is not None:
        distance = (q_pos[:, None] - k_pos[None, :]).to(scores.dtype)  # exact: integers < 2^24
        scores.addcmul_(on_device(slopes, scores.device, scores.dtype)[:, None, None], distance, value=-1.0)


def _future(q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """(Nq, len(k_pos)): True where key k_pos[j] comes after query row i's position."""
    return k_pos[None, :] > q_pos[:, None]


class _ScaledMaskedScores(torch.autograd.Function):
    """The scale, the ALiBi bias and the causal mask of a differentiable score block, in place,
    differentiable in q·kᵀ alone. Its backward is the masked gradient scaled in place: two passes
    where autograd's record of the three in-place operations made four (a copy, a fill, a fresh
    product), with the same numbers (``tests/test_engine.py``)."""

    @staticmethod
    def forward(ctx: Any, raw: Tensor, scale: float, slopes: Tensor | None,  # type: ignore[override]
                q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        _scale_and_slope(raw, scale, slopes, q_pos, k_pos)
        future = _future(q_pos, k_pos) if causal and q_pos.numel() else None
        if future is not None:
            raw.masked_fill_(future, float("-inf"))
        ctx.mark_dirty(raw)
        ctx.scale = scale
        ctx.future = future
        return raw

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        if ctx.future is None:
            return grad * ctx.scale, None, None, None, None, None
        return grad.masked_fill(ctx.future, 0.0).mul_(ctx.scale), None, None, None, None, None


class _BiasedScores(torch.autograd.Function):
    """:class:`_ScaledMaskedScores` with a cumulative bias c[q_pos] − c[j] added (FoX's gates),
    differentiable in q·kᵀ and in c. The forward's numbers are autograd's for the same expression
    (the float64 differences rounded once to the scores' dtype). The gradient of c is the row sums
    of the masked score gradient minus its column sums, summed in the gradient's own dtype and then
    widened: autograd would widen the whole block to float64 first, a score-sized copy that took
    most of this backward's time, for sums of one row or column of the block (a training length's
    terms, a few hundred here, which float32 holds to about 1e-6; numerics version 3;
    ``tests/test_engine.py`` checks them against float64 sums). What it saves
    is the passes: no float64 score-sized block either way, and none of autograd's copies for the
    in-place scale and mask."""

    @staticmethod
    def forward(ctx: Any, raw: Tensor, cumulative: Tensor, scale: float,  # type: ignore[override]
                slopes: Tensor | None, q_pos: Tensor, k_pos: Tensor, causal: bool) -> Tensor:
        _scale_and_slope(raw, scale, slopes, q_pos, k_pos)
        _add_bias_differences(raw, cumulative, q_pos)
        future = _future(q_pos, k_pos) if causal and q_pos.numel() else None
        if future is not None:
            raw.masked_fill_(future, float("-inf"))
        ctx.mark_dirty(raw)
        ctx.scale, ctx.future, ctx.c_shape = scale, future, cumulative.shape
        ctx.save_for_backward(q_pos.to(cumulative.device))
        return raw

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        (q_pos,) = ctx.saved_tensors
        masked = grad if ctx.future is None else grad.masked_fill(ctx.future, 0.0)
        grad_c = torch.zeros(ctx.c_shape, dtype=torch.float64, device=masked.device)
        grad_c.index_add_(-1, q_pos, masked.sum(-1).double())
        grad_c[..., :masked.shape[-1]] -= masked.sum(-2).double()
        grad_scores = masked * ctx.scale if ctx.future is None else masked.mul_(ctx.scale)
        return grad_scores, grad_c, None, None, None, None, None
