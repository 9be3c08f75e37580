"""The numba row kernel of the materialized α-entmax path against the `entmax` package (fp64)."""

from __future__ import annotations

import math

import pytest
import torch

entmax_pkg = pytest.importorskip("entmax")

from lengthgen.kernels import normalizers  # noqa: E402
from lengthgen.kernels.cpu import entmax_rows as row_solver  # noqa: E402
from lengthgen.kernels.cpu.entmax_rows import entmax_rows  # noqa: E402
from lengthgen.kernels.engine import attend  # noqa: E402

pytestmark = pytest.mark.skipif(bool(row_solver.KERNEL.unavailable_reason()), reason="numba unavailable")

ALPHAS = (1.25, 1.5, 2.0)


def _scores(kind: str, seed: int = 0) -> torch.Tensor:
    """(2, 3, 17, 17) causal score blocks like a training step's, in fp32."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(2, 3, 17, 17, generator=g) * {"random": 1.0, "wide": 6.0, "flat": 1e-3}[kind]
    z[0, 0, 4] = 0.25  # a row of ties
    causal = torch.ones(17, 17, dtype=torch.bool).triu(1)
    z = z.masked_fill(causal, -math.inf)
    z[1, 2, 5] = -math.inf  # a fully masked row
    return z


def _reference(z: torch.Tensor, alpha: float) -> torch.Tensor:
    """entmax_bisect in fp64; fully masked rows are all-zero by definition."""
    z64 = z.double()
    dead = torch.isinf(z64).all(-1, keepdim=True)
    safe = torch.where(dead, torch.zeros_like(z64), z64)
    p = entmax_pkg.entmax_bisect(safe, alpha=alpha, dim=-1, n_iter=200)
    return torch.where(dead, torch.zeros_like(p), p)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("kind", ["random", "wide", "flat"])
def test_forward_and_backward_match_the_entmax_package(alpha: float, kind: str) -> None:
    z = _scores(kind)
    ref_in = z.double().requires_grad_()
    got_in = z.clone().requires_grad_()
    ref = _reference(ref_in, alpha)
    got = entmax_rows(got_in, alpha)
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), ref, atol=2e-6, rtol=0)
    assert bool((got[torch.isinf(z)] == 0).all())
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(1))
    (ref * g.double()).sum().backward()
    (got * g).sum().backward()
    finite = torch.isfinite(z)
    assert torch.allclose(got_in.grad[finite].double(), ref_in.grad[finite], atol=2e-5, rtol=1e-4)


def test_non_finite_rows_follow_the_reference_definition() -> None:
    z = _scores("random")
    z[0, 1, 7, 2] = math.nan
    z[1, 0, 9, 3] = math.inf
    from lengthgen.functional.entmax import entmax

    assert torch.equal(entmax_rows(z, 1.5), entmax(z, 1.5))


def test_the_engine_takes_the_kernel_only_where_it_applies(monkeypatch: pytest.MonkeyPatch) -> None:
    """Training (the materialized path) solves α-entmax rows with the kernel for one α on float32
    CPU scores, and with the normalizer's torch reference otherwise (float64, an α per head)."""
    calls: list[float] = []

    def counted(z: torch.Tensor, alpha: float) -> torch.Tensor:
        calls.append(alpha)
        return entmax_rows(z, alpha)

    monkeypatch.setattr(row_solver, "entmax_rows", counted)
    q = torch.randn(1, 3, 9, 4, requires_grad=True)
    per_head = normalizers.Entmax(torch.tensor([1.5, 1.25, 2.0]))
    scalar = normalizers.Entmax(1.5)
    for query, normalizer, expected in ((q, scalar, [1.5]), (q.double(), scalar, []), (q, per_head, [])):
        calls.clear()
        attend(query, query, query, normalizer)
        assert calls == expected, (query.dtype, normalizer)
    z = _scores("random")
    expected = torch.stack([_reference(z[:, h], a) for h, a in enumerate((1.5, 1.25, 2.0))], 1)
    assert torch.allclose(per_head.probs(z).double(), expected, atol=2e-6, rtol=0)
    assert torch.allclose(scalar.probs(z).double(), _reference(z, 1.5), atol=2e-6, rtol=0)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("kind", ["random", "wide", "flat"])
def test_the_fused_backward_is_the_torch_backward_bit_for_bit(alpha: float, kind: str) -> None:
    """Training's recorded runs re-derive only if the faster backward rounds exactly as the torch
    expression of ``functional.entmax`` does (``lengthgen verify``)."""
    from lengthgen.functional.entmax import entmax_backward

    assert not row_solver.BACKWARD.unavailable_reason()
    z = _scores(kind)
    p = entmax_rows(z, alpha)
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(2)) * 3
    expected = entmax_backward(p, g, alpha)
    assert torch.equal(row_solver.entmax_rows_backward(p, g, alpha), expected)
    # a gradient in another layout takes the torch expression, with the same values
    strided = g.transpose(-1, -2).contiguous().transpose(-1, -2)
    assert not strided.is_contiguous()
    assert torch.equal(row_solver.entmax_rows_backward(p, strided, alpha), expected)


def test_training_gradients_go_through_the_fused_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[float] = []
    real = row_solver.entmax_rows_backward

    def counted(p: torch.Tensor, grad: torch.Tensor, alpha: float) -> torch.Tensor:
        calls.append(alpha)
        return real(p, grad, alpha)

    monkeypatch.setattr(row_solver, "entmax_rows_backward", counted)
    z = _scores("random").requires_grad_()
    entmax_rows(z, 1.5).square().sum().backward()
    assert calls == [1.5]
    assert z.grad is not None and bool(torch.isfinite(z.grad).all())
