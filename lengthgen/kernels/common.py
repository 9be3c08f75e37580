"""Argument normalization and diagnostics shared by every α-entmax attention path.

Each path sees the same validated problem: per-head α and ALiBi slopes as (H,) fp64 CPU tensors, the
absolute positions of the query rows, and the number of keys each row may see. Keeping this in one
place is what lets the tests compare the paths against one brute-force reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["AttnProblem", "prepare", "row_stats", "visible_counts"]


@dataclass(frozen=True)
class AttnProblem:
    """A validated attention call: shapes, per-head α/slopes, query positions."""

    B: int
    H: int
    Nq: int
    Nk: int
    D: int
    scale: float
    causal: bool
    #: (H,) float64 CPU tensor of α values in (1, 2].
    alpha: Tensor
    #: (H,) float64 CPU tensor of ALiBi slopes (zeros where a head has no bias).
    slopes: Tensor
    has_alibi: bool
    #: (Nq,) int64 tensor (on the inputs' device) of absolute query positions.
    q_positions: Tensor
    #: True when the rows are exactly positions 0..Nk−1 (full causal self-attention).
    full_rows: bool

    @property
    def alpha_scalar(self) -> float | None:
        """The common α if every head shares one, else None."""
        a = self.alpha
        return float(a[0]) if bool((a == a[0]).all()) else None


def _per_head(value: float | Tensor | None, H: int, name: str, default: float) -> Tensor:
    if value is None:
        return torch.full((H,), default, dtype=torch.float64)
    if isinstance(value, Tensor):
        t = value.detach().to(device="cpu", dtype=torch.float64).reshape(-1)
        if t.numel() == 1:
            return t.expand(H).clone()
        if t.numel() != H:
            raise ValueError(f"{name} must be a float or an ({H},) tensor, got shape {tuple(value.shape)}")
        return t.clone()
    return torch.full((H,), float(value), dtype=torch.float64)


def prepare(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float | Tensor,
    causal: bool,
    alibi_slopes: Tensor | None,
    scale: float | None,
    q_positions: Tensor | None,
) -> AttnProblem:
    """Validate shapes and normalize the per-head parameters (raises ValueError with the reason)."""
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
    a = _per_head(alpha, H, "alpha", 1.5)
    if not bool(((a > 1) & (a <= 2)).all()):
        raise ValueError(f"alpha must lie in (1, 2], got {alpha!r}")
    slopes = _per_head(alibi_slopes, H, "alibi_slopes", 0.0)
    if not bool(torch.isfinite(slopes).all()):
        raise ValueError("alibi_slopes must be finite")
    sc = 1.0 / math.sqrt(D) if scale is None else float(scale)
    if q_positions is None:
        pos = torch.arange(Nk - Nq, Nk, device=q.device)
        if Nq > Nk:
            raise ValueError(f"without q_positions, Nq ({Nq}) must not exceed Nk ({Nk})")
    else:
        pos = q_positions.to(device=q.device, dtype=torch.long).reshape(-1)
        if pos.numel() != Nq:
            raise ValueError(f"q_positions has {pos.numel()} entries for {Nq} query rows")
        if Nq and (int(pos.min()) < 0 or (causal and int(pos.max()) >= Nk)):
            raise ValueError(f"q_positions must lie in [0, {Nk}) (got {int(pos.min())}..{int(pos.max())})")
    full_rows = Nq == Nk and (q_positions is None or bool((pos == torch.arange(Nk, device=pos.device)).all()))
    return AttnProblem(
        B=B, H=H, Nq=Nq, Nk=Nk, D=D, scale=sc, causal=bool(causal), alpha=a, slopes=slopes,
        has_alibi=bool((slopes != 0).any()), q_positions=pos, full_rows=full_rows,
    )


def visible_counts(prob: AttnProblem) -> Tensor:
    """Number of keys each query row sees, (Nq,) int64."""
    if prob.causal:
        return (prob.q_positions + 1).clamp(max=prob.Nk)
    return torch.full_like(prob.q_positions, prob.Nk)


def row_stats(p: Tensor, n_visible: Tensor) -> tuple[Tensor, Tensor]:
    """Normalized Shannon entropy H(p)/log n (0 where n == 1) and support size, over the last dim.

    ``n_visible`` broadcasts against p's rows (…, Nq).
    """
    pf = p.detach().to(torch.float64 if p.dtype == torch.float64 else torch.float32)
    on = pf > 0
    plogp = torch.where(on, pf * pf.clamp_min(torch.finfo(pf.dtype).tiny).log(), torch.zeros_like(pf))
    ent = -plogp.sum(-1)
    logn = n_visible.to(pf.dtype).log()
    safe = torch.where(logn > 0, logn, torch.ones_like(logn))
    ent = torch.where(logn > 0, ent / safe, torch.zeros_like(ent))
    return ent.to(torch.float32), on.sum(-1).to(torch.float32)
