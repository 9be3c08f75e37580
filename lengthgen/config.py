"""Run configuration: one frozen pydantic model per run, unknown fields forbidden.

The config is the whole recipe of a run (task, backend, position scheme, model, optimizer,
evaluation protocol, seed); its hash identifies the run in results, so two rows with the same hash
come from the same recipe. Where the run executes (device) is recorded but not hashed.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArchConfig(_Frozen):
    """Model size; the vocabulary comes from the task, the backend from the run."""

    n_layers: int = Field(2, ge=1)
    d_model: int = Field(128, ge=8)
    n_heads: int = Field(4, ge=1)
    d_ff: int = Field(512, ge=1)


class TrainConfig(_Frozen):
    steps: int = Field(1000, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0)
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="cosine floor as a fraction of lr")
    warmup_steps: int = Field(100, ge=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = Field(1.0, gt=0)
    train_length: int = Field(64, ge=1, description="L: longest training length; eval at L·2^k")
    min_train_length: int | None = Field(None, ge=1, description="shortest training length (default L/2)")
    val_every: int = Field(250, ge=1)
    val_samples: int = Field(256, ge=1)
    selection: Literal["id", "8x"] = Field(
        "id", description="checkpoint selection: in-distribution validation, or the paper's 8x"
    )


class EvalConfig(_Frozen):
    max_factor: int = Field(1024, ge=1, description="evaluate at L·{1, 2, 4, …, max_factor}")
    samples: int = Field(256, ge=1, description="samples per length (the most)")
    min_samples: int = Field(16, ge=1, description="samples per length (the fewest, at long lengths)")
    token_budget: int = Field(500_000, ge=1, description="sample tokens per length between the two")
    batch_tokens: int = Field(32_768, ge=1, description="tokens per forward pass")

    @model_validator(mode="after")
    def _power_of_two(self) -> EvalConfig:
        if self.max_factor & (self.max_factor - 1):
            raise ValueError(f"max_factor must be a power of two, got {self.max_factor}")
        return self

    def factors(self) -> list[int]:
        out, f = [], 1
        while f <= self.max_factor:
            out.append(f)
            f *= 2
        return out

    def samples_at(self, sequence_tokens: int) -> int:
        """Fewer samples at long lengths, within [min_samples, samples]."""
        by_budget = self.token_budget // max(1, sequence_tokens)
        return max(min(self.min_samples, self.samples), min(self.samples, by_budget))


class RunConfig(_Frozen):
    task: str
    task_params: dict[str, Any] = Field(default_factory=dict)
    attn: str = "softmax"
    attn_options: dict[str, Any] = Field(default_factory=dict)
    pos: str = "nape"
    preset: str = "quick"
    seed: int = Field(0, ge=0)
    arch: ArchConfig = ArchConfig()
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()

    def canonical_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))

    def config_hash(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()[:16]

    def run_id(self) -> str:
        return f"{self.task}-{self.attn}-{self.pos}-s{self.seed}-{self.config_hash()[:8]}"
