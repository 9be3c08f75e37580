"""The attention backend interface: query scale × normalizer, run by the one attention engine.

The model hands every backend the same things — q, k, v of shape (B, H, N, D), the normalized
layer input x for the query rows, the absolute positions of those rows and the per-head ALiBi
slopes — and never needs to know which backend it carries. A backend chooses a query scale
(``query_scale``), optionally a cumulative bias (``cumulative_bias``: per-position increments g
whose sums Σ_{j<t≤i} g_t bias query i's score on key j, a data-dependent ALiBi) and a row
normalizer (``normalize``); ``lengthgen.kernels.engine`` runs it: materialized scores for
training, exact long-sequence paths for evaluation, never n×n memory there. A backend may also
name its normalizer (``normalizer``: softmax and stick-breaking rows are public, in
``lengthgen.api``) so the engine can use a fused kernel; any other ``normalize`` runs on the
generic exact paths.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from lengthgen.kernels.diagnostics import row_diagnostics
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import Custom, Normalizer
from lengthgen.kernels.problem import score_block

__all__ = [
    "AttentionBackend", "AttentionStats", "BackendOptions", "LayerSpec", "row_diagnostics", "score_block",
]


class BackendOptions(BaseModel):
    """Backend-specific options; unknown fields are rejected."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Options added after runs with this backend were published. A run's config records them only
    #: when they differ from their default, so the published runs keep their config hash and id.
    LATE: ClassVar[tuple[str, ...]] = ()

    def recorded(self) -> dict[str, Any]:
        """The options as a run's config records them (JSON values; late ones only when set)."""
        dumped = self.model_dump(mode="json")
        defaults = type(self)().model_dump(mode="json")
        return {k: v for k, v in dumped.items() if k not in self.LATE or v != defaults[k]}


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
    """Running sums of the dispersion diagnostics over the diagnostic (batch, head, row) triples.

    Which rows, and the formulas: ``lengthgen.kernels.diagnostics``.
    """

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

    def normalizer(self) -> Normalizer:
        """What the engine runs. By default ``normalize`` itself, on the generic exact paths;
        a backend returns a normalizer the engine has fused kernels for (``SoftmaxRows``,
        ``StickBreakingRows`` of ``lengthgen.api``) to run on them."""
        return Custom(self.normalize)

    def cumulative_bias(self, x: torch.Tensor) -> torch.Tensor | None:
        """Increments g (B, H, N) of a cumulative bias from the layer input at every position
        ``x`` (B, N, d_model), or None (the default: no such bias).

        Query i's score on key j ≤ i then gets Σ_{j<t≤i} g_t = c_i − c_j, c = cumsum(g), which the
        engine sums in float64 (ALiBi is the constant g_t = −slope; Forgetting Attention's g_t is
        log σ(w·x_t + b)). Non-positive increments (log-gates) also let the long-sequence paths
        skip the keys the bias has pushed out of reach."""
        return None

    @classmethod
    def has_cumulative_bias(cls) -> bool:
        """True when the class defines ``cumulative_bias``: it then needs the layer input at every
        key position, not only at the query rows (``forward``'s ``x_keys``)."""
        return cls.cumulative_bias is not AttentionBackend.cumulative_bias

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
        x_keys: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` is the layer input at the query rows; ``x_keys`` at every key position (needed only
        by a ``cumulative_bias`` when the rows are not all positions; default ``x``)."""
        scale = self.query_scale(x, q_pos)
        if scale is not None:
            q = q * scale.unsqueeze(-1).to(q.dtype)
        increments = self.cumulative_bias(x if x_keys is None else x_keys)
        if increments is None:
            return self.attend(q, k, v, q_pos, slopes, stats)
        if increments.shape[-1] != k.shape[2]:
            raise ValueError(f"{type(self).__name__}.cumulative_bias gave {increments.shape[-1]} positions "
                             f"for {k.shape[2]} keys: pass the layer input at every key position as x_keys")
        return self.attend(q, k, v, q_pos, slopes, stats, bias_increments=increments)

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        q_pos: torch.Tensor,
        slopes: torch.Tensor | None,
        stats: AttentionStats | None,
        bias_increments: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Run ``normalizer()`` through the engine; ``q`` already carries the query scale.
        ``bias_increments``: what ``cumulative_bias`` gave (only passed when it gave something)."""
        out, diagnostics = attend(
            q, k, v, self.normalizer(), q_positions=q_pos, alibi_slopes=slopes, diagnostics=stats is not None,
            bias_increments=bias_increments,
        )
        if stats is not None and diagnostics is not None:
            stats.add(self.spec.layer_index, diagnostics.entropy, diagnostics.support)
        return out

    def extra_repr(self) -> str:
        return f"{self.name}, {self.options!r}"


def length_cap_field() -> Any:
    """The ``length_cap`` option of a backend with a length-aware scale (an ablation, added after
    runs were published: list it in the options' ``LATE``)."""
    return Field(None, ge=2, description="hold n at this many keys beyond it (an ablation of the scale's "
                                         "growth; default: no cap)")


class ScaledQueriesBackend(AttentionBackend):
    """A backend whose query scale is one learned module (SSMax, ASEntmax): ``make_scale`` builds it
    from the layer and the options, and it scales every head the position scheme lets it (under
    NAPE the ALiBi heads keep s = 1)."""

    def __init__(self, spec: LayerSpec, options: BackendOptions | None = None) -> None:
        super().__init__(spec, options)
        self.scale = self.make_scale(spec)

    @abstractmethod
    def make_scale(self, spec: LayerSpec) -> nn.Module:
        """The module mapping (x, q_pos, scaled_heads) to (B, H, Nq) scales
        (``lengthgen.functional.scales``)."""

    def query_scale(self, x: torch.Tensor, q_pos: torch.Tensor) -> torch.Tensor:
        return self.scale(x, q_pos, self.scaled_heads)
