"""Triton α-entmax attention vs an fp64 reference (entmax_bisect on the materialized scores).

Through the public seam (``entmax_attention(..., impl="triton")``) wherever the test is about
results; the private op only where a test needs its internals (tile map, buffers, registration).
On CPU the kernels run under TRITON_INTERPRET=1 (set in conftest.py), so shapes stay small; tests
marked `cuda` need a GPU (bf16, long sequences).
"""

from __future__ import annotations

import math
import os
import sys

import pytest
import torch

pytest.importorskip("triton")
entmax = pytest.importorskip("entmax")

import lengthgen.kernels.triton.entmax as te  # noqa: E402
from lengthgen.kernels import entmax_attention  # noqa: E402
from lengthgen.kernels.triton.entmax import triton_entmax_attention  # noqa: E402

CUDA = torch.cuda.is_available()
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
pytestmark = pytest.mark.skipif(not (CUDA or INTERPRET), reason="needs CUDA or TRITON_INTERPRET=1")
DEV = "cuda" if CUDA else "cpu"
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")


def reference(q, k, v, alpha, causal=True, slopes=None, scale=None):
    """fp64 α-entmax attention on the full score matrix (the oracle)."""
    q, k, v = q.double(), k.double(), v.double()
    B, H, N, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    z = scale * q @ k.transpose(-1, -2)
    i = torch.arange(N, device=q.device)
    if slopes is not None:
        z = z - slopes.double().view(1, H, 1, 1) * (i[:, None] - i[None, :]).double()
    if causal:
        z = z.masked_fill(i[None, :] > i[:, None], float("-inf"))
    a = torch.as_tensor(alpha, dtype=torch.float64, device=q.device)
    if a.dim() == 1:
        a = a.view(1, H, 1, 1).expand(B, H, N, 1)
    p = entmax.entmax_bisect(z, a, dim=-1, n_iter=80)
    return p @ v


def make_qkv(B, H, N, D, dtype=torch.float32, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(B, H, N, D, generator=g) * spread).to(DEV, dtype).requires_grad_() for _ in range(3)]


def rel_err(a, b):
    return ((a.double() - b).norm() / b.norm().clamp_min(1e-30)).item()


def check_against_reference(q, k, v, alpha, causal=True, slopes=None, fwd_tol=1e-4, grad_tol=1e-3):
    o = entmax_attention(q, k, v, alpha, causal, slopes, impl="triton")
    r = reference(q, k, v, alpha, causal, slopes)
    assert o.shape == q.shape and o.dtype == q.dtype
    assert torch.isfinite(o).all()
    assert (o.double() - r).abs().max().item() <= fwd_tol
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref_grads = torch.autograd.grad(r, (q, k, v), do.double())
    for name, g, gr in zip("qkv", grads, ref_grads, strict=True):
        assert torch.isfinite(g).all(), name
        assert rel_err(g, gr) <= grad_tol, (name, rel_err(g, gr))


@pytest.mark.parametrize(
    "alpha, alibi, N, causal",
    [
        (1.5, False, 70, True),   # N not a multiple of the 32-wide interpreter tiles
        (1.5, True, 100, True),
        (1.25, False, 64, True),
        (1.25, True, 45, True),
        (2.0, False, 50, True),   # sparsemax
        (2.0, True, 81, True),
        (1.5, False, 40, False),
        (1.25, True, 37, False),
    ],
)
def test_forward_and_grads_match_reference(alpha, alibi, N, causal):
    q, k, v = make_qkv(1, 2, N, 32, seed=N, spread=1.5)
    slopes = torch.tensor([0.25, 0.0625], device=DEV) if alibi else None
    check_against_reference(q, k, v, alpha, causal, slopes)


def test_per_head_alpha_tensor():
    q, k, v = make_qkv(1, 2, 66, 32, seed=3, spread=2.0)
    alpha = torch.tensor([1.3, 1.9], device=DEV)
    check_against_reference(q, k, v, alpha, True, torch.tensor([0.5, 0.0], device=DEV))


@pytest.mark.parametrize("D", [16, 48, 64])
def test_head_dims(D):
    q, k, v = make_qkv(2, 1, 40, D, seed=D)
    check_against_reference(q, k, v, 1.5)


