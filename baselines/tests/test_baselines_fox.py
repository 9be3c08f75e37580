"""FoX against its float64 definition on every engine path (forget gates strong, moderate and nearly
open; ALiBi slopes or none; all rows or a subset), gradients by gradcheck, dtypes, determinism."""

from __future__ import annotations

import math

import pytest
import torch
from lengthgen.api import AttentionStats, LayerSpec
from lengthgen.kernels.engine import attend
from lengthgen.testing import forced_chunking

from baseline_definitions import attention, fox_row
from lengthgen_baselines.fox import GATE_WEIGHT_STD, ForgettingAttention

H, D, B = 4, 8, 2
ATOL = 1e-5
NAPE = torch.tensor([1.0, 0.5, 0.0, 0.0])
#: (weight std, bias) of the gate: f ≈ 0.1 (keys out of reach after a few dozen tokens; the long
#: paths' windows), f ≈ 0.9 (a bias range past the kernel's one-call fold), f ≈ 1 (the fold), and
#: f ≈ e^-6 (c drops by thousands across one block of rows: each row needs its own reference).
REGIMES = {"forget": (0.3, -2.0), "moderate": (0.3, 2.5), "open": (0.02, 12.0), "cliff": (0.3, -6.0)}


def make_layer(regime: str = "moderate", seed: int = 0) -> ForgettingAttention:
    torch.manual_seed(seed)
    layer = ForgettingAttention(LayerSpec(n_heads=H, d_model=H * D, d_head=D))
    std, bias = REGIMES[regime]
    with torch.no_grad():
        layer.gate.weight.mul_(std / GATE_WEIGHT_STD)
        layer.gate.bias.fill_(bias)
    return layer.eval()


def inputs(n: int, seed: int = 1) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for _ in range(3))
    return q * 2.0, k, v, torch.randn(B, n, H * D, generator=gen)


def definition(layer: ForgettingAttention, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor,
               rows: torch.Tensor, slopes: torch.Tensor | None) -> torch.Tensor:
    """The float64 definition, with the gates computed here from the layer's weights."""
    w, b = layer.gate.weight.detach().double(), layer.gate.bias.detach().double()
    logits = x.double() @ w.t() + b  # (B, N, H)
    log_f = [[[math.log(1.0 / (1.0 + math.exp(-float(logits[bb, t, h])))) for t in range(x.shape[1])]
              for h in range(H)] for bb in range(B)]
    return attention(fox_row, q[:, :, rows], k, v, rows, log_f=log_f,
                     slope=[0.0] * H if slopes is None else slopes.tolist())


@pytest.mark.parametrize("regime", list(REGIMES))
@pytest.mark.parametrize("slopes", [None, NAPE], ids=["nope", "nape"])
def test_every_path_equals_the_definition(regime: str, slopes: torch.Tensor | None) -> None:
    layer = make_layer(regime)
    q, k, v, x = inputs(40)
    increments = layer.cumulative_bias(x).detach()
    for rows in (torch.arange(40), torch.tensor([0, 1, 7, 8, 9, 22, 39])):
        want = definition(layer, q, k, v, x, rows, slopes)
        for impl in ("materialized", "chunked", "fused", "flex"):
            for budget in (None, 1, 300):
                with forced_chunking(budget) if budget else torch.no_grad(), torch.no_grad():
                    got, _ = attend(q[:, :, rows], k, v, layer.normalizer(), q_positions=rows,
                                    alibi_slopes=slopes, bias_increments=increments, impl=impl)
                err = float((got.double() - want).abs().max())
                assert err <= ATOL, (impl, budget, len(rows), err)


