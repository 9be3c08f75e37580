"""The attention engine: every path of every normalizer against an fp64 brute-force definition,
one definition of the diagnostics, one input rule, one chunking policy, one fallback warning."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch

from lengthgen.kernels import chunking, diagnostics, engine, fallback
from lengthgen.kernels.cpu.jit import NUMBA_ERROR, Kernel
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import AdaptiveTemperature, Custom, Entmax, Softmax, TopK
from lengthgen.kernels.problem import prepare

entmax_pkg = pytest.importorskip("entmax")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
try:
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False
ATOL = 1e-5
#: Adaptive temperature's fused path takes θ from an fp32 entropy (see ``cpu/softmax.py``).
ATOL_FUSED_ADAPTIVE = 3e-5


def _relu2(scores: torch.Tensor) -> torch.Tensor:
    """A plugin-style normalizer the engine knows nothing about."""
    z = scores.double() if scores.dtype == torch.float64 else scores.float()
    w = torch.relu(z - z.amax(-1, keepdim=True) + 1.0).square()
    return w / w.sum(-1, keepdim=True)


def _paths(normalizer: object) -> list[str]:
    paths = ["materialized", "chunked"]
    if isinstance(normalizer, Entmax | TopK | Softmax | AdaptiveTemperature) and NUMBA_ERROR is None:
        paths.append("fused")
    if isinstance(normalizer, Entmax) and HAS_TRITON and INTERPRET:
        paths.append("triton")
    if isinstance(normalizer, Softmax):
        paths.append("flex")
    return paths


def _brute(q, k, v, normalizer, pos, slopes, causal=True):  # noqa: ANN001, ANN201
    """fp64, row by row from the definitions: z_j = <q, k_j>/√D − m·(pos − j) over j ≤ pos."""
    B, H, Nq, D = q.shape
    out = torch.zeros(B, H, Nq, v.shape[-1], dtype=torch.float64)
    probs = []
    for b in range(B):
        for h in range(H):
            for r in range(Nq):
                n = int(pos[r]) + 1 if causal else k.shape[2]
                z = (k[b, h, :n].double() @ q[b, h, r].double()) / math.sqrt(D)
                if slopes is not None:
                    z = z - float(slopes[h]) * (int(pos[r]) - torch.arange(n)).double()
                if isinstance(normalizer, Entmax):
                    a = normalizer.alpha
                    a = float(a[h]) if isinstance(a, torch.Tensor) else a
                    p = entmax_pkg.entmax_bisect(z[None], a, n_iter=100)[0]
                elif isinstance(normalizer, TopK):
                    kth = torch.sort(z, descending=True).values[min(normalizer.k, n) - 1]
                    p = torch.softmax(torch.where(z >= kth, z, -math.inf), 0)
                elif isinstance(normalizer, AdaptiveTemperature):
                    p0 = torch.softmax(z, 0)
                    entropy = -(p0 * torch.log(p0.clamp_min(1e-300))).sum()
                    coeffs = (-1.791, 4.917, -2.3, 0.481, -0.037)  # poly(H), ascending powers
                    theta = sum(c * entropy**i for i, c in enumerate(coeffs))
                    theta = max(float(theta), 1.0) if entropy > 0.5 else 1.0
                    p = torch.softmax(theta * z, 0)
                elif isinstance(normalizer, Custom):
                    p = normalizer.fn(z[None])[0]
                else:
                    p = torch.softmax(z, 0)
                out[b, h, r] = p @ v[b, h, :n].double()
                probs.append(p)
    return out


NORMALIZERS = {
    "softmax": Softmax(),
    "adaptive_temperature": AdaptiveTemperature(),
    "topk": TopK(3),
    "entmax1.25": Entmax(1.25),
    "entmax1.5": Entmax(1.5),
    "sparsemax": Entmax(2.0),
    "entmax_per_head": Entmax(torch.tensor([1.5, 1.25, 2.0])),
    "plugin": Custom(_relu2),
}
CASES = [  # (N, ALiBi, query subset)
    (1, True, False),
    (37, False, False),
    (37, True, False),
    (64, True, True),
    (91, False, True),
]


@pytest.mark.parametrize(("n", "alibi", "subset"), CASES)
@pytest.mark.parametrize("name", list(NORMALIZERS))
def test_every_path_matches_the_fp64_definition(name: str, n: int, alibi: bool, subset: bool) -> None:
    normalizer = NORMALIZERS[name]
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g) * 1.5 for _ in range(3))
    slopes = torch.tensor([0.7, 0.0, 1 / 16]) if alibi else None
    pos = torch.arange(n)
    if subset:  # the last layer's rows: a subset, in no particular order, with row 0 (one key)
        pos = torch.cat([torch.tensor([0, n - 1]), torch.randperm(n - 2, generator=g)[: n // 3] + 1])
    want = _brute(q[:, :, pos], k, v, normalizer, pos, slopes)
    for path in _paths(normalizer):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # FlexAttention on CPU warns that it is unfused
            got, _ = attend(q[:, :, pos], k, v, normalizer, q_positions=pos, alibi_slopes=slopes, impl=path)
        err = float((got.double() - want).abs().max())
        tol = ATOL_FUSED_ADAPTIVE if (name, path) == ("adaptive_temperature", "fused") else ATOL
        assert err <= tol, f"{name} via {path}: max |error| {err:.2e}"


def test_no_keys_gives_zero_rows_on_every_path() -> None:
    q = torch.randn(1, 2, 3, 4)
    k = v = torch.zeros(1, 2, 0, 4)
    for normalizer in (Softmax(), TopK(2), Entmax(1.5), Custom(_relu2)):
        for path in ("materialized", "chunked", "fused") if NUMBA_ERROR is None else ("materialized",):
            if isinstance(normalizer, Custom) and path == "fused":
                continue
            out, diag = attend(q, k, v, normalizer, causal=False, q_positions=torch.arange(3), impl=path,
                               diagnostics=True)
            assert torch.equal(out, torch.zeros(1, 2, 3, 4))
            assert diag is not None and not diag.entropy.any() and not diag.support.any()


def _uniform_rows(n: int = 41) -> tuple[torch.Tensor, ...]:
    """Scores 0 on a chosen subset of keys and −200 elsewhere: every normalizer gives the same
    weights, uniform over the chosen keys a row sees (softmax's others underflow to exactly 0)."""
    g = torch.Generator().manual_seed(3)
    chosen = torch.rand(n, generator=g) < 0.4
    chosen[0] = True
    q = torch.zeros(1, 2, n, 4)
    q[..., 0] = 1.0
    k = torch.zeros(1, 2, n, 4)
    k[:, :, ~chosen, 0] = -200.0 * math.sqrt(4)
    v = torch.randn(1, 2, n, 4, generator=g)
    counts = torch.cumsum(chosen.long(), 0)  # chosen keys visible to each row
    visible = torch.arange(1, n + 1)
    return q, k, v, counts, visible


@pytest.mark.parametrize("diagnostic_rows", [None, 7])
def test_identical_probabilities_give_identical_diagnostics_on_every_path(
    diagnostic_rows: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if diagnostic_rows is not None:  # fewer diagnostic rows than query rows: the same subset everywhere
        monkeypatch.setattr(diagnostics, "DIAGNOSTIC_ROWS", diagnostic_rows)
    q, k, v, counts, visible = _uniform_rows()
    rows = diagnostics.diagnostic_rows(q.shape[2])
    log_n = visible[rows].double().log()
    want_entropy = torch.where(log_n > 0, counts[rows].double().log() / torch.where(log_n > 0, log_n, 1), 0)
    seen = []
    for name, normalizer in [("softmax", Softmax()), ("adaptive", AdaptiveTemperature()), ("topk", TopK(50)),
                             ("entmax", Entmax(1.5)), ("sparsemax", Entmax(2.0)), ("plugin", Custom(_relu2))]:
        for path in _paths(normalizer):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                _, diag = attend(q, k, v, normalizer, impl=path, diagnostics=True)
            assert diag is not None
            assert torch.equal(diag.rows, rows), (name, path)
            assert torch.equal(diag.support[0, 0].long(), counts[rows]), (name, path, diag.support[0, 0])
            err = float((diag.entropy[0, 0].double() - want_entropy).abs().max())
            assert err <= 2e-6, (name, path, err)
            seen.append((name, path))
    assert len(seen) >= 10


def test_diagnostic_rows_are_all_rows_or_evenly_spaced() -> None:
    assert torch.equal(diagnostics.diagnostic_rows(100), torch.arange(100))
    n = 10_000
    rows = diagnostics.diagnostic_rows(n)
    assert rows.numel() == diagnostics.DIAGNOSTIC_ROWS and int(rows[0]) == 0
    gaps = rows.diff()
    even = n // diagnostics.DIAGNOSTIC_ROWS
    assert int(gaps.min()) >= even and int(gaps.max()) <= even + 1


@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_inputs_are_refused_on_every_path(where: str, bad: float) -> None:
    tensors = {name: torch.randn(1, 3, 9, 8) for name in "qkv"}
    tensors[where][0, 1, 4, 2] = bad
    for normalizer in (Softmax(), AdaptiveTemperature(), TopK(2), Entmax(1.5), Custom(_relu2)):
        for path in _paths(normalizer):
            with pytest.raises(ValueError, match=f"input {where} contains NaN or infinite"):
                attend(tensors["q"], tensors["k"], tensors["v"], normalizer, impl=path)


def test_integer_inputs_are_refused_and_gradients_let_nan_through() -> None:
    q = torch.randint(0, 5, (1, 2, 6, 4))
    with pytest.raises(ValueError, match="floating point"):
        attend(q, q.float(), q.float(), Softmax())
    with pytest.raises(ValueError, match="integers"):
        attend(q.float(), q.float(), q.float(), Softmax(), q_positions=torch.arange(6.0))
    # Training: a diverging model's NaN reaches the loss, which stops the run as diverged.
    nan_q = torch.full((1, 2, 6, 4), float("nan"), requires_grad=True)
    out, _ = attend(nan_q, torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4), Softmax())
    assert torch.isnan(out).all()


def _missing(what: str) -> Kernel:
    """A kernel whose build fails as it does without numba."""

    def build() -> None:
        raise ImportError("no numba")

    return Kernel(what, build, lambda kernel: None)


def test_kernel_fallbacks_warn_once_per_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without numba the α-entmax and top-k kernels fall back with one warning, without triton
    another; each names what runs instead."""
    from lengthgen.kernels.cpu import entmax as cpu_entmax
    from lengthgen.kernels.cpu import topk as cpu_topk
    from lengthgen.kernels.triton import entmax as triton_entmax

    fallback.reset()
    monkeypatch.setattr(cpu_entmax, "KERNEL", _missing("the fused CPU α-entmax kernel"))
    monkeypatch.setattr(cpu_topk, "KERNEL", _missing("the fused CPU top-k kernel"))
    monkeypatch.setattr(triton_entmax, "unavailable_reason", lambda: "ImportError: no triton")
    q, k, v = (torch.randn(1, 2, 30, 4) for _ in range(3))
    cuda_like = SimpleNamespace(device=torch.device("cuda"))
    prob = prepare(q, k, v, True, None, None, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert engine._choose(q, prob, Entmax(1.5), grad=False) == "chunked"
            assert engine._choose(cuda_like, prob, Entmax(1.5), grad=False) == "chunked"  # type: ignore[arg-type]
            attend(q, k, v, TopK(2), impl="auto")
    warned = [w for w in caught if issubclass(w.category, fallback.KernelFallbackWarning)]
    assert len(warned) == 2, [str(w.message) for w in warned]
    assert {"numba" in str(w.message) or "triton" in str(w.message) for w in warned} == {True}
    assert all("unavailable" in str(w.message) and "chunked torch path" in str(w.message) for w in warned)
    fallback.reset()


def test_auto_picks_fused_kernels_for_long_evaluation_and_materializes_for_training() -> None:
    q, k, v = (torch.randn(1, 2, 50, 8) for _ in range(3))
    prob = prepare(q, k, v, True, torch.tensor([0.5, 0.0]), None, None)
    with torch.no_grad(), _forced():
        assert engine._choose(q, prob, Softmax(), grad=False) == "fused"
        assert engine._choose(q, prob, TopK(4), grad=False) == "fused"
        assert engine._choose(q, prob, Entmax(1.5), grad=False) == "fused"
        assert engine._choose(q, prob, Custom(_relu2), grad=False) == "chunked"
    for normalizer in (Softmax(), Entmax(1.5), Custom(_relu2)):
        assert engine._choose(q, prob, normalizer, grad=True) == "materialized"
    cuda_like = SimpleNamespace(device=torch.device("cuda"))
    with _forced():
        assert engine._choose(cuda_like, prob, Softmax(), grad=False) == "flex"  # type: ignore[arg-type]
        assert engine._choose(cuda_like, prob, AdaptiveTemperature(), grad=False) == "chunked"  # type: ignore[arg-type]
        if HAS_TRITON:
            subset = prepare(q[:, :, :5], k, v, True, None, None, torch.arange(5))
            assert engine._choose(cuda_like, subset, Entmax(1.5), grad=False) == "triton"  # type: ignore[arg-type]


def _forced():  # noqa: ANN202
    from lengthgen.testing import forced_chunking

    return forced_chunking(1 << 20)


def test_every_blocked_path_takes_its_blocks_from_the_one_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = chunking.plan_chunks

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(chunking, "plan_chunks", spy)
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    for normalizer, path in [(Custom(_relu2), "chunked"), (Entmax(1.5), "chunked"), (Entmax(1.5), "fused"),
                             (TopK(3), "fused"), (Softmax(), "fused")]:
        if path == "fused" and NUMBA_ERROR is not None:
            continue
        calls.clear()
        attend(q, k, v, normalizer, impl=path, diagnostics=True)
        assert calls, (normalizer, path)


def test_chunk_policy_keeps_the_64_row_floor_at_long_lengths() -> None:
    plan = chunking.plan_chunks(list(range(65_536)), 65_536, True, 4)
    assert min(stop - start for start, stop, _ in plan[:-1]) >= chunking.MIN_CHUNK_ROWS
    per_head = chunking.plan_chunks(list(range(65_536)), 65_536, True, 1)
    assert min(stop - start for start, stop, _ in per_head[:-1]) >= chunking.MIN_CHUNK_ROWS
    assert all(keys == stop for _, stop, keys in plan)  # causal: a block scores up to its last row


@pytest.mark.parametrize("name", ["softmax", "ssmax", "adaptive_temperature", "topk", "entmax", "sparsemax",
                                  "asentmax"])
def test_every_builtin_backend_evaluates_within_tolerance_of_fp64(name: str) -> None:
    """Each built-in's own long-evaluation route (forced) against its fp64 materialized result."""
    from lengthgen.testing import forced_chunking, make_backend

    backend = make_backend(name, "nape").eval()
    g = torch.Generator().manual_seed(11)
    n = 45
    q, k, v = (torch.randn(2, 4, n, 8, generator=g) for _ in range(3))
    x = torch.randn(2, n, 32, generator=g)
    slopes = torch.tensor([1.0, 0.5, 0.0, 0.0])
    pos = torch.arange(n)
    with torch.no_grad():
        scale = backend.query_scale(x, pos)
        qs = q if scale is None else q * scale.unsqueeze(-1)
        want, _ = attend(qs.double(), k.double(), v.double(), backend.normalizer(), alibi_slopes=slopes,
                         impl="materialized")
        with forced_chunking(1 << 20):
            got = backend(q, k, v, x, pos, slopes)
    tol = ATOL_FUSED_ADAPTIVE if name == "adaptive_temperature" else ATOL
    assert float((got.double() - want).abs().max()) <= tol


@pytest.mark.parametrize("rows", ["all", "some"])
@pytest.mark.parametrize("alibi", [False, True])
def test_a_differentiable_score_block_has_autograds_numbers_bit_for_bit(rows: str, alibi: bool) -> None:
    """Training's score block (its own backward, ``problem._ScaledMaskedScores``) against the same
    operations recorded by autograd out of place: equal scores and q, k gradients, bit for bit, so
    recorded runs still re-derive."""
    from lengthgen.kernels.problem import score_block

    g = torch.Generator().manual_seed(3)
    n, scale = 29, 1 / math.sqrt(8)
    q_pos = torch.arange(n) if rows == "all" else torch.tensor([0, 7, 28])
    slopes = torch.tensor([0.5, 0.125, 0.0], dtype=torch.float64) if alibi else None
    q0, k0 = torch.randn(2, 3, len(q_pos), 8, generator=g), torch.randn(2, 3, n, 8, generator=g)
    weights = torch.randn(2, 3, len(q_pos), n, generator=g)

    def gradients(block: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, ...]:
        (torch.softmax(block, -1) * weights).sum().backward()
        assert q.grad is not None and k.grad is not None
        return block.detach(), q.grad, k.grad

    q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    got = gradients(score_block(q, k, q_pos, slopes, scale), q, k)
    q, k = q0.clone().requires_grad_(), k0.clone().requires_grad_()
    expected = torch.matmul(q, k.transpose(-1, -2)) * scale
    if slopes is not None:
        distance = (q_pos[:, None] - torch.arange(n)[None, :]).float()
        expected = expected.addcmul(slopes.float()[:, None, None], distance, value=-1.0)
    expected = expected.masked_fill(torch.arange(n)[None, :] > q_pos[:, None], -math.inf)
    for got_t, want in zip(got, gradients(expected, q, k), strict=True):
        assert torch.equal(got_t, want)


@pytest.mark.parametrize("rows", ["all", "some"])
@pytest.mark.parametrize("alibi", [False, True])
def test_a_biased_score_block_has_autograds_numbers(rows: str, alibi: bool) -> None:
    """With a cumulative bias (FoX's gates; ``problem._BiasedScores``): the scores and the gradients
    of q and k equal autograd's for the same operations out of place (the float64 differences
    rounded to float32), bit for bit, in training and in evaluation; the bias increments' gradient,
    whose sums run in float32, equals autograd's (float64 sums) to 1e-6 of its largest entry."""
    from lengthgen.kernels.problem import score_block

    g = torch.Generator().manual_seed(5)
    n, scale = 31, 1 / math.sqrt(8)
    q_pos = torch.arange(n) if rows == "all" else torch.tensor([0, 7, 30])
    slopes = torch.tensor([0.5, 0.125, 0.0], dtype=torch.float64) if alibi else None
    q0, k0 = torch.randn(2, 3, len(q_pos), 8, generator=g), torch.randn(2, 3, n, 8, generator=g)
    g0 = torch.nn.functional.logsigmoid(3 * torch.randn(2, 3, n, generator=g))  # log-gates, some near 0
    weights = torch.randn(2, 3, len(q_pos), n, generator=g)

    def run(block_of: Callable[..., torch.Tensor]) -> tuple[torch.Tensor, ...]:
        q, k, inc = q0.clone().requires_grad_(), k0.clone().requires_grad_(), g0.clone().requires_grad_()
        block = block_of(q, k, torch.cumsum(inc.double(), -1))
        (torch.softmax(block, -1) * weights).sum().backward()
        return block.detach(), q.grad, k.grad, inc.grad

    def expected(q: torch.Tensor, k: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        block = torch.matmul(q, k.transpose(-1, -2)) * scale
        if slopes is not None:
            distance = (q_pos[:, None] - torch.arange(n)[None, :]).float()
            block = block.addcmul(slopes.float()[:, None, None], distance, value=-1.0)
        block = block + (c.index_select(-1, q_pos)[..., :, None] - c[..., None, :]).to(block.dtype)
        return block.masked_fill(torch.arange(n)[None, :] > q_pos[:, None], -math.inf)

    got = run(lambda q, k, c: score_block(q, k, q_pos, slopes, scale, True, c))
    want = run(expected)
    for got_t, want_t in zip(got[:3], want[:3], strict=True):
        assert torch.equal(got_t, want_t)
    assert float((got[3] - want[3]).abs().max()) <= 1e-6 * float(want[3].abs().max())
    with torch.no_grad():
        c = torch.cumsum(g0.double(), -1)
        assert torch.equal(score_block(q0, k0, q_pos, slopes, scale, True, c), expected(q0, k0, c))
