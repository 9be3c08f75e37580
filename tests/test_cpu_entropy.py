"""The CPU scores pass of softmax row statistics (``cpu/entropy.py``): log-sum-exp and entropy of every
query row against an fp64 definition, with ALiBi heads whose window really cuts keys, query rows
in any order, one-key rows, and flat, random and peaked rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lengthgen.kernels.cpu import entropy as cpu_entropy
from lengthgen.kernels.cpu.blocks import RowJob
from lengthgen.kernels.cpu.entropy import softmax_lse_entropy
from lengthgen.kernels.cpu.softmax import WINDOW_EPS
from lengthgen.kernels.problem import prepare

pytestmark = pytest.mark.skipif(bool(cpu_entropy.KERNEL.unavailable_reason()), reason="numba unavailable")

N = 301  # odd, not a multiple of the kernel's 16- and 128-key blocks
SLOPES = torch.tensor([0.7, 0.0, 1 / 16, 2.0])
#: Small blocks and tiles: 32 rows, tiles of 48 keys (not a multiple of the kernel's 16- or
#: 128-key loops), so rows are merged over many tiles and the windows cut keys.
BLOCK_ROWS = 32
TILE_KEYS = 48


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_entropy, "_BLOCK_ROWS", BLOCK_ROWS)
    monkeypatch.setattr(cpu_entropy, "_TILE_ENTRIES", BLOCK_ROWS * TILE_KEYS)


def _reference(
    q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, slopes: torch.Tensor,
    theta: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp64, row by row over every visible key: softmax(θ·z), z_j = <q, k_j>/√D − m·(pos − j), j ≤ pos."""
    B, H, R, D = q.shape
    lse = torch.zeros(B, H, R, dtype=torch.float64)
    entropy = torch.zeros(B, H, R, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for r in range(R):
                n = int(pos[r]) + 1
                z = k[b, h, :n].double() @ q[b, h, r].double() / math.sqrt(D)
                z = z - float(slopes[h]) * (int(pos[r]) - torch.arange(n)).double()
                if theta is not None:
                    z = z * float(theta[b, h, r])
                logp = torch.log_softmax(z, 0)
                lse[b, h, r] = torch.logsumexp(z, 0)
                entropy[b, h, r] = -(logp.exp() * logp).sum()
    return lse, entropy


def entropy_bound(q: torch.Tensor, k: torch.Tensor, theta: torch.Tensor | None = None) -> float:
    """Float32 error bound of an entropy: H = lse − Σ p·z, and each float32 score carries a rounding
    of up to 2^-24 of its size, which the weighted sum passes on, so the bound grows with the largest
    score (about 49 for the peaked rows below)."""
    largest = float((q.double() @ k.double().transpose(-1, -2)).abs().max()) / math.sqrt(q.shape[-1])
    if theta is not None:
        largest *= float(theta.max())
    return 2e-6 + 2**-24 * largest


@pytest.mark.parametrize("small_blocks", [False, True])
@pytest.mark.parametrize("regime", [0.01, 1.0, 8.0])  # flat, random and peaked rows (q multiplier)
def test_lse_and_entropy_match_the_fp64_definition(
    regime: float, small_blocks: bool, request: pytest.FixtureRequest
) -> None:
    g = torch.Generator().manual_seed(int(regime * 100))
    q, k = (torch.randn(2, len(SLOPES), N, 16, generator=g) for _ in range(2))
    q = q * regime
    # Rows in no particular order, with row 0 (one key) and the last row.
    pos = torch.cat([torch.tensor([N - 1, 0]), torch.randperm(N - 2, generator=g)[:120] + 1])
    prob = prepare(q[:, :, pos], k, k, True, SLOPES, None, pos)
    if small_blocks:
        request.getfixturevalue("small_tiles")
    lse, entropy = softmax_lse_entropy(q[:, :, pos], k, prob, WINDOW_EPS, threads=2)
    want_lse, want_entropy = _reference(q[:, :, pos], k, pos, SLOPES)
    assert float((entropy - want_entropy).abs().max()) <= entropy_bound(q[:, :, pos], k)
    # LSE carries the float32 rounding of the scores themselves (relative 6e-8 each).
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
    one_key = pos == 0
    assert bool((entropy[:, :, one_key] == 0).all())


@pytest.mark.usefixtures("small_tiles")
def test_the_alibi_window_cuts_keys_and_stays_exact() -> None:
    """Queries and keys on one line with random signs: every score sits at the ±|q|·|k| bound the
    window is derived from, so a window any shorter would leave out weight this test sees. The
    rows' windows start well after key 0, and the result is still the full-row definition (the
    keys left out weigh at most WINDOW_EPS of a row)."""
    g = torch.Generator().manual_seed(3)
    line = torch.zeros(16)
    line[0] = 3.0

    def signed() -> torch.Tensor:
        return (torch.randint(0, 2, (1, len(SLOPES), N, 1), generator=g) * 2 - 1) * line

    q, k = signed(), signed()
    pos = torch.arange(N)
    prob = prepare(q, k, k, True, SLOPES, None, None)
    H = len(SLOPES)
    job = RowJob.prepare(q, k, k[..., :0], prob, np.full(H, prob.scale), np.ones(H), None)
    steep = int(torch.argmax(SLOPES))
    extra = (math.log(1 / WINDOW_EPS) - math.log(-math.expm1(-float(SLOPES[steep])))) / float(SLOPES[steep])
    assert job.window_start(steep, N - BLOCK_ROWS, N, extra=extra) > N // 2  # most keys are left out
    lse, entropy = softmax_lse_entropy(q, k, prob, WINDOW_EPS, threads=1)
    want_lse, want_entropy = _reference(q, k, pos, SLOPES)
    assert float((entropy - want_entropy).abs().max()) <= entropy_bound(q[:, :, pos], k)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


@pytest.mark.usefixtures("small_tiles")
def test_inverse_temperatures_scale_every_row() -> None:
    """softmax(θ·z) with a θ ≥ 1 per row (adaptive temperature's diagnostics): θ scales the
    scores and the ALiBi bias of its row."""
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, len(SLOPES), N, 16, generator=g) for _ in range(2))
    pos = torch.cat([torch.tensor([N - 1, 0]), torch.randperm(N - 2, generator=g)[:90] + 1])
    theta = 1.0 + 2.0 * torch.rand(2, len(SLOPES), len(pos), generator=g)
    prob = prepare(q[:, :, pos], k, k, True, SLOPES, None, pos)
    lse, entropy = softmax_lse_entropy(q[:, :, pos], k, prob, WINDOW_EPS, theta=theta)
    want_lse, want_entropy = _reference(q[:, :, pos], k, pos, SLOPES, theta)
    assert float((entropy - want_entropy).abs().max()) <= entropy_bound(q[:, :, pos], k, theta)
    torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)