@pytest.mark.parametrize("regime", list(REGIMES))
def test_long_rows_through_the_backend(regime: str) -> None:
    """1,500 tokens on the long-sequence path, as evaluation runs it (every row in the engine's own
    blocks; the last layer's subset of rows reading the gates of every key, ``x_keys``); sampled rows
    against the definition."""
    layer = make_layer(regime)
    q, k, v, x = inputs(1500, seed=2)
    rows = torch.tensor([0, 3, 255, 256, 511, 512, 1023, 1400, 1498, 1499])
    want = definition(layer, q, k, v, x, rows, None)
    stats = AttentionStats()
    with torch.no_grad():
        full = layer(q, k, v, x, torch.arange(1500), None, stats)  # 18M scores: the fused path
        with forced_chunking(1 << 16):
            part = layer(q[:, :, rows], k, v, x[:, rows], rows, None, x_keys=x)
    assert float((full[:, :, rows].double() - want).abs().max()) <= ATOL
    assert float((part.double() - want).abs().max()) <= ATOL
    assert stats.rows > 0 and 0.0 <= stats.entropy <= 1.0 and stats.support >= 1.0


def test_subset_rows_need_every_key_gate() -> None:
    layer = make_layer()
    q, k, v, x = inputs(12)
    rows = torch.tensor([3, 11])
    with pytest.raises(ValueError, match="x_keys"):
        layer(q[:, :, rows], k, v, x[:, rows], rows, None)


