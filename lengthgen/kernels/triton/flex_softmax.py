"""Softmax attention on CUDA through ``torch.nn.attention.flex_attention``: ALiBi, a cumulative bias
c_i − c_j (Forgetting Attention's gates) and row subsets as a ``score_mod`` and a ``mask_mod``,
compiled into one fused kernel, never an n×n tensor.

Why this tool: on CUDA it is the framework's own fused attention with a programmable score
(PyTorch compiles the two small functions below into its Triton flash kernel), so ALiBi, causal
masking at absolute query positions and the query scale (folded into q) cost nothing extra. On
CPU the same call runs the unfused reference implementation, which is what the tests use to check
this code path at small shapes; evaluation on CPU takes ``cpu/softmax.py`` instead (measured:
compiled FlexAttention ran at 2× SDPA on the development CPU).

Diagnostics come from the generic exact path run on the diagnostic rows only. Adaptive
temperature is not sent here: its first pass needs each row's E_p[z], and the bias part of it,
accumulated as E_p[j] in fp32 at positions near 65,536, would lose about 10⁻² nats of entropy.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import Tensor

from lengthgen.kernels.normalizers import Normalizer, Softmax
from lengthgen.kernels.problem import AttnProblem, on_device
from lengthgen.kernels.reference.generic import chunked_path

__all__ = ["flex_path", "unavailable_reason"]

_compiled: Any = None


def unavailable_reason() -> str:
    """Why FlexAttention cannot be used ('' when it can)."""
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except ImportError as exc:
        return f"torch {torch.__version__} has no FlexAttention ({exc})"
    return ""


def _flex(device: torch.device) -> Any:
    """Compiled FlexAttention on CUDA (one compilation per shape), the eager reference elsewhere."""
    global _compiled
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda":
        return flex_attention
    if _compiled is None:
        _compiled = torch.compile(flex_attention, dynamic=False)
    return _compiled


def flex_attention_rows(q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem) -> Tensor:
    """Softmax attention of q's rows (at ``prob.q_positions``) over all keys, ALiBi included."""
    from torch.nn.attention.flex_attention import create_block_mask

    slopes = on_device(prob.slopes, q.device, torch.float32)
    positions = prob.q_positions.to(q.device)
    causal = prob.causal
    cum = prob.cumulative

    def alibi(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score - slopes[h] * (positions[q_idx] - kv_idx).to(score.dtype)

    def gated(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        # c in float64, its difference rounded once: c reaches 10⁴ at long lengths (``problem.py``)
        bias = (cum[b, h, positions[q_idx]] - cum[b, h, kv_idx]).to(score.dtype)
        return alibi(score, b, h, q_idx, kv_idx) + bias if prob.has_alibi else score + bias

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return kv_idx <= positions[q_idx]

    block_mask = None
    if causal:
        block_mask = create_block_mask(mask_mod, None, None, prob.Nq, prob.Nk, device=q.device)
    score_mod = gated if cum is not None else alibi if prob.has_alibi else None
    return _flex(q.device)(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=prob.scale)


@torch.no_grad()
def flex_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The engine's ``flex`` path for a ``Softmax`` normalizer."""
    if not isinstance(normalizer, Softmax):
        raise ValueError(f"impl='flex' runs plain softmax, not {type(normalizer).__name__}")
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    out = flex_attention_rows(q, k, v, prob)
    if rows is None:
        return out, None, None
    sub = replace(prob, Nq=rows.numel(), q_positions=prob.q_positions[rows], full_rows=False)
    everything = torch.arange(rows.numel(), device=rows.device)
    _, entropy, support = chunked_path(q[:, :, rows], k, v, sub, normalizer, everything)
    return out, entropy, support
