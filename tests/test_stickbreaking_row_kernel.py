"""The numba row kernels of stick-breaking training (``cpu/stickbreaking_rows.py``) against the
float64 definition and autograd through it: weights and score gradients, on causal blocks with
masked keys, rows that see only their own token, and scores whose β is 0 or 1 in float32."""

from __future__ import annotations

import math

import pytest
import torch

from lengthgen.functional.stickbreaking import stick_breaking
from lengthgen.kernels.cpu import jit
from lengthgen.kernels.cpu.stickbreaking_rows import stick_breaking_rows
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import StickBreaking

# Skipped only without numba: a kernel that fails its self-test must fail here, not skip.
pytestmark = pytest.mark.skipif(jit.NUMBA_ERROR is not None, reason="numba unavailable")


def _scores(spread: float, seed: int = 0, n: int = 33) -> torch.Tensor:
    """(2, 3, n, n) causal float32 score blocks like a training step's, with holes."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(2, 3, n, n, generator=gen) * spread
    z = z.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), -math.inf)
    z[0, 1, 9, 4] = -math.inf  # a key inside the row it cannot see
    z[1, 0, 12, :12] = -math.inf  # a row that sees only its own token
    return z


def _reference(z: torch.Tensor, g: torch.Tensor, current: str) -> tuple[torch.Tensor, torch.Tensor]:
    z64 = z.double().requires_grad_()
    w64 = stick_breaking(z64, current)  # type: ignore[arg-type]
    (dz64,) = torch.autograd.grad(w64, z64, g.double())
    return w64.detach(), dz64


@pytest.mark.parametrize("current", ["leftover", "key"])
@pytest.mark.parametrize("spread", [0.3, 3.0, 60.0], ids=["far", "random", "saturated"])
def test_weights_and_gradients_equal_the_float64_definition(current: str, spread: float) -> None:
    z = _scores(spread)
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(1))
    want_w, want_dz = _reference(z, g, current)
    leaf = z.clone().requires_grad_()
    w = stick_breaking_rows(leaf, current)  # type: ignore[arg-type]
    (dz,) = torch.autograd.grad(w, leaf, g)
    assert w.dtype == dz.dtype == torch.float32
    assert float((w.detach().double() - want_w).abs().max()) < 1e-6
    assert float((dz.double() - want_dz).abs().max()) < 2e-6 * max(1.0, float(want_dz.abs().max()))
    masked = torch.isinf(z)
    assert bool((w[masked] == 0).all()) and bool((dz[masked] == 0).all())
    if current == "leftover":
        assert torch.allclose(w.double().sum(-1), torch.ones(()).double(), atol=1e-5)


def test_non_finite_scores_go_to_the_definition() -> None:
    z = _scores(1.0, n=13)
    z[0, 0, 3, 1] = math.nan
    assert torch.equal(stick_breaking_rows(z, "leftover").isnan(), stick_breaking(z, "leftover").isnan())


def test_training_attention_takes_the_kernel_and_matches_float64() -> None:
    """``attend`` with gradients on float32 CPU tensors runs the row kernels (materialized path):
    its outputs and input gradients equal float64 autograd through the definition."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 24, 8, generator=gen) for _ in range(3))
    grads = []
    for dtype in (torch.float32, torch.float64):
        leaves = [t.to(dtype).clone().requires_grad_() for t in (q, k, v)]
        out, _ = attend(*leaves, StickBreaking(), impl="materialized")
        out.square().sum().backward()
        grads.append([out.detach().double()] + [t.grad.double() for t in leaves])  # type: ignore[union-attr]
    for got, want in zip(*grads, strict=True):
        assert float((got - want).abs().max()) < 1e-5
