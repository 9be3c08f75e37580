"""Fixed-α entmax attention (α = 1.5 by default) and sparsemax (α = 2), no query scale."""

from __future__ import annotations

from pydantic import Field

from lengthgen.attention import register_attention
from lengthgen.attention.entmax_family import EntmaxFamilyBackend, EntmaxOptions


@register_attention()
class Entmax(EntmaxFamilyBackend):
    name = "entmax"
    description = "α-entmax attention (default α = 1.5): exact zeros, no length-aware scale"


class SparsemaxOptions(EntmaxOptions):
    alpha: float = Field(2.0, ge=2.0, le=2.0, description="fixed at 2 (sparsemax)")


@register_attention()
class Sparsemax(EntmaxFamilyBackend):
    name = "sparsemax"
    description = "sparsemax attention (α-entmax with α = 2)"
    Options = SparsemaxOptions