def _scores_and_tau(q, k, alpha, slopes=None):
    """fp64 z' = (α − 1)·z (causal, −inf above the diagonal) and τ by bisection to fp64 precision."""
    q, k = q.detach().double(), k.detach().double()
    B, H, N, D = q.shape
    z = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(N, device=q.device)
    if slopes is not None:
        z = z - slopes.double().view(1, H, 1, 1) * (i[:, None] - i[None, :]).double()
    z = (alpha - 1) * z.masked_fill(i[None, :] > i[:, None], float("-inf"))
    lo, hi = z.amax(-1) - 1, z.amax(-1)
    for _ in range(70):
        mid = (lo + hi) / 2
        ge = (z - mid[..., None]).clamp_min(0).pow(1 / (alpha - 1)).sum(-1) >= 1
        lo, hi = torch.where(ge, mid, lo), torch.where(ge, hi, mid)
    return z, lo


def test_long_row_with_alibi_skips_dead_tiles():
    """Steep ALiBi confines the support near the diagonal: the tile map's bit 1 marks exactly the
    tiles holding support, the output pass and both backward kernels compute only those (counted),
    and the result still matches the reference."""
    from lengthgen.kernels.triton.entmax_passes import count_passes

    q, k, v = make_qkv(1, 1, 256, 32, seed=7)
    slopes = torch.tensor([1.0], device=DEV)
    check_against_reference(q, k, v, 1.5, True, slopes)
    alpha = torch.full((1,), 1.5, device=DEV)
    with torch.no_grad():
        *_, tile_map, _ent, _sup = te._entmax_fwd_op(
            q, k, v, alpha, slopes, None, 1 / math.sqrt(32), True, 1, False, False
        )
    z, tau = _scores_and_tau(q, k, 1.5, slopes)
    support = (z > tau[..., None])[0, 0].reshape(8, 32, 8, 32).any(3).any(1)  # (row tile, key tile)
    tiles = tile_map[0]
    lower = torch.tril(torch.ones_like(tiles, dtype=torch.bool))
    assert torch.equal((tiles >> 1) & 1 == 1, support.to(tiles.device))
    assert support.diagonal().all() and (~support[lower]).sum() > 10
    assert ((tiles & 1) >= (tiles >> 1)).all()  # bit 0 ("may hold support") covers bit 1
    assert (tiles[~lower] == 0).all()  # never visited (causal), left at zero
    counts = count_passes(q, k, v, 1.5, alibi_slopes=slopes, blocks=(32, 32))
    last = torch.gather(counts.tiles, 2, (counts.passes.long() - 1)[..., None])[..., 0]
    assert torch.equal(last[0], support.sum(1).to(last.dtype))  # the output pass: support tiles only
    assert torch.equal(counts.dq_tiles[0], support.sum(1).to(last.dtype))
    assert torch.equal(counts.dkdv_tiles[0], support.sum(0).to(last.dtype))
    summary = counts.summary()
    assert summary["output_pass_tile_share"] == summary["bwd_tile_share"] < 0.7


def output_and_tau(q, k, v, alpha, slopes=None):
    """The op's output (differentiable) and τ, from one forward."""
    alpha_t = torch.full((q.shape[1],), alpha, device=DEV)
    o, tau, *_ = te._entmax_fwd_op(q, k, v, alpha_t, slopes, None, 1 / math.sqrt(q.shape[-1]), True,
                                    te._pow_mode(alpha), torch.is_grad_enabled(), False)
    return o, tau


def check_exact(q, k, v, alpha, slopes=None):
    """fp32 within 1e-5 of fp64 (forward: max |error|; gradients, when q needs one: relative), and
    the support (keys above τ) the fp64 reference's but for keys within 1e-6 of τ."""
    o, tau = output_and_tau(q, k, v, alpha, slopes)
    r = reference(q, k, v, alpha, True, slopes)
    assert (o.double() - r).abs().max().item() <= 1e-5
    if q.requires_grad:
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), do)
        ref_grads = torch.autograd.grad(r, (q, k, v), do.double())
        for name, g, gr in zip("qkv", grads, ref_grads, strict=True):
            assert rel_err(g, gr) <= 1e-5, (name, rel_err(g, gr))
    z, tau_ref = _scores_and_tau(q, k, alpha, slopes)
    differ = (z > tau.detach().double()[..., None]) != (z > tau_ref[..., None])
    assert ((z - tau_ref[..., None]).abs()[differ] <= 1e-6).all()


@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
@pytest.mark.parametrize("regime, spread, alibi", [("random", 1.0, False), ("peaked", 4.0, False),
                                                   ("flat", 0.01, False), ("random", 1.0, True)])
