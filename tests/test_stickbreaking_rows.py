"""Stick-breaking rows (``StickBreakingRows`` of the plugin API): the definition on a row worked by
hand, and every long-sequence path (the torch key-tile scan, the numba CPU kernel) equal to the
materialized definition, outputs and diagnostics, across tiles and through the exact early stop."""

from __future__ import annotations

import math

import pytest
import torch

from lengthgen.functional.stickbreaking import stick_breaking
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import StickBreaking
from lengthgen.testing import forced_chunking


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def test_a_row_by_hand() -> None:
    """Keys 0, 1, 2 before the own token 3, scores 1, −2, 0.5: key 2 takes σ(0.5), key 1 takes σ(−2)
    of the rest, key 0 σ(1) of what is left; the own token takes the leftover (or breaks too)."""
    z = torch.tensor([[1.0, -2.0, 0.5, 7.0, float("-inf")]], dtype=torch.float64)
    b2, b1, b0, b3 = _sigmoid(0.5), _sigmoid(-2.0), _sigmoid(1.0), _sigmoid(7.0)
    w2, w1, w0 = b2, (1 - b2) * b1, (1 - b2) * (1 - b1) * b0
    left = (1 - b2) * (1 - b1) * (1 - b0)
    assert torch.allclose(stick_breaking(z), torch.tensor([[w0, w1, w2, left, 0.0]], dtype=torch.float64))
    keyed = torch.tensor([[w0, w1, w2, 0.0, 0.0]], dtype=torch.float64) * (1 - b3)
    keyed[0, 3] = b3
    assert torch.allclose(stick_breaking(z, "key"), keyed)
    with pytest.raises(ValueError, match="current"):
        StickBreaking("both")  # type: ignore[arg-type]


@pytest.mark.parametrize("current", ["leftover", "key"])
@pytest.mark.parametrize("scale", [0.3, 1.0, 6.0], ids=["far", "random", "peaked"])
def test_every_path_equals_the_definition(current: str, scale: float) -> None:
    """Sticks that reach every key (scores near 0 after a −4 shift), break at random, or underflow
    within a few keys (the early stop), on 600 keys: several tiles of every size."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 600, 16, generator=gen) for _ in range(3))
    q = q * scale
    if scale < 1:
        k[..., 0], q[..., 0] = 1.0, -4.0 * 4.0
    rows = torch.tensor([0, 1, 2, 63, 64, 300, 511, 512, 599])
    norm = StickBreaking(current)  # type: ignore[arg-type]
    with torch.no_grad():
        want, want_diag = attend(q[:, :, rows].double(), k.double(), v.double(), norm, q_positions=rows,
                                 impl="materialized", diagnostics=True)
        for impl in ("chunked", "fused"):
            for budget in (None, 1, 5000):
                with forced_chunking(budget) if budget else torch.no_grad():
                    got, diag = attend(q[:, :, rows], k, v, norm, q_positions=rows, impl=impl,
                                       diagnostics=True)
                assert float((got.double() - want).abs().max()) < 1e-5, (impl, budget)
                assert diag is not None and want_diag is not None
                assert float((diag.entropy.double() - want_diag.entropy).abs().max()) < 1e-5, (impl, budget)
        float64, _ = attend(q[:, :, rows].double(), k.double(), v.double(), norm, q_positions=rows,
                            impl="chunked")
    assert float((float64 - want).abs().max()) < 1e-12


def test_gradients_stay_finite_for_extreme_scores() -> None:
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 12, 4, generator=gen).mul(30.0).requires_grad_() for _ in range(3))
    out, _ = attend(q, k, v, StickBreaking())
    out.square().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))
