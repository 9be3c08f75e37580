"""Backends against their definitions: scales, temperature, positions, paths."""

from __future__ import annotations

import math

import pytest
import torch

from lengthgen.attention import ATTENTION
from lengthgen.attention.backend import AttentionStats, LayerSpec, row_diagnostics
from lengthgen.attention.positions import POSITION_SCHEMES, alibi_slopes, apply_rope
from lengthgen.functional.temperature import POLY_COEFFS, adaptive_theta
from lengthgen.kernels import chunking
from lengthgen.model import ModelConfig, Transformer

SOFTMAX_FAMILY = ["softmax", "ssmax", "adaptive_temperature", "topk"]


def make_backend(name: str, n_heads: int = 4, scaled: tuple[bool, ...] = (), **options: object):
    cls = ATTENTION.get(name)
    spec = LayerSpec(n_heads=n_heads, d_model=32, d_head=8, scaled_heads=scaled)
    return cls(spec, cls.Options(**options))


def reference_attention(q, k, v, probs_fn, slopes=None, q_scale=None):
    """Brute force: per (b, h, i) build the visible score row by the definition and normalize."""
    b, h, n, d = q.shape
    out = torch.zeros(b, h, n, v.shape[-1], dtype=torch.float64)
    for bi in range(b):
        for hi in range(h):
            for i in range(n):
                s = 1.0 if q_scale is None else float(q_scale[bi, hi, i])
                z = torch.stack([
                    s * torch.dot(q[bi, hi, i].double(), k[bi, hi, j].double()) / math.sqrt(d)
                    - (0.0 if slopes is None else float(slopes[hi]) * (i - j))
                    for j in range(i + 1)
                ])
                out[bi, hi, i] = probs_fn(z) @ v[bi, hi, : i + 1].double()
    return out


def test_softmax_backend_matches_brute_force_with_alibi():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 7, 8) for _ in range(3))
    slopes = torch.tensor([0.5, 0.0])
    backend = make_backend("softmax", n_heads=2)
    got = backend(q, k, v, torch.zeros(1, 7, 32), torch.arange(7), slopes)
    want = reference_attention(q, k, v, lambda z: torch.softmax(z, 0), slopes)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_ssmax_follows_formula_and_differs_from_softmax():
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 9, 8) for _ in range(3))
    ssmax = make_backend("ssmax", n_heads=2)
    with torch.no_grad():
        ssmax.scale.sigma.copy_(torch.tensor([0.7, 1.3]))
    positions = torch.arange(9)
    got = ssmax(q, k, v, torch.zeros(1, 9, 32), positions, None)
    sigma = torch.tensor([0.7, 1.3])
    scale = sigma[None, :, None] * torch.log(positions.double() + 2)[None, None, :]
    want = reference_attention(q, k, v, lambda z: torch.softmax(z, 0), q_scale=scale)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    plain = make_backend("softmax", n_heads=2)(q, k, v, torch.zeros(1, 9, 32), positions, None)
    assert (got - plain).abs().max() > 1e-3


def test_ssmax_init_sigma_is_one_and_only_nope_heads_scaled_under_nape():
    scheme = POSITION_SCHEMES["nape"]
    backend = make_backend("ssmax", n_heads=4, scaled=tuple(scheme.scaled_heads(4)))
    assert torch.equal(backend.scale.sigma.detach(), torch.ones(4))
    s = backend.query_scale(torch.zeros(2, 5, 32), torch.arange(5))
    assert torch.equal(s[:, :2], torch.ones(2, 2, 5))
    torch.testing.assert_close(s[0, 2], torch.log(torch.arange(5.0) + 2))


def test_adaptive_temperature_polynomial_at_hand_computed_entropy():
    # A uniform row over 8 keys has entropy log 8 = 2.0794415; by hand (descending powers):
    h = math.log(8)
    poly = -0.037 * h**4 + 0.481 * h**3 - 2.3 * h**2 + 4.917 * h - 1.791
    assert poly == pytest.approx(2.12141, abs=1e-4)  # evaluated by hand
    theta = adaptive_theta(torch.zeros(1, 8))
    assert float(theta) == pytest.approx(poly, rel=1e-5)
    # Low entropy (peaked row): H ≤ 0.5 ⇒ θ = 1.
    assert float(adaptive_theta(torch.tensor([[10.0, 0.0, 0.0]]))) == 1.0
    assert POLY_COEFFS[0] == -0.037  # descending order, as numpy.polyval reads them