def test_exact_in_fp32(alpha, regime, spread, alibi):
    """``check_exact`` on rows of up to five 32-wide tiles: the bracket pass's two first tiles and
    its loop, the refinement and the (corrected) output pass all take part."""
    g = torch.Generator().manual_seed(int(spread * 100) + int(alpha * 10) + alibi)
    q, k, v = (torch.randn(1, 2, 160, 16, generator=g).to(DEV) for _ in range(3))
    q = (q * spread).requires_grad_()
    k, v = k.requires_grad_(), v.requires_grad_()
    check_exact(q, k, v, alpha, torch.tensor([0.05, 0.0], device=DEV) if alibi else None)


def test_exact_on_rows_past_the_histograms_field_limit():
    """Rows of 17 tiles: the bracket pass empties its 4-bit histogram fields into per-row counts
    (every 15 tiles) and shifts those as the maximum rises; the forward stays exact."""
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(1, 1, 544, 16, generator=g).to(DEV) for _ in range(3))
    with torch.no_grad():
        check_exact(q, k, v, 1.5)


@pytest.mark.parametrize("regime, spread", [("random", 1.0), ("peaked", 4.0), ("flat", 0.01)])
def test_forward_makes_three_passes_over_k(regime, spread):
    """The bracket pass, one refinement and the output pass: at most 3 passes in the median row
    block and 4 at the 95th percentile (flat rows: one more), with the GPU's 64×64 tiles."""
    from lengthgen.kernels.triton.entmax_passes import count_passes

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 640, 16, generator=g).to(DEV) for _ in range(3))
    extra = 1 if regime == "flat" else 0
    for alpha in (1.25, 1.5, 2.0):
        summary = count_passes(q * spread, k, v, alpha, backward=False).summary()
        assert summary["passes_median"] <= 3 + extra and summary["passes_p95"] <= 4 + extra, (alpha, summary)


def test_outputs_fully_overwritten_when_buffers_are_poisoned(monkeypatch):
    """Every buffer the kernels write (o, τ, Σp, V_u, dq, dk, dv) starts as NaN."""

    def poisoned(shape, dtype, device):
        return torch.full(shape, float("nan"), dtype=dtype, device=device)

    monkeypatch.setattr(te, "_alloc", poisoned)
    q, k, v = make_qkv(1, 2, 53, 32, seed=11)
    check_against_reference(q, k, v, 1.5, True, torch.tensor([0.3, 0.0], device=DEV))


def test_non_contiguous_inputs_and_partial_grads():
    g = torch.Generator().manual_seed(5)
    # (B, N, H, D) storage viewed as (B, H, N, D), as attention layers produce it.
    q, k, v = (torch.randn(1, 45, 2, 32, generator=g).to(DEV).transpose(1, 2) for _ in range(3))
    v = v.detach().requires_grad_()
    o = entmax_attention(q, k, v, 1.5, impl="triton")
    r = reference(q, k, v, 1.5)
    assert (o.double() - r).abs().max().item() <= 1e-4
    do = torch.randn_like(o)
    (dv,) = torch.autograd.grad(o, (v,), do)
    (dv_ref,) = torch.autograd.grad(r, (v,), do.double())
    assert rel_err(dv, dv_ref) <= 1e-3


def test_no_grad_forward_and_fp16():
    q, k, v = make_qkv(1, 2, 48, 32, dtype=torch.float16, seed=2)
    with torch.no_grad():
        o = entmax_attention(q, k, v, 1.5, alibi_slopes=torch.tensor([0.1, 0.2], device=DEV), impl="triton")
    r = reference(q, k, v, 1.5, slopes=torch.tensor([0.1, 0.2], device=DEV))
    assert o.dtype == torch.float16 and not o.requires_grad
    assert (o.double() - r).abs().max().item() <= 5e-3


def test_custom_op_registration_and_torch_compile():
    """The kernels are opaque custom ops: schema, fake (meta) kernels and autograd check out, and a
    compiled caller gets the same values and gradients without graph breaks."""
    q, k, v = make_qkv(1, 2, 40, 16, seed=9)
    alpha = torch.tensor([1.3, 1.7], device=DEV)
    slopes = torch.tensor([0.1, 0.2], device=DEV)
    torch.library.opcheck(te._entmax_fwd_op, (q, k, v, alpha, slopes, None, 0.25, True, 0, True, False))

    def f(q, k, v):
        return triton_entmax_attention(q, k, v, alpha, alibi_slopes=slopes)

    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    o, oc = f(q, k, v), compiled(q, k, v)
    assert torch.equal(o, oc)
    do = torch.randn_like(o)
    for g, gc in zip(torch.autograd.grad(o, (q, k, v), do), torch.autograd.grad(oc, (q, k, v), do),
                     strict=True):
        assert torch.equal(g, gc)


