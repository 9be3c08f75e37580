"""Every α-entmax attention path against a brute-force fp64 reference (materialize, mask, ALiBi,
entmax_bisect row by row), plus dispatch, stats, independence and determinism."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

entmax_pkg = pytest.importorskip("entmax")

from lengthgen.kernels import entmax_attention, fallback  # noqa: E402
from lengthgen.kernels.cpu import entmax as cpu_entmax  # noqa: E402
from lengthgen.kernels.cpu.entmax import fused_entmax_attention  # noqa: E402
from lengthgen.kernels.cpu.jit import Kernel  # noqa: E402
from lengthgen.kernels.problem import prepare  # noqa: E402
from lengthgen.kernels.reference.entmax import chunked_entmax_attention  # noqa: E402
from lengthgen.testing import forced_chunking  # noqa: E402

IMPLS = ["materialized", "chunked", "fused"]
ATOL = 2e-5  # fp32 paths vs the fp64 oracle (the exactness bound is 1e-5)

FUSED = not cpu_entmax.KERNEL.unavailable_reason()
needs_numba = pytest.mark.skipif(not FUSED, reason="numba unavailable")


def brute(q, k, v, alpha, causal=True, slopes=None, scale=None, pos=None):  # noqa: ANN001, ANN201
    """fp64 reference: output, probabilities (B, H, Nq, Nk) and visible counts (Nq,)."""
    B, H, Nq, D = q.shape
    Nk = k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    pos = torch.arange(Nk - Nq, Nk) if pos is None else pos
    z = (q.double() @ k.double().transpose(-1, -2)) * scale
    j = torch.arange(Nk)
    if slopes is not None:
        z = z - slopes.double().view(1, H, 1, 1) * (pos[:, None] - j[None, :]).double()
    if causal:
        z = z.masked_fill(j[None, :] > pos[:, None], -math.inf)
    p = torch.empty_like(z)
    for h in range(H):  # row by row per head, so per-head α is the package's scalar α
        a = float(alpha[h]) if isinstance(alpha, torch.Tensor) else alpha
        p[:, h] = entmax_pkg.entmax_bisect(z[:, h], a, n_iter=100)
    n_vis = (pos + 1).clamp(max=Nk) if causal else torch.full_like(pos, Nk)
    return p @ v.double(), p, n_vis


def inputs(B=2, H=3, Nq=37, Nk=None, D=8, regime="random", seed=0):  # noqa: ANN001, ANN201
    g = torch.Generator().manual_seed(seed)
    Nk = Nq if Nk is None else Nk
    q = torch.randn(B, H, Nq, D, generator=g)
    k = torch.randn(B, H, Nk, D, generator=g)
    v = torch.randn(B, H, Nk, D, generator=g)
    if regime == "peaked":
        q = q * 6
    elif regime == "flat":
        q = torch.zeros_like(q)  # all scores equal: the support is every visible key
    return q, k, v


def run(impl, q, k, v, alpha, **kw):  # noqa: ANN001, ANN201
    if impl == "fused" and not FUSED:
        pytest.skip("numba unavailable")
    return entmax_attention(q, k, v, alpha, impl=impl, **kw)


CASES = [
    # (N, alpha, alibi, regime)
    (1, 1.5, False, "random"),
    (7, 1.5, True, "random"),
    (37, 1.25, False, "random"),
    (37, 2.0, True, "peaked"),
    (61, 1.5, False, "flat"),
    (61, 1.25, True, "flat"),
    (130, 1.5, True, "peaked"),
    (130, 2.0, False, "random"),
    (77, 1.7, True, "random"),
]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("n", "alpha", "alibi", "regime"), CASES)
def test_matches_bruteforce(impl: str, n: int, alpha: float, alibi: bool, regime: str) -> None:
    q, k, v = inputs(Nq=n, regime=regime, seed=n)
    slopes = torch.tensor([0.5, 0.0, 0.0625]) if alibi else None
    out = run(impl, q, k, v, alpha, alibi_slopes=slopes)
    ref, _, _ = brute(q, k, v, alpha, slopes=slopes)
    assert out.shape == q.shape and out.dtype == v.dtype
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_stats_match_bruteforce(impl: str) -> None:
    q, k, v = inputs(Nq=45, regime="random", seed=11)
    slopes = torch.tensor([0.25, 0.0, 1.0])
    out, stats = run(impl, q, k, v, 1.5, alibi_slopes=slopes, return_stats=True)
    ref, p, n_vis = brute(q, k, v, 1.5, slopes=slopes)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)
    plogp = torch.where(p > 0, p * p.clamp_min(1e-300).log(), torch.zeros_like(p))
    logn = n_vis.double().log()
    ent = torch.where(logn > 0, -plogp.sum(-1) / torch.where(logn > 0, logn, 1.0), 0.0)
    assert set(stats) == {"rows", "entropy", "support"}
    assert torch.equal(stats["rows"], torch.arange(45))
    assert stats["entropy"].shape == stats["support"].shape == q.shape[:3]
    torch.testing.assert_close(stats["entropy"].double(), ent, atol=1e-4, rtol=0)
    torch.testing.assert_close(stats["support"].double(), (p > 0).sum(-1).double(), atol=0, rtol=0)
    assert (stats["entropy"][:, :, 0] == 0).all()  # one visible key: entropy defined as 0


@pytest.mark.parametrize("impl", IMPLS)
def test_query_positions_subset_and_per_head_alpha(impl: str) -> None:
    q, k, v = inputs(Nq=50, regime="random", seed=5)
    pos = torch.tensor([0, 3, 17, 49, 31, 48])
    alpha = torch.tensor([1.5, 1.25, 2.0])
    slopes = torch.tensor([0.0, 0.3, 0.1])
    qs = q[:, :, pos]
    out = run(impl, qs, k, v, alpha, alibi_slopes=slopes, q_positions=pos)
    ref, _, _ = brute(qs, k, v, alpha, slopes=slopes, pos=pos)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)
    # Default positions with Nq < Nk: the last Nq rows.
    tail = run(impl, q[:, :, -4:], k, v, alpha, alibi_slopes=slopes)
    full = run(impl, q, k, v, alpha, alibi_slopes=slopes)
    torch.testing.assert_close(tail, full[:, :, -4:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_causal(impl: str) -> None:
    q, k, v = inputs(Nq=20, Nk=33, regime="random", seed=9)
    slopes = torch.tensor([0.1, 0.0, 0.2])
    pos = torch.arange(13, 33)
    out = run(impl, q, k, v, 1.25, causal=False, alibi_slopes=slopes, scale=0.5)
    ref, _, _ = brute(q, k, v, 1.25, causal=False, slopes=slopes, scale=0.5, pos=pos)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)


@needs_numba
@pytest.mark.parametrize("alpha", [1.5, 1.25, 2.0])
def test_fused_overflow_path_is_exact(alpha: float) -> None:
    """Small blocks (several per sequence) and a tiny candidate cap: flat rows must overflow."""
    q, k, v = inputs(Nq=70, regime="flat", seed=1)
    q[:, :, 35:] = torch.randn(q[:, :, 35:].shape)  # half flat, half random rows
    slopes = torch.tensor([0.0, 0.05, 0.0])
    prob = prepare(q, k, v, True, slopes, None, None)
    rows, a = torch.arange(70), torch.full((3,), alpha, dtype=torch.float64)
    with forced_chunking(600):
        out, ent, sup, dense_rows = fused_entmax_attention(q, k, v, prob, a, rows, cap=8)
    assert dense_rows > 0
    ref, p, _ = brute(q, k, v, alpha, slopes=slopes)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)
    assert sup is not None
    torch.testing.assert_close(sup.double(), (p > 0).sum(-1).double(), atol=0, rtol=0)
    # The same problem with the default cap takes the sparse path only where it can.
    out2, _, _, dense2 = fused_entmax_attention(q, k, v, prob, a, None)
    assert dense2 < dense_rows
    torch.testing.assert_close(out2.double(), ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("alpha", [1.5, 1.25])
def test_chunked_overflow_path_is_exact(alpha: float) -> None:
    q, k, v = inputs(Nq=70, regime="flat", seed=2)
    q[:, :, :30] = torch.randn(q[:, :, :30].shape) * 5
    prob = prepare(q, k, v, True, None, None, None)
    with forced_chunking(1000):
        a = torch.full((3,), alpha, dtype=torch.float64)
        out, _, _, dense_rows = chunked_entmax_attention(q, k, v, prob, a, None, cap=8)
    assert dense_rows > 0
    ref, _, _ = brute(q, k, v, alpha)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)


@needs_numba
def test_fused_threads_and_blocks_agree() -> None:
    q, k, v = inputs(B=1, H=2, Nq=150, D=16, regime="random", seed=4)
    prob = prepare(q, k, v, True, torch.tensor([0.2, 0.0]), None, None)
    a = torch.full((2,), 1.5, dtype=torch.float64)
    one, *_ = fused_entmax_attention(q, k, v, prob, a, None, threads=1)
    with forced_chunking(512):
        many, *_ = fused_entmax_attention(q, k, v, prob, a, None, threads=2)
    torch.testing.assert_close(one, many, atol=1e-6, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_batch_and_head_independence(impl: str) -> None:
    q, k, v = inputs(B=3, H=3, Nq=40, regime="random", seed=6)
    alpha = torch.tensor([1.5, 1.25, 2.0])
    slopes = torch.tensor([0.3, 0.0, 0.1])
    full = run(impl, q, k, v, alpha, alibi_slopes=slopes)
    one = run(impl, q[1:2, 2:3], k[1:2, 2:3], v[1:2, 2:3], alpha[2:3], alibi_slopes=slopes[2:3])
    torch.testing.assert_close(full[1:2, 2:3], one, atol=1e-6, rtol=0)
    # Changing another batch element or head changes nothing here.
    q2 = q.clone()
    q2[0] += 1.0
    q2[1, 0] *= 3.0
    other = run(impl, q2, k, v, alpha, alibi_slopes=slopes)
    torch.testing.assert_close(other[1, 1:], full[1, 1:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_deterministic(impl: str) -> None:
    q, k, v = inputs(B=1, H=2, Nq=90, regime="random", seed=8)
    a = run(impl, q, k, v, 1.5, return_stats=True)
    b = run(impl, q, k, v, 1.5, return_stats=True)
    assert torch.equal(a[0], b[0])
    assert all(torch.equal(a[1][key], b[1][key]) for key in a[1])


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs(impl: str, dtype: torch.dtype) -> None:
    q, k, v = (t.to(dtype) for t in inputs(Nq=33, regime="peaked", seed=3))
    out = run(impl, q, k, v, 1.5)
    assert out.dtype == dtype and torch.isfinite(out.float()).all()
    ref, _, _ = brute(q.float(), k.float(), v.float(), 1.5)
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=0)


@pytest.mark.parametrize("impl", IMPLS)
def test_extreme_scores_never_nan(impl: str) -> None:
    q, k, v = inputs(Nq=25, regime="random", seed=12)
    out = run(impl, q * 1e4, k, v, 1.25, alibi_slopes=torch.tensor([1e3, 0.0, 1.0]))
    assert torch.isfinite(out).all()


def test_auto_dispatch_and_gradients() -> None:
    q, k, v = (t.double().requires_grad_() for t in inputs(Nq=19, regime="random", seed=13))
    slopes = torch.tensor([0.2, 0.0, 0.5])
    out = entmax_attention(q, k, v, 1.5, alibi_slopes=slopes)  # needs grad → materialized
    ref, _, _ = brute(q.detach(), k.detach(), v.detach(), 1.5, slopes=slopes)
    torch.testing.assert_close(out.detach(), ref, atol=1e-10, rtol=0)
    g = torch.randn(out.shape, dtype=torch.float64)
    (out * g).sum().backward()

    # Autograd through the package's own Function, on the same graph.
    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    z = (q2 @ k2.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    pos = torch.arange(19)
    z = z - slopes.double().view(1, 3, 1, 1) * (pos[:, None] - pos[None, :]).double()
    z = z.masked_fill(pos[None, :] > pos[:, None], -math.inf)
    (entmax_pkg.entmax_bisect(z, 1.5, n_iter=100) @ v2 * g).sum().backward()
    for a, b in ((q, q2), (k, k2), (v, v2)):
        assert a.grad is not None and b.grad is not None
        torch.testing.assert_close(a.grad, b.grad, atol=1e-9, rtol=0)

    with torch.no_grad():
        fast = entmax_attention(q, k, v, 1.5, alibi_slopes=slopes)
    torch.testing.assert_close(fast, out.detach(), atol=ATOL, rtol=0)
    with pytest.raises(RuntimeError, match="not differentiable"):
        entmax_attention(q, k, v, 1.5, impl="chunked")


def test_auto_falls_back_to_chunked_without_numba(monkeypatch: pytest.MonkeyPatch) -> None:
    def build() -> None:
        raise ImportError("No module named 'numba'")

    monkeypatch.setattr(cpu_entmax, "KERNEL", Kernel(cpu_entmax.KERNEL.what, build, lambda kernel: None))
    fallback.reset()
    q, k, v = inputs(Nq=15, seed=14)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = entmax_attention(q, k, v, 1.5)
        entmax_attention(q, k, v, 1.5)
        with pytest.raises(RuntimeError, match="numba"):
            entmax_attention(q, k, v, 1.5, impl="fused")
    warned = [w for w in caught if issubclass(w.category, fallback.KernelFallbackWarning)]
    assert len(warned) == 1 and "chunked" in str(warned[0].message)  # one warning per process
    ref, _, _ = brute(q, k, v, 1.5)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)


def test_argument_errors() -> None:
    q, k, v = inputs(Nq=5)
    with pytest.raises(ValueError, match="impl"):
        entmax_attention(q, k, v, impl="nope")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="alpha"):
        entmax_attention(q, k, v, alpha=2.5)
    with pytest.raises(ValueError, match="alibi_slopes"):
        entmax_attention(q, k, v, alibi_slopes=torch.ones(5))
    with pytest.raises(ValueError, match="q_positions"):
        entmax_attention(q, k, v, q_positions=torch.arange(4))
    with pytest.raises(ValueError, match="q_positions"):
        entmax_attention(q, k, v, q_positions=torch.arange(1, 6))
    with pytest.raises(ValueError, match="B, H"):
        entmax_attention(q[0], k, v)
    with pytest.raises(ValueError, match="impl"):
        entmax_attention(q, k, v, impl="flex")


@needs_numba
@pytest.mark.parametrize("alpha", [1.5, 1.25])
def test_fused_alibi_window_is_exact(alpha: float) -> None:
    """Steep ALiBi heads let the fused path skip far keys (a proven bound); results stay exact."""
    q, k, v = inputs(B=1, H=3, Nq=300, D=8, regime="peaked", seed=21)
    k[:, :, :40] *= 4  # large far keys: the bound must still keep everything that matters
    slopes = torch.tensor([2.0, 0.0, 0.25])
    prob = prepare(q, k, v, True, slopes, None, None)
    a = torch.full((3,), alpha, dtype=torch.float64)
    with forced_chunking(2000):
        out, ent, sup, _ = fused_entmax_attention(q, k, v, prob, a, torch.arange(300))
    ref, p, n_vis = brute(q, k, v, alpha, slopes=slopes)
    torch.testing.assert_close(out.double(), ref, atol=ATOL, rtol=0)
    assert sup is not None and ent is not None
    torch.testing.assert_close(sup.double(), (p > 0).sum(-1).double(), atol=0, rtol=0)
