"""Forgetting Attention (FoX; Lin et al., ICLR 2025, arXiv 2503.02130): softmax attention whose scores
decay by a data-dependent forget gate, with no position embedding.

Per head h and token t a forget gate f_t = σ(w_h·x_t + b_h) from the layer input x_t; query i's score
on key j ≤ i gets Σ_{j<t≤i} log f_t. That is lengthgen's cumulative bias (``cumulative_bias``, the
increments log f_t), which the engine runs on its softmax kernels; ALiBi is the constant gate
f = e^(−slope). The gate is initialised as FoX's code initialises its ``fgate_proj`` (the default
``fgate_type="full"``): weights N(0, 0.02²), bias 0, so f ≈ ½ at the start of training. This is the
basic FoX layer, without the "Pro" block's output gate, QK-norm or key/value shifts.

The option ``gates="open"`` sets every gate to 1 (no forgetting: softmax with no position signal) in
a model trained with them, to test at evaluation what the forgetting does at a length;
``open_from_layer=L`` opens only the gates of layer L and the layers above it, so that lower layers
whose gates are the model's only position signal keep them while the upper layers' retrieval does
not forget.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from lengthgen.api import AttentionBackend, BackendOptions, LayerSpec, Normalizer, SoftmaxRows
from pydantic import Field, model_validator
from torch import nn

#: FoX's ``initializer_range``: the standard deviation of the gate's weights.
GATE_WEIGHT_STD = 0.02


class ForgettingOptions(BackendOptions):
    LATE = ("gates", "open_from_layer")  # added after runs were published: recorded only when set
    gates: Literal["learned", "open"] = Field(
        "learned", description="the forget gates as learned, or all open (f = 1, no forgetting: an ablation)")
    open_from_layer: int = Field(
        0, ge=0, description="with gates=open: open only the gates of this layer and above (0: every layer)")

    @model_validator(mode="after")
    def _opening_needs_open_gates(self) -> ForgettingOptions:
        if self.open_from_layer and self.gates != "open":
            raise ValueError("open_from_layer applies only with gates=open")
        return self


class ForgettingAttention(AttentionBackend):
    name = "fox"
    description = "Forgetting Attention (FoX): softmax, scores decayed by learned forget gates (paper: nope)"
    Options = ForgettingOptions
    options: ForgettingOptions

    def __init__(self, spec: LayerSpec, options: BackendOptions | None = None) -> None:
        super().__init__(spec, options)
        # drawn from torch's global generator, which every run seeds with its seed
        self.gate = nn.Linear(spec.d_model, spec.n_heads, bias=True)
        with torch.no_grad():
            nn.init.normal_(self.gate.weight, mean=0.0, std=GATE_WEIGHT_STD)
            nn.init.zeros_(self.gate.bias)

    def normalizer(self) -> Normalizer:
        return SoftmaxRows()

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return self.normalizer().probs(scores).to(scores.dtype)

    def cumulative_bias(self, x: torch.Tensor) -> torch.Tensor | None:
        """log f_t (B, H, N), from gate logits in at least float32 (as FoX computes them under autocast);
        None where the gates are open."""
        if self.options.gates == "open" and self.spec.layer_index >= self.options.open_from_layer:
            return None
        logits = self.gate(x)
        return F.logsigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32))).transpose(1, 2)