@pytest.mark.parametrize("alpha, alibi", [(1.5, True), (1.25, False), (2.0, True)])
def test_query_subset_and_statistics_through_the_seam(alpha, alibi):
    """Evaluation's call: a subset of query rows (absolute positions, any order) and the
    diagnostics, against the fp64 materialized path; gradients are refused for a subset."""
    q, k, v = (t.detach() for t in make_qkv(1, 2, 75, 32, seed=31, spread=1.5))
    pos = torch.tensor([0, 3, 40, 74, 17, 33, 63, 64], device=DEV)
    slopes = torch.tensor([0.3, 0.0], device=DEV) if alibi else None
    out, stats = entmax_attention(q[:, :, pos], k, v, alpha, True, slopes, q_positions=pos, impl="triton",
                                  return_stats=True)
    ref, ref_stats = entmax_attention(
        q[:, :, pos].double(), k.double(), v.double(), alpha, True, slopes, q_positions=pos,
        impl="materialized", return_stats=True,
    )
    assert (out.double() - ref).abs().max().item() <= 1e-5
    assert torch.equal(stats["rows"].cpu(), torch.arange(8))
    assert (stats["entropy"].double() - ref_stats["entropy"].double()).abs().max().item() <= 1e-5
    assert torch.equal(stats["support"].cpu(), ref_stats["support"].cpu())
    with pytest.raises(ValueError, match="full causal rows"):
        triton_entmax_attention(q[:, :, pos].requires_grad_(), k, v, alpha, q_positions=pos)


def test_rejects_bad_arguments(monkeypatch):
    q, k, v = make_qkv(1, 2, 8, 16)
    with pytest.raises(ValueError, match="alpha"):
        triton_entmax_attention(q, k, v, 2.5)
    with pytest.raises(ValueError, match="alpha"):
        triton_entmax_attention(q, k, v, torch.tensor([1.5, 1.0]))
    with pytest.raises(ValueError, match="per head"):
        triton_entmax_attention(q, k, v, torch.tensor([1.5, 1.5, 1.5]))
    with pytest.raises(ValueError, match="one shape"):
        triton_entmax_attention(q, k[:, :, :4], v[:, :, :4])
    if not CUDA:
        monkeypatch.setenv("TRITON_INTERPRET", "0")
        with pytest.raises(RuntimeError, match="CUDA"):
            triton_entmax_attention(q, k, v)


def test_the_engine_runs_the_launcher_on_the_values_it_checked(monkeypatch):
    """The engine validated the call and α per head; its Triton path goes to the launcher without
    the public wrapper's checks, and gives the wrapper's numbers bit for bit."""
    q, k, v = make_qkv(1, 2, 24, 16)
    alpha, slopes = torch.tensor([1.5, 1.25]), torch.tensor([0.0, 0.25])
    with torch.no_grad():
        direct = triton_entmax_attention(q, k, v, alpha, True, slopes)

        def checked_again(*args, **kwargs):
            raise AssertionError("the engine's path checked its arguments again")

        monkeypatch.setattr(te, "_checked_arguments", checked_again)
        through_engine = entmax_attention(q, k, v, alpha, True, slopes, impl="triton")
    assert torch.equal(direct, through_engine)


def test_missing_triton_is_a_clear_runtime_error(monkeypatch):
    monkeypatch.setattr(te, "_kernels", None)
    monkeypatch.setitem(sys.modules, "lengthgen.kernels.triton.entmax_kernels", None)
    q, k, v = make_qkv(1, 1, 4, 16)
    with pytest.raises(RuntimeError, match="triton"):
        triton_entmax_attention(q, k, v)
    assert not te.triton_available()


# ---- GPU only ------------------------------------------------------------------------------------


@pytest.mark.cuda
@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("alpha", [1.25, 1.5, 2.0])
def test_cuda_half_precision(dtype, alpha):
    q, k, v = make_qkv(2, 4, 1000, 64, dtype=dtype, seed=1)
    slopes = 2.0 ** (-torch.arange(1, 5, device=DEV, dtype=torch.float32))
    o = entmax_attention(q, k, v, alpha, True, slopes, impl="triton")
    r = reference(q, k, v, alpha, True, slopes)
    assert (o.double() - r).abs().max().item() <= 2e-2
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do)
    ref_grads = torch.autograd.grad(r, (q, k, v), do.double())
    for g, gr in zip(grads, ref_grads, strict=True):
        assert rel_err(g, gr) <= 3e-2


