"""α-entmax forward/backward against the `entmax` package (the oracle), in fp64."""

from __future__ import annotations

import math

import pytest
import torch

entmax_pkg = pytest.importorskip("entmax")

from lengthgen.functional.entmax import entmax, entmax_forward, entmax_threshold, sparsemax  # noqa: E402

ALPHAS = (1.25, 1.5, 2.0)


def _rows(kind: str, n: int = 23, rows: int = 6, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, n, generator=g, dtype=torch.float64)
    if kind == "peaked":
        z[:, 3] += 12.0
    elif kind == "flat":
        z = torch.full_like(z, 0.7)
    elif kind == "wide":
        z = z * 5
    return z


def _masked(z: torch.Tensor) -> torch.Tensor:
    z = z.clone()
    z[0, 5:] = -math.inf  # a causal-like prefix
    z[1, ::3] = -math.inf
    z[2, :-1] = -math.inf  # a single visible entry
    return z


@pytest.mark.parametrize("alpha", ALPHAS + (1.7,))
@pytest.mark.parametrize("kind", ["random", "peaked", "flat", "wide"])
def test_forward_matches_entmax_bisect(alpha: float, kind: str) -> None:
    z = _masked(_rows(kind))
    ref = entmax_pkg.entmax_bisect(z, alpha, n_iter=100)
    p = entmax(z, alpha)
    torch.testing.assert_close(p, ref, atol=1e-12, rtol=0)
    assert not p.isnan().any()
    assert (p[z == -math.inf] == 0).all()
    torch.testing.assert_close(p.sum(-1), torch.ones(z.shape[0], dtype=z.dtype))


@pytest.mark.parametrize("kind", ["random", "peaked", "flat", "wide"])
def test_closed_forms_match_package(kind: str) -> None:
    z = _rows(kind)
    torch.testing.assert_close(entmax(z, 1.5), entmax_pkg.entmax15(z), atol=1e-12, rtol=0)
    torch.testing.assert_close(sparsemax(z), entmax_pkg.sparsemax(z), atol=1e-12, rtol=0)
    torch.testing.assert_close(entmax(z, 2.0), entmax_pkg.sparsemax(z), atol=1e-12, rtol=0)


def test_other_dim_and_per_row_alpha() -> None:
    z = _rows("wide", n=11, rows=4)
    zt = z.t().contiguous()  # the rows now live along dim 0
    torch.testing.assert_close(entmax(zt, 1.25, dim=0).t(), entmax_pkg.entmax_bisect(z, 1.25, n_iter=100))
    alpha = torch.tensor([1.25, 1.5, 2.0, 1.9], dtype=torch.float64).view(4, 1)
    ref = entmax_pkg.entmax_bisect(z, alpha, n_iter=100)
    torch.testing.assert_close(entmax(z, alpha), ref, atol=1e-12, rtol=0)
    # Per head on (B, H, N, N)-like scores: α of shape (H, 1, 1).
    s = torch.randn(2, 3, 5, 9, dtype=torch.float64)
    a = torch.tensor([1.25, 1.5, 2.0], dtype=torch.float64)
    ref = entmax_pkg.entmax_bisect(s, a.view(1, 3, 1, 1).expand(2, 3, 5, 1), n_iter=100)
    torch.testing.assert_close(entmax(s, a.view(3, 1, 1)), ref, atol=1e-12, rtol=0)


def test_degenerate_rows_never_nan() -> None:
    z = torch.tensor(
        [
            [-math.inf] * 4,  # fully masked: all zeros
            [math.nan, 1.0, math.nan, -math.inf],  # NaN counts as masked
            [math.inf, 0.0, 1.0, 2.0],  # +inf takes everything
            [1e30, -1e30, 0.0, 1e30],
        ]
    )
    for alpha in ALPHAS + (1.1,):
        p = entmax(z, alpha)
        assert torch.isfinite(p).all()
        assert (p[0] == 0).all()
        torch.testing.assert_close(p[1], torch.tensor([0.0, 1.0, 0.0, 0.0]))
        torch.testing.assert_close(p[2], torch.tensor([1.0, 0.0, 0.0, 0.0]))
        torch.testing.assert_close(p[3], torch.tensor([0.5, 0.0, 0.0, 0.5]))
    assert entmax(torch.empty(3, 0)).shape == (3, 0)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("kind", ["random", "peaked", "wide"])