def test_gradients_by_gradcheck() -> None:
    """Through the training path (materialized), to q, k, v and the layer input the gates read."""
    torch.manual_seed(3)
    layer = ForgettingAttention(LayerSpec(n_heads=2, d_model=6, d_head=3)).double().train()
    with torch.no_grad():
        layer.gate.weight.mul_(20.0)  # gates away from ½, so that their gradients matter
    gen = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64).requires_grad_() for _ in range(3))
    x = torch.randn(1, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    for slopes in (None, torch.tensor([0.5, 0.0])):
        assert torch.autograd.gradcheck(lambda q, k, v, x, s=slopes: layer(q, k, v, x, torch.arange(5), s),
                                        (q, k, v, x), eps=1e-6, atol=1e-7)
    out = layer(q, k, v, x, torch.arange(5), None)
    out.sum().backward()
    assert layer.gate.weight.grad is not None and bool(layer.gate.weight.grad.abs().sum() > 0)


def test_gate_init_is_fox_code() -> None:
    """Weights N(0, 0.02²), bias 0 (FoX's ``fgate_proj`` under its ``_init_weights``): f ≈ ½."""
    torch.manual_seed(0)
    layer = ForgettingAttention(LayerSpec(n_heads=16, d_model=256, d_head=16))
    assert torch.equal(layer.gate.bias, torch.zeros(16))
    assert abs(float(layer.gate.weight.std()) - GATE_WEIGHT_STD) < 2e-3
    f = torch.sigmoid(layer.gate(torch.randn(64, 256)))  # a layer-normed input: unit variance
    assert abs(float(f.mean()) - 0.5) < 0.05 and 0.1 < float(f.min()) and float(f.max()) < 0.9


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_dtypes(dtype: torch.dtype) -> None:
    """Outputs come back in the inputs' dtype and agree with float32 to the dtype's precision."""
    layer = make_layer()
    q, k, v, x = inputs(64)
    with torch.no_grad():
        want = layer(q, k, v, x, torch.arange(64), NAPE)
        for budget in (None, 1 << 12):
            with forced_chunking(budget) if budget else torch.no_grad():
                cast = (t.to(dtype) for t in (q, k, v, x))
                got = layer.to(dtype)(*cast, torch.arange(64), NAPE)
            layer.float()
            assert got.dtype == dtype
            tol = 1e-5 if dtype == torch.float64 else 5e-2
            assert float((got.double() - want.double()).abs().max()) <= tol


def test_deterministic() -> None:
    """The same seed builds the same gates; the same call gives the same bits, on every path."""
    a, b = make_layer(seed=5), make_layer(seed=5)
    assert torch.equal(a.gate.weight, b.gate.weight)
    q, k, v, x = inputs(300)
    with torch.no_grad():
        for budget in (None, 1 << 12):
            with forced_chunking(budget) if budget else torch.no_grad():
                first = a(q, k, v, x, torch.arange(300), NAPE)
                second = b(q, k, v, x, torch.arange(300), NAPE)
            assert torch.equal(first, second)


def test_open_gates_are_softmax_without_forgetting_and_keep_published_run_ids() -> None:
    """``gates="open"`` (an ablation option added after runs were published): every gate 1, so the
    layer is the definition with log f = 0; a run's config records it only when set, so the board's
    FoX runs keep their ids (the max_retrieval seed-0 run's, as published)."""
    from lengthgen.config import build_run_config

    torch.manual_seed(0)
    layer = make_layer("forget")
    opened = ForgettingAttention(layer.spec, ForgettingAttention.Options(gates="open")).eval()
    opened.load_state_dict(layer.state_dict())
    q, k, v, x = inputs(40)
    rows = torch.arange(40)
    want = attention(fox_row, q, k, v, rows, log_f=[[[0.0] * 40] * H] * B, slope=[0.0] * H)
    with torch.no_grad():
        assert opened.cumulative_bias(x) is None
        got = opened(q, k, v, x, rows, None)
        learned = layer(q, k, v, x, rows, None)
    assert float((got.double() - want).abs().max()) <= ATOL
    assert float((learned.double() - want).abs().max()) > 0.1  # these gates do forget
    plain = build_run_config("max_retrieval", "fox", pos="nope", preset="paper-tasks", seed=0)
    assert plain.attn_options == {} and plain.config_hash().startswith("25882b95")
    ablated = build_run_config("max_retrieval", "fox", pos="nope", preset="paper-tasks", seed=0,
                               attn_options={"gates": "open"})
    assert ablated.attn_options == {"gates": "open"} and ablated.config_hash() != plain.config_hash()


def test_opening_from_a_layer_keeps_the_gates_below_it() -> None:
    """``open_from_layer=1``: layer 0 keeps its learned gates (a model without position embedding may
    read positions from them), layer 1 and above forget nothing; it needs ``gates="open"``, and a
    run's config records it only when set."""
    from lengthgen.config import build_run_config
    from lengthgen.errors import UserError

    options = ForgettingAttention.Options(gates="open", open_from_layer=1)
    x = inputs(12)[3]
    for index, kept in ((0, True), (1, False), (2, False)):
        torch.manual_seed(0)
        layer = ForgettingAttention(LayerSpec(n_heads=H, d_model=H * D, d_head=D, layer_index=index), options)
        with torch.no_grad():
            bias = layer.cumulative_bias(x)
            assert (bias is not None) == kept
            if kept:  # the learned gates, unchanged: log σ(w·x + b) per head and token
                want = torch.nn.functional.logsigmoid(layer.gate(x)).transpose(1, 2)
                assert torch.equal(bias, want)
    with pytest.raises(ValueError, match="only with gates=open"):
        ForgettingAttention.Options(open_from_layer=1)
    with pytest.raises(UserError, match="open_from_layer"):
        build_run_config("mqmtar", "fox", pos="nope", preset="paper-tasks", seed=0,
                         attn_options={"open_from_layer": 1})
    config = build_run_config("mqmtar", "fox", pos="nope", preset="paper-tasks", seed=0,
                              attn_options={"gates": "open", "open_from_layer": 1})
    assert config.attn_options == {"gates": "open", "open_from_layer": 1}


def test_a_built_model_has_the_same_gates_whatever_the_global_generator_held() -> None:
    """``harness.run.build`` seeds the generator FoX's gates are drawn from: two builds of one config
    are the same model, as a run, a benchmark and ``same_numerics.py`` need."""
    from lengthgen.config import build_run_config
    from lengthgen.harness.run import build

    config = build_run_config("max_retrieval", "fox", pos="nope", preset="paper-tasks", seed=1)
    first = build(config)[1].state_dict()
    torch.manual_seed(12345)
    torch.rand(7)
    second = build(config)[1].state_dict()
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
