"""The cumulative bias c_i − c_j of the plugin API (``AttentionBackend.cumulative_bias``): ALiBi is its
constant-gate case on every path of every normalizer, the engine checks its input, and a backend
that defines it passes the generic suite (its subset rows read every key's input, ``x_keys``)."""

from __future__ import annotations

import pytest
import torch

import lengthgen.api as api
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import AdaptiveTemperature, Custom, Entmax, Softmax, StickBreaking, TopK
from lengthgen.testing import CHECKS, check_backend, forced_chunking

SLOPES = torch.tensor([1.0, 0.5, 0.25, 0.0])


def _inputs(n: int = 37, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 4, n, 8, generator=gen) for _ in range(3))


def _paths(normalizer: object) -> list[str]:
    if isinstance(normalizer, Softmax):
        return ["materialized", "chunked", "fused", "flex"]
    if isinstance(normalizer, AdaptiveTemperature | StickBreaking):
        return ["materialized", "chunked", "fused"]
    return ["materialized", "chunked"]


NORMALIZERS = {"softmax": Softmax(), "adaptive": AdaptiveTemperature(), "topk": TopK(3),
               "entmax": Entmax(1.5), "stickbreaking": StickBreaking(),
               "custom": Custom(lambda z: torch.softmax(z, -1))}


@pytest.mark.parametrize("normalizer", list(NORMALIZERS.values()), ids=list(NORMALIZERS))
def test_a_constant_gate_is_alibi(normalizer: object) -> None:
    """Increments −slope give the ALiBi scores −slope·(i − j): the same outputs and diagnostics."""
    q, k, v = _inputs()
    rows = torch.tensor([0, 5, 6, 7, 20, 36])
    increments = (-SLOPES).view(1, 4, 1).expand(2, 4, 37).contiguous()
    with torch.no_grad():
        want, want_diag = attend(q[:, :, rows], k, v, normalizer, q_positions=rows, alibi_slopes=SLOPES,
                                 impl="materialized", diagnostics=True)
        for impl in _paths(normalizer):
            for budget in (None, 1):
                with forced_chunking(budget) if budget else torch.no_grad():
                    got, diag = attend(q[:, :, rows], k, v, normalizer, q_positions=rows, impl=impl,  # type: ignore[arg-type]
                                       bias_increments=increments, diagnostics=True)
                assert float((got - want).abs().max()) < 1e-5, (impl, budget)
                assert diag is not None and want_diag is not None
                assert float((diag.entropy - want_diag.entropy).abs().max()) < 1e-4, (impl, budget)
                assert torch.equal(diag.support, want_diag.support), (impl, budget)


def test_bias_and_slopes_add() -> None:
    """Both at once: a cumulative bias on top of ALiBi is the sum of the two biases."""
    q, k, v = _inputs(seed=1)
    gen = torch.Generator().manual_seed(2)
    increments = torch.nn.functional.logsigmoid(torch.randn(2, 4, 37, generator=gen) + 1.0)
    with torch.no_grad():
        want, _ = attend(q, k, v, Softmax(), alibi_slopes=SLOPES, bias_increments=increments,
                         impl="materialized")
        both = increments - SLOPES.view(1, 4, 1)
        alone, _ = attend(q, k, v, Softmax(), bias_increments=both, impl="materialized")
        fused, _ = attend(q, k, v, Softmax(), alibi_slopes=SLOPES, bias_increments=increments, impl="fused")
    assert float((want - alone).abs().max()) < 1e-5 and float((want - fused).abs().max()) < 1e-5


def test_bad_increments_are_refused() -> None:
    q, k, v = _inputs(n=5)
    with pytest.raises(ValueError, match=r"\(B, H, Nk\)"):
        attend(q, k, v, Softmax(), bias_increments=torch.zeros(2, 4, 4))
    with pytest.raises(ValueError, match="floating point"):
        attend(q, k, v, Softmax(), bias_increments=torch.zeros(2, 4, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="NaN or infinite"):
        attend(q, k, v, Softmax(), bias_increments=torch.full((2, 4, 5), float("-inf")))
    with pytest.raises(ValueError, match="causal"):
        attend(q, k, v, StickBreaking(), causal=False)


class GatedSoftmax(api.AttentionBackend):
    """A plugin's data-dependent ALiBi: per head and token a gate from the layer input."""

    name = "gated_softmax_test"
    description = "test: softmax with learned log-gates"

    def __init__(self, spec: api.LayerSpec, options: api.BackendOptions | None = None) -> None:
        super().__init__(spec, options)
        self.gate = torch.nn.Linear(spec.d_model, spec.n_heads)

    def normalizer(self) -> api.Normalizer:
        return api.SoftmaxRows()

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return self.normalizer().probs(scores).to(scores.dtype)

    def cumulative_bias(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.logsigmoid(self.gate(x).float()).transpose(1, 2)


def test_a_gated_plugin_passes_the_suite() -> None:
    assert GatedSoftmax.has_cumulative_bias() and not api.AttentionBackend.has_cumulative_bias()
    assert check_backend(GatedSoftmax) == list(CHECKS)


def test_the_api_names_the_new_surface() -> None:
    for name in ("SoftmaxRows", "StickBreakingRows", "Normalizer", "diagnostic_rows"):
        assert name in api.__all__
    assert "cumulative_bias" in (api.__doc__ or "")
