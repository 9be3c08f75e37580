"""The fused α-entmax kernel's dense-row solver on crafted score rows: ties, all-equal rows, a
threshold exactly on a key, and samples that start its Newton solve on either side of the root.

Each row is one query (D = 1, q = 1, scale 1, so the scores are exactly the keys) attending over
values = the identity, so the output row *is* the weight row; a tiny candidate cap sends every
row down the dense path. References: the ``entmax`` package in fp64.
"""

from __future__ import annotations

import pytest
import torch

entmax_pkg = pytest.importorskip("entmax")

from lengthgen.kernels.cpu.entmax import KERNEL, fused_entmax_attention  # noqa: E402
from lengthgen.kernels.problem import prepare  # noqa: E402

pytestmark = pytest.mark.skipif(bool(KERNEL.unavailable_reason()), reason="numba unavailable")

N = 161  # odd, and not a multiple of the sampling stride or the chunk size
ALPHAS = (1.25, 1.5, 2.0)


def _rows() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    j = torch.arange(N)
    tie = torch.full((N,), -1.0)
    tie[0], tie[1], tie[2:60] = 1.0, 0.5, 0.25  # sparsemax: τ = 0.25, exactly on 58 keys
    return {
        "all equal": torch.full((N,), 0.3),
        "tied at the threshold": tie,
        "plateaus": torch.tensor([0.0, -0.01, -0.02])[torch.randint(0, 3, (N,), generator=g)],
        "sample above the rest": torch.where(j % 16 == 0, 0.05, 0.0),
        "sample below the rest": torch.where(j % 16 == 0, -0.05, 0.0),
        "flat random": 0.01 * torch.randn(N, generator=g),
        "two clusters": torch.where(j % 3 == 0, 0.2, 0.0) + 0.001 * torch.randn(N, generator=g),
        "one key above a flat floor": torch.where(j == 77, 0.5, 0.0),
    }


def _weights(z: torch.Tensor, alpha: float) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Weights and support of score rows z (R, N) on every head, from the fused kernel."""
    R = z.shape[0]
    k = z.to(torch.float32).view(R, 1, N, 1).expand(R, len(ALPHAS), N, 1).contiguous()
    q = torch.ones(R, len(ALPHAS), 1, 1)
    v = torch.eye(N).expand(R, len(ALPHAS), N, N).contiguous()
    prob = prepare(q, k, v, True, None, 1.0, torch.tensor([N - 1]))
    a = torch.full((len(ALPHAS),), alpha, dtype=torch.float64)
    out, _, support, dense = fused_entmax_attention(q, k, v, prob, a, torch.tensor([0]), cap=8)
    assert support is not None
    return out[:, 0, 0].double(), support[:, 0, 0], dense


@pytest.mark.parametrize("alpha", ALPHAS)
def test_dense_rows_match_the_fp64_definition(alpha: float) -> None:
    rows = _rows()
    z = torch.stack(list(rows.values()))
    p, support, dense = _weights(z, alpha)
    assert dense == len(rows) * len(ALPHAS)  # every row took the dense path
    ref = entmax_pkg.entmax_bisect(z.to(torch.float32).double(), alpha, n_iter=200)
    for name, got, want in zip(rows, p, ref, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0, msg=name)
    torch.testing.assert_close(p.sum(-1), torch.ones(len(rows), dtype=torch.float64), atol=1e-6, rtol=0)
    exact = {1.5: entmax_pkg.entmax15, 2.0: entmax_pkg.sparsemax}.get(alpha)
    if exact is not None:  # sort-based fp64 references: exact supports
        want_support = (exact(z.to(torch.float32).double(), dim=-1) > 0).sum(-1)
        for name, got, want in zip(rows, support, want_support, strict=True):
            if name != "tied at the threshold":
                assert int(got) == int(want), name


def test_keys_exactly_at_the_threshold_get_no_weight() -> None:
    """Sparsemax of [1, 0.5, 0.25 × 58, …] has τ = 0.25: exactly two keys carry weight."""
    z = _rows()["tied at the threshold"][None]
    p, support, _ = _weights(z, 2.0)
    assert int(support[0]) == 2
    assert torch.equal(p[0, :2], torch.tensor([0.75, 0.25], dtype=torch.float64))
    assert bool((p[0, 2:] == 0).all())


@pytest.mark.parametrize("alpha", ALPHAS)
def test_all_equal_rows_are_uniform(alpha: float) -> None:
    p, support, _ = _weights(_rows()["all equal"][None], alpha)
    torch.testing.assert_close(p[0], torch.full((N,), 1.0 / N, dtype=torch.float64), atol=1e-7, rtol=0)
    assert int(support[0]) == N


def _tau_by_bisection(x: torch.Tensor, alpha: float) -> float:
    """τ with Σ[x − τ]_+^(1/(α−1)) = 1, in fp64 by bisection (x already in (α−1)·z units)."""
    xd, e = x.double(), 1.0 / (alpha - 1.0)
    lo, hi = float(xd.max()) - 1.0, float(xd.max())
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if float(torch.relu(xd - mid).pow(e).sum()) > 1.0 else (lo, mid)
    return 0.5 * (lo + hi)


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("offset", [-3e-4, -0.3, 0.05])
def test_newton_from_either_side_ends_on_the_exact_threshold(alpha: float, offset: float) -> None:
    """Two keys carry the weight; a cluster of 1,000 keys sits 1e-4 below τ. Started 3e-4 left of
    τ, the first pass is within the closed-form check's reach while its support still holds the
    cluster, so that closed form is wrong and must be rejected; started right of τ, the solve
    must come back."""
    import numpy as np

    from lengthgen.kernels.cpu.entmax import _newton_dense
    from lengthgen.kernels.cpu.entmax_newton import newton_params

    top = torch.tensor([0.0, -0.3], dtype=torch.float32)
    tau = _tau_by_bisection(top, alpha)
    x = torch.cat([top, torch.full((1000,), tau - 1e-4), torch.full((500,), tau - 0.2)]).to(torch.float32)
    want = _tau_by_bisection(x, alpha)
    assert abs(want - tau) < 1e-6  # the cluster is outside the support
    expo, mode, em1_int = newton_params(np.array([alpha]))
    e = float(expo[0])
    got = _newton_dense(x.numpy(), x.numel(), 0.0, want + offset, e, e - 1.0, int(em1_int[0]), int(mode[0]))
    assert abs(got - want) < 1e-12
