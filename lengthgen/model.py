"""A small decoder-only transformer (pre-norm, no learned positions), in one readable file.

The attention backend and the position scheme are parameters: the model builds one backend per
layer from the registry and hands it q, k, v, the normalized layer input and the query positions,
without knowing which backend it carries. The last layer can compute only the rows whose
predictions are scored (``query_positions``), which makes long evaluation much cheaper, exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lengthgen.attention import ATTENTION
from lengthgen.attention.backend import AttentionBackend, AttentionStats, LayerSpec
from lengthgen.attention.positions import PositionScheme, apply_rope, get_position_scheme
from lengthgen.config import ModelConfig
from lengthgen.kernels.problem import full_row_positions

__all__ = ["BackendKind", "ModelConfig", "Transformer"]


@dataclass(frozen=True)
class BackendKind:
    """The model's backend class and options, resolved once per model (the config checked the name
    and the options where it was built, ``build_run_config``); each layer builds its own backend
    from them."""

    cls: type[AttentionBackend]
    options: Any

    @classmethod
    def of(cls, config: ModelConfig) -> BackendKind:
        backend_cls = ATTENTION.get(config.attn)
        return cls(backend_cls, backend_cls.Options(**config.attn_options))

    def build(self, config: ModelConfig, layer: int, scheme: PositionScheme) -> AttentionBackend:
        spec = LayerSpec(n_heads=config.n_heads, d_model=config.d_model, d_head=config.d_head,
                         layer_index=layer, scaled_heads=tuple(scheme.scaled_heads(config.n_heads)))
        return self.cls(spec, self.options)


class SelfAttention(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: PositionScheme, kind: BackendKind) -> None:
        super().__init__()
        self.n_heads, self.d_head = config.n_heads, config.d_head
        self.scheme = scheme
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.out = nn.Linear(config.d_model, config.d_model, bias=False)
        # after the layer's own weights, as always: a backend drawing its init from torch's global
        # generator gets the same draws it always got
        self.backend = kind.build(config, layer, scheme)
        # On the host whatever the model's device: the engine reads slopes on the host and keeps
        # one device copy of them (``kernels.problem.on_device``), never one per call.
        slopes = torch.tensor(scheme.slopes(config.n_heads), dtype=torch.float32)
        self.slopes = slopes if scheme.has_bias() else None

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.d_head).transpose(1, 2)

    def forward(
        self, x: torch.Tensor, query_positions: torch.Tensor | None, stats: AttentionStats | None
    ) -> torch.Tensor:
        b, n, d = x.shape
        positions = full_row_positions(n, x.device)
        q_all_w, k_w, v_w = self.qkv.weight.split(d, dim=0)
        x_q = x if query_positions is None else x[:, query_positions]
        q_pos = positions if query_positions is None else query_positions
        q = self._heads(F.linear(x_q, q_all_w))
        k = self._heads(F.linear(x, k_w))
        v = self._heads(F.linear(x, v_w))
        if self.scheme.rope:
            q, k = apply_rope(q, q_pos), apply_rope(k, positions)
        # the layer input at every key position, for a backend with a cumulative bias (FoX's gates)
        keys = {"x_keys": x} if query_positions is not None and self.backend.has_cumulative_bias() else {}
        y = self.backend(q, k, v, x_q, q_pos, self.slopes, stats, **keys)
        return self.out(y.transpose(1, 2).reshape(b, -1, d))


class Block(nn.Module):
    def __init__(self, config: ModelConfig, layer: int, scheme: PositionScheme, kind: BackendKind) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config, layer, scheme, kind)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff), nn.GELU(), nn.Linear(config.d_ff, config.d_model)
        )

    def forward(
        self, x: torch.Tensor, query_positions: torch.Tensor | None, stats: AttentionStats | None
    ) -> torch.Tensor:
        residual = x if query_positions is None else x[:, query_positions]
        x = residual + self.attn(self.ln1(x), query_positions, stats)
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, seed: int = 0) -> None:
        super().__init__()
        if config.vocab_size is None:
            raise ValueError("ModelConfig.vocab_size is not set; RunConfig.model(vocab_size) sets it")
        self.config = config
        scheme = get_position_scheme(config.pos)
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        kind = BackendKind.of(config)
        self.blocks = nn.ModuleList(Block(config, i, scheme, kind) for i in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self._init_weights(seed)

    def _init_weights(self, seed: int) -> None:
        """nanoGPT-style init drawn from a private generator: same seed ⇒ same weights anywhere.

        Only the model's own layers are drawn; backends keep the init their definition fixes
        (e.g. ASEntmax's s = 1.05).
        """
        gen = torch.Generator().manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.config.n_layers)
        own: list[tuple[nn.Module, float]] = [(self.embed, 0.02), (self.head, 0.02)]
        for block in self.blocks:
            own += [(block.attn.qkv, 0.02), (block.attn.out, residual_std)]
            own += [(block.mlp[0], 0.02), (block.mlp[2], residual_std)]
        with torch.no_grad():
            for module, std in own:
                module.weight.copy_(torch.randn(module.weight.shape, generator=gen) * std)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()

    def forward(
        self,
        input_ids: torch.Tensor,
        query_positions: torch.Tensor | None = None,
        stats: AttentionStats | None = None,
    ) -> torch.Tensor:
        """Logits (B, Nq, V) at ``query_positions`` (all positions when None)."""
        x = self.embed(input_ids)
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            x = block(x, query_positions if i == last else None, stats)
        return self.head(self.ln_f(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
