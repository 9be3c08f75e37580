"""Stick-breaking attention against its float64 definition on every engine path (both ways of
treating the own token, ALiBi slopes or none, all rows or a subset, sticks that run out early or
reach back over every key), diagnostics, gradients by gradcheck, dtypes, determinism."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from lengthgen.api import AttentionStats, LayerSpec
from lengthgen.kernels.engine import attend
from lengthgen.testing import check_backend, forced_chunking

from baseline_definitions import attention, scores, stick_row, stick_weights
from lengthgen_baselines.stickbreaking import StickBreakingAttention

H, D, B = 4, 8, 2
ATOL = 1e-5
NAPE = torch.tensor([1.0, 0.5, 0.0, 0.0])
SPEC = LayerSpec(n_heads=H, d_model=H * D, d_head=D)


def inputs(n: int, regime: str = "random", seed: int = 1) -> tuple[torch.Tensor, ...]:
    """q, k, v, x. ``far``: every score near −12 (β ≈ 6e-6), so the stick reaches back over every key;
    ``peaked``: scores ×6, so it runs out (and underflows) within a few keys; ``random``: in between."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for _ in range(3))
    if regime == "far":
        k[..., 0] = 1.0
        q[..., 0] = -12.0 * math.sqrt(D)
    elif regime == "peaked":
        q = q * 6.0
    return q, k, v, torch.randn(B, n, H * D, generator=gen)


def definition(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor, current: str,
               slopes: torch.Tensor | None) -> torch.Tensor:
    return attention(partial(stick_row, current=current), q[:, :, rows], k, v, rows,
                     slope=[0.0] * H if slopes is None else slopes.tolist())


@pytest.mark.parametrize("current", ["leftover", "key"])
@pytest.mark.parametrize("slopes", [None, NAPE], ids=["nope", "nape"])
@pytest.mark.parametrize("regime", ["random", "peaked"])
def test_every_path_equals_the_definition(current: str, slopes: torch.Tensor | None, regime: str) -> None:
    layer = StickBreakingAttention(SPEC, StickBreakingAttention.Options(current=current))
    q, k, v, _ = inputs(40, regime)
    for rows in (torch.arange(40), torch.tensor([0, 1, 7, 8, 9, 22, 39])):
        want = definition(q, k, v, rows, current, slopes)
        for impl in ("materialized", "chunked", "fused"):
            for budget in (None, 1, 300):
                with forced_chunking(budget) if budget else torch.no_grad(), torch.no_grad():
                    got, _ = attend(q[:, :, rows], k, v, layer.normalizer(), q_positions=rows,
                                    alibi_slopes=slopes, impl=impl)
                err = float((got.double() - want).abs().max())
                assert err <= ATOL, (impl, budget, len(rows), err)


@pytest.mark.parametrize("regime", ["random", "peaked", "far"])
def test_long_rows_carry_the_stick_across_key_tiles(regime: str) -> None:
    """1,500 keys in several key tiles (the fused kernel and the torch path, default tile sizes),
    nearest tile first; sampled rows against the definition."""
    layer = StickBreakingAttention(SPEC).eval()
    q, k, v, x = inputs(1500, regime, seed=2)
    rows = torch.tensor([0, 3, 511, 512, 513, 1023, 1400, 1499])
    want = definition(q, k, v, rows, "leftover", None)
    with torch.no_grad():
        for impl in ("fused", "chunked"):
            got, _ = attend(q[:, :, rows], k, v, layer.normalizer(), q_positions=rows, impl=impl)
            assert float((got.double() - want).abs().max()) <= ATOL, impl
        with forced_chunking(1 << 16):
            full = layer(q, k, v, x, torch.arange(1500), None)
    assert float((full[:, :, rows].double() - want).abs().max()) <= ATOL


def _entropy_support(weights: list[float]) -> tuple[float, float]:
    n = len(weights)
    h = -sum(w * math.log(w) for w in weights if w > 0)
    return (h / math.log(n) if n > 1 else 0.0), float(sum(w > 0 for w in weights))