def test_adaptive_temperature_sharpens_only_at_inference_by_default():
    backend = make_backend("adaptive_temperature")
    scores = torch.tensor([[1.0, 0.9, 0.8, 0.0, -0.5, 0.2, 0.1, 0.3]])
    backend.train()
    torch.testing.assert_close(backend.normalize(scores), torch.softmax(scores, -1))
    backend.eval()
    theta = adaptive_theta(scores)
    torch.testing.assert_close(backend.normalize(scores), torch.softmax(theta * scores, -1))
    assert float(theta) > 1.0
    always = make_backend("adaptive_temperature", apply_in_training=True)
    always.train()
    torch.testing.assert_close(always.normalize(scores), torch.softmax(theta * scores, -1))


def test_asentmax_scale_is_1_05_at_init_and_follows_formula():
    backend = make_backend("asentmax", n_heads=4)
    x = torch.randn(2, 6, 32)
    s = backend.query_scale(x, torch.arange(6))
    torch.testing.assert_close(s, torch.full((2, 4, 6), 1.0 + 0.05) ** 1.0, atol=1e-6, rtol=1e-6)
    # Set arbitrary weights and check s = 1 + softplus(Wb x + bb) · (log n)^(2 tanh(Wg x + bg)).
    torch.manual_seed(3)
    with torch.no_grad():
        for p in backend.scale.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    positions = torch.tensor([0, 3, 10, 100, 1000, 5000])
    s = backend.query_scale(x, positions)
    beta = torch.nn.functional.softplus(backend.scale.beta_proj(x)).transpose(1, 2)
    gamma = 2 * torch.tanh(backend.scale.gamma_proj(x)).transpose(1, 2)
    want = 1.0 + beta * torch.log(positions.float() + 2)[None, None, :] ** gamma
    torch.testing.assert_close(s, want)


def test_asentmax_static_variant_learns_per_head():
    backend = make_backend("asentmax", static=True)
    names = {n for n, _ in backend.named_parameters()}
    assert names == {"scale.beta_raw", "scale.gamma_raw"}
    s = backend.query_scale(torch.randn(1, 3, 32), torch.arange(3))
    torch.testing.assert_close(s, torch.full((1, 4, 3), 1.05))


def test_alibi_and_nape_slopes():
    assert alibi_slopes(8) == [2 ** (-h) for h in range(1, 9)]
    assert alibi_slopes(4) == [2 ** (-2 * h) for h in range(1, 5)]
    six = alibi_slopes(6)
    assert six[:4] == alibi_slopes(4) and six[4:] == alibi_slopes(8)[0::2][:2]
    nape = POSITION_SCHEMES["nape"]
    assert nape.slopes(4) == [1.0, 0.5, 0.0, 0.0]
    assert nape.scaled_heads(4) == [False, False, True, True]
    assert POSITION_SCHEMES["alibi"].scaled_heads(4) == [True] * 4


def test_rope_preserves_relative_scores():
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)
    def score(i: int, j: int) -> float:
        return float((apply_rope(q, torch.tensor([i])) * apply_rope(k, torch.tensor([j]))).sum())
    assert score(5, 2) == pytest.approx(score(13, 10), rel=1e-4)


@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
def test_chunked_path_equals_materialized(name, monkeypatch):
    torch.manual_seed(0)
    backend = make_backend(name)
    backend.eval()
    q, k, v = (torch.randn(2, 4, 37, 8) for _ in range(3))
    x, positions, slopes = torch.randn(2, 37, 32), torch.arange(37), torch.tensor([0.5, 0.25, 0.0, 0.0])
    with torch.no_grad():
        full_stats, chunk_stats = AttentionStats(), AttentionStats()
        full = backend(q, k, v, x, positions, slopes, full_stats)
        monkeypatch.setattr(chunking, "MATERIALIZE_LIMIT", 0)
        monkeypatch.setattr(chunking, "CHUNK_ENTRIES", 2 * 4 * 37 * 5)  # 5-row blocks
        monkeypatch.setattr(chunking, "MIN_CHUNK_ROWS", 1)
        chunked = backend(q, k, v, x, positions, slopes, chunk_stats)
    torch.testing.assert_close(chunked, full, atol=1e-6, rtol=1e-5)
    assert chunk_stats.entropy == pytest.approx(full_stats.entropy, rel=1e-5)
    assert chunk_stats.support == pytest.approx(full_stats.support, rel=1e-6)