def test_backward_matches_package_autograd(alpha: float, kind: str) -> None:
    z = _masked(_rows(kind, seed=3))
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    z1 = z.clone().requires_grad_()
    z2 = z.clone().requires_grad_()
    (entmax(z1, alpha) * g).sum().backward()
    (entmax_pkg.entmax_bisect(z2, alpha, n_iter=100) * g).sum().backward()
    assert z1.grad is not None and z2.grad is not None
    assert torch.isfinite(z1.grad).all()
    torch.testing.assert_close(z1.grad, z2.grad, atol=1e-10, rtol=0)


def test_alpha_gradient_matches_package() -> None:
    z = _rows("wide", n=9, rows=4, seed=5)
    g = torch.randn(z.shape, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    a1 = torch.tensor([1.2, 1.5, 1.8, 1.95], dtype=torch.float64).view(4, 1).requires_grad_()
    a2 = a1.detach().clone().requires_grad_()
    (entmax(z, a1) * g).sum().backward()
    (entmax_pkg.entmax_bisect(z, a2, n_iter=100) * g).sum().backward()
    assert a1.grad is not None and a2.grad is not None
    torch.testing.assert_close(a1.grad, a2.grad, atol=1e-9, rtol=0)


@pytest.mark.parametrize("alpha", ALPHAS + (1.6,))
def test_gradcheck(alpha: float) -> None:
    g = torch.Generator().manual_seed(7)
    z = (torch.randn(3, 7, generator=g, dtype=torch.float64) * 2).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: entmax(x, alpha), (z,))


def test_gradcheck_alpha_tensor() -> None:
    z = torch.randn(3, 6, generator=torch.Generator().manual_seed(8), dtype=torch.float64).requires_grad_()
    a = torch.tensor([1.3, 1.5, 1.8], dtype=torch.float64).view(3, 1).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, al: entmax(x, al), (z, a))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("alpha", ALPHAS + (1.3,))
def test_half_inputs_use_fp32_threshold(dtype: torch.dtype, alpha: float) -> None:
    z = (torch.randn(4, 300, generator=torch.Generator().manual_seed(4)) * 8).to(dtype)
    z[0, 100:] = -math.inf
    zr = z.clone().requires_grad_()
    p = entmax(zr, alpha)
    assert p.dtype == dtype and torch.isfinite(p).all()
    ref = entmax_forward(z.float(), alpha)  # the same fp32 τ on the upcast scores
    torch.testing.assert_close(p.float(), ref, atol=1e-2, rtol=0)
    p.float().pow(2).sum().backward()
    assert zr.grad is not None and zr.grad.dtype == dtype and torch.isfinite(zr.grad.float()).all()


def test_bad_alpha_rejected() -> None:
    with pytest.raises(ValueError, match="alpha"):
        entmax(torch.zeros(2, 3), 1.0)
    with pytest.raises(ValueError, match="alpha"):
        entmax(torch.zeros(2, 3), torch.tensor([[1.5], [2.5]]))


@pytest.mark.parametrize("alpha", ALPHAS + (1.4,))
def test_threshold_reproduces_probabilities_and_bounds_subsets(alpha: float) -> None:
    z = _masked(_rows("wide", seed=9))
    tau = entmax_threshold(z, alpha)
    assert tau.shape == (z.shape[0], 1)
    p = ((alpha - 1) * z - tau).clamp_min(0) ** (1 / (alpha - 1))
    torch.testing.assert_close(p, entmax(z, alpha), atol=1e-12, rtol=0)
    sub = z[:, :8]  # a subset of each row's entries never has a larger τ
    assert (entmax_threshold(sub, alpha) <= tau + 1e-12).all()