def test_equal_scores_give_log_n() -> None:
    """Every key scores the same: H = log n and LSE = log n exactly up to rounding."""
    q = torch.zeros(1, 1, N, 8)
    k = torch.randn(1, 1, N, 8)
    prob = prepare(q, k, k, True, None, None, None)
    lse, entropy = softmax_lse_entropy(q, k, prob, WINDOW_EPS)
    want = torch.log(torch.arange(1, N + 1, dtype=torch.float64))
    torch.testing.assert_close(entropy[0, 0], want, atol=1e-6, rtol=0)
    torch.testing.assert_close(lse[0, 0], want, atol=1e-6, rtol=0)


def test_one_key_far_above_the_sampled_scores() -> None:
    """Scores 0 except one key at +100 that the sampled shift misses (its index is no multiple of
    16): e^(100 − shift) overflows float32, so that tile is redone from its exact maximum."""
    n = 300
    scores = torch.zeros(n)
    scores[77] = 100.0
    q = torch.ones(1, 1, 1, 1)
    k = scores.view(1, 1, n, 1)
    prob = prepare(q, k, k, True, None, 1.0, torch.tensor([n - 1]))
    lse, entropy = softmax_lse_entropy(q, k, prob, WINDOW_EPS)
    z = scores.double()
    p = torch.softmax(z, 0)
    torch.testing.assert_close(lse[0, 0, 0], torch.logsumexp(z, 0), rtol=1e-7, atol=0)
    torch.testing.assert_close(entropy[0, 0, 0], -(p * torch.log(p)).sum(), rtol=0, atol=1e-9)