def test_chunk_rows_policy():
    """Rows per chunk: the entry target, at least MIN_CHUNK_ROWS unless that breaks the memory cap."""
    from lengthgen.kernels.chunking import CHUNK_ENTRIES, MAX_CHUNK_ENTRIES, MIN_CHUNK_ROWS, chunk_rows

    assert (CHUNK_ENTRIES, MIN_CHUNK_ROWS, MAX_CHUNK_ENTRIES) == (1 << 20, 64, 1 << 25)
    assert chunk_rows(4 * 1000) == 262  # short rows: the entry target gives plenty of rows
    assert chunk_rows(4 * 65536) == 64  # the target alone would give 4 rows
    assert chunk_rows(16 * 65536) == 32  # 64 rows would be 2^26 entries: capped at 2^25
    assert chunk_rows(1 << 30) == 1  # one row is always allowed
    assert chunk_rows(0) == CHUNK_ENTRIES


@pytest.mark.parametrize("pos", list(POSITION_SCHEMES))
@pytest.mark.parametrize("name", SOFTMAX_FAMILY)
def test_model_is_causal_and_row_subset_is_exact(name, pos):
    config = ModelConfig(vocab_size=12, n_layers=2, d_model=32, n_heads=4, d_ff=64, attn=name, pos=pos)
    model = Transformer(config, seed=0).eval()
    ids = torch.randint(0, 12, (2, 20), generator=torch.Generator().manual_seed(0))
    changed = ids.clone()
    changed[:, 15:] = (changed[:, 15:] + 1) % 12
    with torch.no_grad():
        a, b = model(ids), model(changed)
        rows = torch.tensor([3, 9, 19])
        subset = model(ids, rows)
    torch.testing.assert_close(a[:, :15], b[:, :15])
    assert (a[:, 15:] - b[:, 15:]).abs().max() > 0
    torch.testing.assert_close(subset, a[:, rows], atol=1e-5, rtol=1e-5)


def test_same_seed_same_weights_and_different_seed_differs():
    config = ModelConfig(vocab_size=12, n_layers=1, d_model=32, n_heads=4, d_ff=64)
    a, b, c = Transformer(config, seed=5), Transformer(config, seed=5), Transformer(config, seed=6)
    for (_, pa), (_, pb) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_diagnostics_on_known_rows():
    uniform = torch.full((1, 4), 0.25)
    one_hot = torch.tensor([[0.0, 1.0, 0.0, 0.0]])
    e, s = row_diagnostics(torch.cat([uniform, one_hot]), torch.tensor([4, 4]))
    torch.testing.assert_close(e, torch.tensor([1.0, 0.0]))
    torch.testing.assert_close(s, torch.tensor([4.0, 1.0]))


def test_late_options_keep_published_runs_ids_and_change_only_what_they_say() -> None:
    """Options added after runs were published (``LATE``) are recorded only when set, so published
    configs keep their hashes; a length cap holds log n beyond the cap and changes nothing below it;
    the paper code's init makes s vary per token at step 0, ours starts at 1 + beta_init."""
    from lengthgen.attention.entmax_family import ASEntmax
    from lengthgen.attention.softmax_family import SSMax
    from lengthgen.config import build_run_config

    plain = build_run_config("max_retrieval", "ssmax")
    assert plain.attn_options == {}
    capped = build_run_config("max_retrieval", "ssmax", attn_options={"length_cap": 20})
    assert capped.attn_options == {"length_cap": 20} and capped.config_hash() != plain.config_hash()
    recorded = set(build_run_config("mqmtar", "asentmax").attn_options)
    assert recorded == {"alpha", "static", "beta_init", "delta"}
    spec = LayerSpec(n_heads=4, d_model=16, d_head=4, scaled_heads=(False, False, True, True))
    torch.manual_seed(0)
    x = torch.randn(2, 40, 16)
    q_pos = torch.arange(40)
    free, held = SSMax(spec), SSMax(spec, SSMax.Options(length_cap=20))
    held.load_state_dict(free.state_dict())
    with torch.no_grad():
        s_free, s_held = free.query_scale(x, q_pos), held.query_scale(x, q_pos)
    assert torch.equal(s_free[..., :19], s_held[..., :19])  # n = i + 2 <= 20
    assert torch.allclose(s_held[:, 2:, 19:], torch.full_like(s_held[:, 2:, 19:], math.log(20)))
    with torch.no_grad():
        ours = ASEntmax(spec).query_scale(x, q_pos)
        torch.manual_seed(0)
        paper = ASEntmax(spec, ASEntmax.Options(init="paper")).query_scale(x, q_pos)
    assert torch.allclose(ours[:, 2:], torch.full_like(ours[:, 2:], 1.05))
    assert float(paper[:, 2:].std()) > 0.05 and torch.equal(paper[:, :2], torch.ones_like(paper[:, :2]))
