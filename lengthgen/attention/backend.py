"""The attention backend interface: query scale × normalizer × execution path.

The model hands every backend the same things — q, k, v of shape (B, H, N, D), the normalized
layer input x for the query rows, the absolute positions of those rows and the per-head ALiBi
slopes — and never needs to know which backend it carries. A backend chooses a query scale
(``query_scale``), a row normalizer (``normalize``) and may override the execution path
(``attend``); the default path materializes scores for short training sequences and walks query
blocks over the visible keys for long evaluation, so nothing n×n is ever allocated there.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

#: Above this many score entries (B·H·Nq·Nk) without gradients, use the chunked path.
MATERIALIZE_LIMIT = 1 << 24
#: Target number of score entries per chunk (B·H·rows·keys) on the chunked path.
CHUNK_ENTRIES = 1 << 20
#: Fewest query rows per chunk. Every chunk re-reads all B·H·Nk keys and values, and its score
#: block grows with the visible keys; with the handful of rows the target above leaves at long
#: lengths (4 at 65,536 keys, B·H = 4) the growing blocks fragmented the heap past 12 GB resident
#: and evaluation slowed about 4x beyond quadratic. At 64 rows: 576 MiB peak
#: (benchmarks/attention_chunked.py compares both).
MIN_CHUNK_ROWS = 64
#: ...unless that breaks this memory bound on one chunk's scores (huge B·H·Nk).
MAX_CHUNK_ENTRIES = 1 << 25
#: On the chunked path the dispersion diagnostics are averaged over about this many evenly spaced
#: query rows per layer (all rows when there are fewer): computing entropy on every row of a long
#: sequence costs three times the attention itself, and the mean is what is reported.
DIAGNOSTIC_ROWS = 2048


class BackendOptions(BaseModel):
    """Backend-specific options; unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class LayerSpec:
    """What a backend learns about the layer it sits in."""

    n_heads: int
    d_model: int
    d_head: int
    layer_index: int = 0
    #: Heads that take the learned query scale (NAPE: only the NoPE half).
    scaled_heads: tuple[bool, ...] = ()

    def scaled_mask(self) -> torch.Tensor:
        flags = self.scaled_heads or (True,) * self.n_heads
        return torch.tensor(flags, dtype=torch.bool)


@dataclass
class AttentionStats:
    """Running sums of the dispersion diagnostics over every computed (batch, head, row)."""

    entropy_sum: float = 0.0
    support_sum: float = 0.0
    rows: int = 0
    per_layer: dict[int, tuple[float, float, int]] = field(default_factory=dict)

    def add(self, layer: int, entropy: torch.Tensor, support: torch.Tensor) -> None:
        e, s, n = float(entropy.double().sum()), float(support.double().sum()), entropy.numel()
        self.entropy_sum += e
        self.support_sum += s
        self.rows += n
        pe, ps, pn = self.per_layer.get(layer, (0.0, 0.0, 0))
        self.per_layer[layer] = (pe + e, ps + s, pn + n)

    @property
    def entropy(self) -> float:
        """Mean normalized entropy H(p)/log(visible keys), in [0, 1]."""
        return self.entropy_sum / self.rows if self.rows else float("nan")

    @property
    def support(self) -> float:
        """Mean number of keys with nonzero weight."""
        return self.support_sum / self.rows if self.rows else float("nan")