@pytest.mark.parametrize("current", ["leftover", "key"])
def test_diagnostics_are_the_rows_entropy_and_support(current: str) -> None:
    """Normalized entropy and support of the stick-breaking rows (with ``leftover``, a distribution
    over the keys j ≤ i), the same on every path as from the definition's weights."""
    layer = StickBreakingAttention(SPEC, StickBreakingAttention.Options(current=current))
    q, k, v, _ = inputs(60, "far")
    rows = torch.tensor([0, 1, 5, 30, 59])
    want = torch.tensor([[[_entropy_support(stick_weights(scores(q[b, h, i], k[b, h], i), current))
                           for i in rows.tolist()] for h in range(H)] for b in range(B)], dtype=torch.float64)
    for impl in ("materialized", "chunked", "fused"):
        with forced_chunking(7), torch.no_grad():
            _, diag = attend(q[:, :, rows], k, v, layer.normalizer(), q_positions=rows, impl=impl,
                             diagnostics=True)
        assert diag is not None
        assert float((diag.entropy.double() - want[..., 0]).abs().max()) <= 1e-5, impl
        assert torch.equal(diag.support.double(), want[..., 1]), impl


def test_rows_sum_to_one_with_the_leftover_and_less_without() -> None:
    q, k, _, _ = inputs(30)
    z = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    z = z.masked_fill(torch.ones(30, 30, dtype=torch.bool).triu(1), float("-inf"))
    leftover = StickBreakingAttention(SPEC).normalize(z)
    key = StickBreakingAttention(SPEC, StickBreakingAttention.Options(current="key")).normalize(z)
    assert float((leftover.double().sum(-1) - 1).abs().max()) < 1e-6
    dropped = 1.0 - key.double().sum(-1)  # the stick left after the own token: Π (1 − β) over j ≤ i
    assert float(dropped.min()) >= -1e-6 and float(dropped[..., 0].min()) > 0.0 and float(dropped.max()) > 0.1
    # the own token's score does not count with the leftover: changing it changes nothing
    changed = z.clone()
    changed[..., 5, 5] += 3.0
    assert torch.equal(StickBreakingAttention(SPEC).normalize(changed), leftover)


@pytest.mark.parametrize("current", ["leftover", "key"])
def test_gradients_by_gradcheck(current: str) -> None:
    layer = StickBreakingAttention(LayerSpec(n_heads=2, d_model=6, d_head=3),
                                   StickBreakingAttention.Options(current=current)).train()
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 6, 3, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    x = torch.zeros(1, 6, 6, dtype=torch.float64)
    for slopes in (None, torch.tensor([0.5, 0.0])):
        assert torch.autograd.gradcheck(lambda q, k, v, s=slopes: layer(q, k, v, x, torch.arange(6), s),
                                        (q, k, v), eps=1e-6, atol=1e-7)


def test_unnormalized_variant_passes_the_suite() -> None:
    """The default (``leftover``) runs in the suite of every installed plugin: tests/test_backend_suite.py."""
    check_backend(StickBreakingAttention, normalized=False, current="key")


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_dtypes(dtype: torch.dtype) -> None:
    layer = StickBreakingAttention(SPEC).eval()
    q, k, v, x = inputs(64)
    with torch.no_grad():
        want = layer(q, k, v, x, torch.arange(64), NAPE)
        for budget in (None, 1 << 12):
            with forced_chunking(budget) if budget else torch.no_grad():
                got = layer(q.to(dtype), k.to(dtype), v.to(dtype), x.to(dtype), torch.arange(64), NAPE)
            assert got.dtype == dtype
            tol = 1e-5 if dtype == torch.float64 else 5e-2
            assert float((got.double() - want.double()).abs().max()) <= tol


def test_deterministic_and_bounded_diagnostics() -> None:
    layer = StickBreakingAttention(SPEC).eval()
    q, k, v, x = inputs(700, "far")
    results = []
    for _ in range(2):
        stats = AttentionStats()
        with forced_chunking(1 << 14), torch.no_grad():
            results.append((layer(q, k, v, x, torch.arange(700), None, stats), stats.entropy, stats.support))
    assert torch.equal(results[0][0], results[1][0]) and results[0][1:] == results[1][1:]
    assert 0.0 < results[0][1] <= 1.0 and results[0][2] > 1.0