@pytest.mark.cuda
@cuda_only
def test_cuda_long_sequence_memory_is_linear():
    """N = 16384 would need 1 GiB per head for the score matrix; the kernel must not allocate it."""
    N = 16384
    q, k, v = make_qkv(1, 2, N, 64, dtype=torch.bfloat16, seed=4)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    o = triton_entmax_attention(q, k, v, 1.5)
    o.float().sum().backward()
    torch.cuda.synchronize()
    assert torch.isfinite(o).all() and torch.isfinite(q.grad).all()
    assert torch.cuda.max_memory_allocated() - base < 64 * N * 2 * 64 * 4
    # Rows checked against the reference on a short prefix (causal rows only see their prefix).
    n = 1024
    r = reference(q[:, :, :n], k[:, :, :n], v[:, :, :n], 1.5)
    assert (o[:, :, :n].double() - r).abs().max().item() <= 2e-2


def _kernel_specializations(kernel, calls):
    """The keys Triton's JIT compiles one kernel binary per, for each recorded launch: per argument
    its type and, unless the kernel opts out, whether it is 1 or divisible by 16 (pointers: 16-byte
    aligned); constexprs by value. Computed with Triton's own specializer, so the interpreter
    counts what a GPU would compile."""
    import inspect

    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import JITFunction, native_specialize_impl

    interpreted = kernel.fn  # the Autotuner's InterpretedFunction
    options = {k: interpreted.kwargs.get(k) for k in ("do_not_specialize", "do_not_specialize_on_alignment")}
    jit = JITFunction(interpreted.fn, **options)
    signature = inspect.signature(interpreted.fn)
    keys = set()
    for args, kwargs in calls:
        bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k in signature.parameters})
        key = []
        for param in jit.params:
            value = bound.arguments[param.name]
            if param.is_constexpr:
                key.append(("constexpr", value))
            else:
                key.append(native_specialize_impl(BaseBackend, value, param.is_const,
                                                  not param.do_not_specialize,
                                                  not param.do_not_specialize_on_alignment))
        keys.add(repr(key))
    return keys


@pytest.mark.skipif(not INTERPRET, reason="counts launches under the interpreter")
def test_a_training_run_compiles_a_few_kernels_whatever_its_lengths(monkeypatch):
    """Every training length of a run (32..64, as MQMTAR and copy train) through the forward and
    both backward kernels, shaped as the model calls them (q, k, v as transposed views of the
    projections): a bounded number of distinct specializations per kernel, however many lengths."""
    from lengthgen.kernels.engine import attend
    from lengthgen.kernels.normalizers import Entmax
    from lengthgen.kernels.problem import full_row_positions

    kern = te._load_kernels()
    kernels = {"threshold": kern.entmax_fwd_threshold, "output": kern.entmax_fwd_output,
               "dq": kern.entmax_bwd_dq, "dkdv": kern.entmax_bwd_dkdv}
    calls = {name: [] for name in kernels}
    for name, kernel in kernels.items():
        real = kernel.fn.run

        def record(*args, _name=name, _real=real, **kwargs):
            calls[_name].append((args, kwargs))
            return _real(*args, **kwargs)

        monkeypatch.setattr(kernel.fn, "run", record)
    heads, d_head, slopes = 2, 16, torch.tensor([0.5, 0.0])
    g = torch.Generator().manual_seed(0)
    for n in range(32, 65):
        x = torch.randn(1, n, 3 * heads * d_head, generator=g).requires_grad_()
        q, k, v = (t.view(1, n, heads, d_head).transpose(1, 2) for t in x.split(heads * d_head, dim=-1))
        out, _ = attend(q, k, v, Entmax(1.5), q_positions=full_row_positions(n, q.device),
                        alibi_slopes=slopes, impl="triton")
        out.sum().backward()
    counts = {name: len(_kernel_specializations(kernels[name], recorded)) for name, recorded in calls.items()}
    assert all(len(recorded) == 33 for recorded in calls.values())
    # 3 each while the lengths were specialized on
    assert counts == {"threshold": 1, "output": 1, "dq": 1, "dkdv": 1}
    # fused multiply-adds asked for by every launch, not left to a Triton default that may change
    launches = [kwargs for recorded in calls.values() for _, kwargs in recorded]
    assert all(kwargs.get("enable_fp_fusion") is True for kwargs in launches)