def row_diagnostics(p: torch.Tensor, visible: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalized entropy and support size of probability rows ``p`` (…, Nk).

    ``visible`` (broadcastable to p's rows) is the number of keys each row could see; entropy is
    divided by log(visible) so 1 means uniform, 0 means one-hot (rows with one key score 0).
    Two passes over p (``entr`` treats 0·log 0 as 0): this runs on every block of long evaluations.
    """
    entropy = torch.special.entr(p.float()).sum(-1)
    denom = torch.log(visible.float().clamp_min(1.0))
    normalized = torch.where(denom > 0, entropy / denom.clamp_min(1e-12), torch.zeros_like(entropy))
    support = torch.count_nonzero(p, dim=-1).float()
    return normalized, support


def chunk_rows(entries_per_row: int) -> int:
    """Query rows per chunk: the entry target, raised to MIN_CHUNK_ROWS within MAX_CHUNK_ENTRIES."""
    per_row = max(1, entries_per_row)
    return max(1, CHUNK_ENTRIES // per_row, min(MIN_CHUNK_ROWS, MAX_CHUNK_ENTRIES // per_row))


def score_block(
    q: torch.Tensor,
    k: torch.Tensor,
    q_pos: torch.Tensor,
    slopes: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Scores (B, H, Nq, Nk) with ALiBi bias and −inf on future keys; keys are positions 0..Nk−1.

    Written to touch the block as few times as possible (it is the hot loop of long evaluation):
    the bias is one fused multiply-add with an exact integer distance, and the causal mask only
    covers the keys after the earliest query row.
    """
    scores = torch.matmul(q, k.transpose(-1, -2))
    scores.mul_(scale)
    n_k = k.shape[-2]
    k_pos = torch.arange(n_k, device=q.device)
    if slopes is not None:
        distance = (q_pos[:, None] - k_pos[None, :]).to(scores.dtype)  # exact: integers < 2^24
        scores.addcmul_(slopes.to(scores.dtype)[:, None, None], distance, value=-1.0)
    first = int(q_pos.min()) + 1
    if first < n_k:
        future = k_pos[None, first:] > q_pos[:, None]
        scores[..., first:].masked_fill_(future, float("-inf"))
    return scores


class AttentionBackend(nn.Module, ABC):
    """Base class of every attention backend (built-in or plugin).

    Implement ``normalize`` (probabilities along the last dim; −inf entries are masked keys) and
    optionally ``query_scale``. You get for free: causal masking, ALiBi/NAPE/RoPE, a materialized
    training path, an exact chunked O(n)-memory evaluation path, attention diagnostics, and
    everything downstream (training, evaluation, results, plots, leaderboard).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    Options: ClassVar[type[BackendOptions]] = BackendOptions

    def __init__(self, spec: LayerSpec, options: BackendOptions | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.options = options if options is not None else self.Options()
        self.register_buffer("scaled_heads", spec.scaled_mask(), persistent=False)

    # -- the two ingredients --------------------------------------------------------------------
    def query_scale(self, x: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor | None:
        """Per-(batch, head, row) multiplier of <q, k>/sqrt(d), shape (B, H, Nq); None = 1."""
        return None

    @abstractmethod
    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        """Attention weights for score rows (…, Nk); −inf marks keys a row cannot see."""

    # -- execution ------------------------------------------------------------------------------
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        x: torch.Tensor,
        q_pos: torch.Tensor,
        slopes: torch.Tensor | None,
        stats: AttentionStats | None = None,
    ) -> torch.Tensor:
        scale = self.query_scale(x, q_pos)
        if scale is not None:
            q = q * scale.unsqueeze(-1).to(q.dtype)
        return self.attend(q, k, v, q_pos, slopes, stats)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        slopes: torch.Tensor | None,
        stats: AttentionStats | None,
    ) -> torch.Tensor:
        """Default path: materialize when small or differentiating, else chunk over query rows."""
        scale = 1.0 / math.sqrt(q.shape[-1])
        b, h, nq, _ = q.shape
        nk = k.shape[-2]
        if torch.is_grad_enabled() or b * h * nq * nk <= MATERIALIZE_LIMIT:
            return self._attend_block(q, k, v, q_pos, slopes, scale, stats)
        rows = chunk_rows(b * h * nk)
        stride = max(1, nq // DIAGNOSTIC_ROWS)
        outputs = []
        for start in range(0, nq, rows):
            block_pos = q_pos[start : start + rows]
            visible = int(block_pos.max()) + 1
            outputs.append(
                self._attend_block(
                    q[:, :, start : start + rows], k[:, :, :visible], v[:, :, :visible],
                    block_pos, slopes, scale, stats, stats_rows=slice((-start) % stride, None, stride),
                )
            )
        return torch.cat(outputs, dim=2)

    def _attend_block(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        slopes: torch.Tensor | None,
        scale: float,
        stats: AttentionStats | None,
        stats_rows: slice = slice(None),
    ) -> torch.Tensor:
        scores = score_block(q, k, q_pos, slopes, scale)
        p = self.normalize(scores)
        if stats is not None:
            with torch.no_grad():
                visible = (q_pos[stats_rows] + 1).clamp_max(k.shape[-2])
                entropy, support = row_diagnostics(p[:, :, stats_rows], visible)
                stats.add(self.spec.layer_index, entropy, support)
        return torch.matmul(p.to(v.dtype), v)

    def extra_repr(self) -> str:
        return f"{self.name}, {self.options!r}"
