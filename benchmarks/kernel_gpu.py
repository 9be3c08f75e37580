"""Single-GPU check and benchmark of the CUDA attention paths: the Triton α-entmax kernel (training
and evaluation) and the softmax family's FlexAttention path.

Run from the repository root on one CUDA GPU (sized for an H200, finishes in well under 8 minutes):

    python benchmarks/kernel_gpu.py            # correctness + timing tables
    python benchmarks/kernel_gpu.py --quick    # N ≤ 4096 only
    python benchmarks/kernel_gpu.py --smoke    # tiny shapes; on a CPU through TRITON_INTERPRET=1

1. correctness on CUDA against an fp64 reference (bisection α-entmax on the materialized scores) at a
   few shapes, forward and gradients;
2. correctness of the evaluation calls through the engine: a subset of query rows at absolute
   positions plus the diagnostics (Triton, α-entmax) and softmax with NAPE slopes (FlexAttention),
   against the fp64 materialized path;
3. `triton.testing.do_bench` medians of forward and forward+backward for N ∈ {1024, 4096, 16384,
   32768}, B=2, H=8, D=64, bf16, causal: torch SDPA (flash backend), this kernel at α = 1.5 and 1.3,
   and the `adasplash` package if it is installed;
4. evaluation timing, fp32, B=1, H=8, D=64, N ∈ {4096, 16384, 65536}, NAPE slopes (half the heads
   1/k, half none), diagnostics on: SDPA causal without bias (the reference), the Triton α-entmax
   path on every row and on 1,024 scored rows, the chunked torch path it replaces, and softmax
   through FlexAttention and through the chunked path;
5. compact tables, ratios, and peak memory per N (it should grow linearly).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lengthgen.kernels.triton.entmax import triton_entmax_attention  # noqa: E402

BUDGET_S = 7 * 60  # stop timing new sizes past this, so the script stays under 8 minutes
DEVICE = "cuda"
DTYPE = torch.bfloat16
SMOKE = False  # --smoke: tiny shapes, CPU allowed (Triton interpreter), one timing run


class _EntmaxBisect(torch.autograd.Function):
    """fp64 α-entmax by bisection (fallback oracle when the `entmax` package is missing)."""

    @staticmethod
    def forward(ctx, z, a):  # type: ignore[override]
        zp = (a - 1) * z
        m = zp.amax(-1, keepdim=True)
        lo, hi = m - 1, m
        for _ in range(60):
            tau = (lo + hi) / 2
            s = (zp - tau).clamp_min(0).pow(1 / (a - 1)).sum(-1, keepdim=True)
            lo, hi = torch.where(s >= 1, tau, lo), torch.where(s >= 1, hi, tau)
        p = (zp - lo).clamp_min(0).pow(1 / (a - 1))
        p = p / p.sum(-1, keepdim=True)
        ctx.save_for_backward(p, a)
        return p

    @staticmethod
    def backward(ctx, g):  # type: ignore[override]
        p, a = ctx.saved_tensors
        u = torch.where(p > 0, p.pow(2 - a), torch.zeros_like(p))
        return u * g - (u * g).sum(-1, keepdim=True) / u.sum(-1, keepdim=True) * u, None


def reference(q, k, v, alpha, causal=True, slopes=None, scale=None):
    """fp64 α-entmax attention on the full score matrix (small N only): `entmax.entmax_bisect` when
    installed (an independent backward), else the bisection above."""
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
    a = (a.view(1, -1, 1, 1) if a.dim() == 1 else a.view(1, 1, 1, 1)).expand(B, H, N, 1)
    try:
        from entmax import entmax_bisect

        p = entmax_bisect(z, a, dim=-1, n_iter=60)
    except ImportError:
        p = _EntmaxBisect.apply(z, a)
    return p @ v


def check_correctness() -> bool:
    """Forward and gradient errors vs the fp64 reference; returns True when all are in tolerance."""
    print("== correctness vs fp64 reference ==")
    ok = True
    cases = [
        # B, H, N, D, dtype, alpha, alibi, fwd_tol, grad_rel_tol
        (1, 2, 1000, 64, torch.float32, 1.5, True, 1e-4, 1e-3),
        (2, 2, 513, 64, torch.float32, torch.tensor([1.25, 2.0]), True, 1e-4, 1e-3),
        (1, 4, 2048, 64, torch.bfloat16, 1.5, True, 2e-2, 3e-2),
        (1, 4, 1500, 128, torch.float16, 1.3, False, 1e-2, 2e-2),
    ]
    if SMOKE:
        cases = [(1, 2, 70, 32, torch.float32, 1.5, True, 1e-4, 1e-3),
                 (1, 2, 45, 32, torch.float32, torch.tensor([1.25, 2.0]), True, 1e-4, 1e-3)]
    g = torch.Generator(device=DEVICE).manual_seed(0)
    for B, H, N, D, dtype, alpha, alibi, ftol, gtol in cases:
        q, k, v = (torch.randn(B, H, N, D, device=DEVICE, generator=g).to(dtype).requires_grad_()
                   for _ in range(3))
        slopes = (2.0 ** (-8.0 * torch.arange(1, H + 1, device=DEVICE) / H)) if alibi else None
        a = alpha.to(DEVICE) if isinstance(alpha, torch.Tensor) else alpha
        o = triton_entmax_attention(q, k, v, a, True, slopes)
        r = reference(q, k, v, a, True, slopes)
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), do)
        rgrads = torch.autograd.grad(r, (q, k, v), do.double())
        ferr = (o.double() - r).abs().max().item()
        gerr = max(((x.double() - y).norm() / y.norm()).item() for x, y in zip(grads, rgrads, strict=True))
        good = ferr <= ftol and gerr <= gtol and bool(torch.isfinite(o).all())
        ok &= good
        label = alpha.tolist() if isinstance(alpha, torch.Tensor) else alpha
        print(f"  B={B} H={H} N={N:5d} D={D:3d} {str(dtype)[6:]:8s} α={label!s:12s} alibi={alibi!s:5s} "
              f"fwd max|err|={ferr:.1e} grad rel={gerr:.1e}  {'ok' if good else 'FAIL'}")
    return ok


def nape_slopes(heads: int) -> torch.Tensor:
    """NAPE: slopes 1/k on the first half of the heads, none on the other half."""
    half = heads // 2
    return torch.tensor([1.0 / k for k in range(1, half + 1)] + [0.0] * (heads - half), device=DEVICE)


def check_evaluation_paths() -> bool:
    """The engine's evaluation calls against the fp64 materialized path: Triton α-entmax on a row
    subset with diagnostics, and softmax with NAPE slopes through FlexAttention."""
    import warnings

    from lengthgen.kernels import entmax_attention
    from lengthgen.kernels.engine import attend
    from lengthgen.kernels.normalizers import Softmax

    print("\n== evaluation paths (engine) vs fp64 materialized ==")
    n, heads = (90, 4) if SMOKE else (4096, 8)
    g = torch.Generator(device=DEVICE).manual_seed(1)
    dim = 32 if SMOKE else 64
    q, k, v = (torch.randn(1, heads, n, dim, device=DEVICE, generator=g) for _ in range(3))
    slopes = nape_slopes(heads)
    rows = torch.cat([torch.tensor([0, n - 1]), torch.randperm(n - 2)[: n // 8] + 1]).to(DEVICE)
    ok = True
    for alpha in (1.5, 1.25, 2.0):
        with torch.no_grad():
            out, st = entmax_attention(q[:, :, rows], k, v, alpha, True, slopes, q_positions=rows,
                                       impl="triton", return_stats=True)
            ref, rst = entmax_attention(q[:, :, rows].double(), k.double(), v.double(), alpha, True, slopes,
                                        q_positions=rows, impl="materialized", return_stats=True)
        err = (out.double() - ref).abs().max().item()
        ent = (st["entropy"].double() - rst["entropy"].double()).abs().max().item()
        sup = (st["support"] - rst["support"]).abs().max().item()
        good = err <= 1e-4 and ent <= 1e-4 and sup <= 1
        ok &= good
        print(f"  triton α={alpha}: {rows.numel()} of {n} rows, max|err| {err:.1e}, entropy {ent:.1e}, "
              f"support {sup:.0f}  {'ok' if good else 'FAIL'}")
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FlexAttention on CPU (--smoke) warns that it is unfused
        for name, pos in (("all rows", torch.arange(n, device=DEVICE)), ("row subset", rows)):
            out, diag = attend(q[:, :, pos], k, v, Softmax(), q_positions=pos, alibi_slopes=slopes,
                               impl="flex", diagnostics=True)
            ref, rdiag = attend(q[:, :, pos].double(), k.double(), v.double(), Softmax(), q_positions=pos,
                                alibi_slopes=slopes, impl="materialized", diagnostics=True)
            assert diag is not None and rdiag is not None
            err = (out.double() - ref).abs().max().item()
            ent = (diag.entropy.double() - rdiag.entropy.double()).abs().max().item()
            good = err <= 1e-4 and ent <= 1e-4
            ok &= good
            verdict = "ok" if good else "FAIL"
            print(f"  flex softmax, NAPE, {name}: max|err| {err:.1e}, entropy {ent:.1e}  {verdict}")
    return ok


def _evaluation_calls(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                      slopes: torch.Tensor) -> dict[str, Callable[[], object]]:
    """The evaluation-shaped calls timed by ``run_evaluation_benchmarks``, by name."""
    from torch.nn.functional import scaled_dot_product_attention

    from lengthgen.kernels.engine import attend
    from lengthgen.kernels.normalizers import Entmax, Softmax

    def engine(normalizer: object, impl: str, subset: bool = False) -> Callable[[], object]:
        if subset:
            return lambda: attend(q[:, :, rows], k, v, normalizer, q_positions=rows, alibi_slopes=slopes,
                                  diagnostics=True, impl=impl)
        return lambda: attend(q, k, v, normalizer, alibi_slopes=slopes, diagnostics=True, impl=impl)

    return {
        "sdpa": lambda: scaled_dot_product_attention(q, k, v, is_causal=True),
        "entmax triton": engine(Entmax(1.5), "triton"),
        "entmax triton 1024 rows": engine(Entmax(1.5), "triton", subset=True),
        "entmax chunked": engine(Entmax(1.5), "chunked"),
        "softmax flex": engine(Softmax(), "flex"),
        "softmax chunked": engine(Softmax(), "chunked"),
    }


def run_evaluation_benchmarks(sizes: list[int], t0: float) -> None:
    """Evaluation-shaped calls (no gradients, diagnostics on), fp32, B=1, NAPE slopes."""
    import warnings

    heads, dim = (4, 32) if SMOKE else (8, 64)
    print(f"\n== evaluation: B=1 H={heads} D={dim} fp32 causal, NAPE slopes, diagnostics on, ms ==")
    slopes = nape_slopes(heads)
    names = list(_evaluation_calls(*(torch.zeros(1, 1, 1, 1),) * 3, torch.zeros(1), slopes))
    print(f"{'N':>6} | " + " | ".join(f"{n:>24}" for n in names))
    for N in sizes:
        if time.time() - t0 > BUDGET_S:
            print(f"  (skipping N={N}: time budget spent)")
            break
        g = torch.Generator(device=DEVICE).manual_seed(N)
        q, k, v = (torch.randn(1, heads, N, dim, device=DEVICE, generator=g) for _ in range(3))
        rows = torch.linspace(0, N - 1, min(N, 1024), device=DEVICE).long()
        calls = _evaluation_calls(q, k, v, rows, slopes)
        times: dict[str, float] = {}
        for name in names:
            if "chunked" in name and N > 16384:
                continue
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    calls[name]()  # compile / autotune outside the timing
                    times[name] = bench(calls[name])
            except Exception as exc:
                print(f"  {name} failed at N={N}: {type(exc).__name__}: {str(exc)[:200]}")
        base = times.get("sdpa")
        cells = []
        for name in names:
            ratio = f" ({times[name] / base:.2f}x)" if base and name in times and name != "sdpa" else " " * 8
            cells.append(f"{times[name]:>14.2f}{ratio:>10}" if name in times else f"{'-':>24}")
        print(f"{N:>6} | " + " | ".join(cells), flush=True)


def bench(fn: Callable[[], object]) -> float:
    if SMOKE:  # the interpreter is too slow for do_bench's repeats; one timed run proves the call works
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def time_impl(run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
              q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[float, float, float]:
    """(forward ms, forward+backward ms, peak MiB of one forward+backward above the inputs)."""
    if SMOKE:
        with torch.no_grad():
            fwd = bench(lambda: run(q, k, v))
        return fwd, bench(lambda: torch.autograd.grad(run(q, k, v), (q, k, v), torch.randn_like(q))), 0.0
    with torch.no_grad():
        fwd = bench(lambda: run(q, k, v))
    do = torch.randn_like(q)

    def fwd_bwd() -> None:
        o = run(q, k, v)
        torch.autograd.grad(o, (q, k, v), do)

    fwd_bwd()  # compile / autotune outside the timed region and the memory measurement
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fwd_bwd()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    return fwd, bench(fwd_bwd), peak


def impls() -> dict[str, Callable]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    def sdpa(q, k, v):
        if SMOKE:  # no flash backend on a CPU
            return scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=True)

    out: dict[str, Callable] = {
        "sdpa": sdpa,
        "ent1.5": lambda q, k, v: triton_entmax_attention(q, k, v, 1.5, True),
        "ent1.3": lambda q, k, v: triton_entmax_attention(q, k, v, 1.3, True),
    }
    try:
        import adasplash  # type: ignore[import-not-found]

        out["ada1.5"] = lambda q, k, v: adasplash.adasplash(q, k, v, alpha=1.5, is_causal=True)
        out["ada1.3"] = lambda q, k, v: adasplash.adasplash(q, k, v, alpha=1.3, is_causal=True)
    except Exception as exc:  # not installed, or broken on this machine
        print(f"(adasplash not available: {type(exc).__name__}: {exc})")
    return out


def run_benchmarks(sizes: list[int], t0: float) -> None:
    print("\n== timing: B=2 H=8 D=64 bf16 causal, do_bench median ms ==")
    fns = impls()
    rows = []
    for N in sizes:
        if time.time() - t0 > BUDGET_S:
            print(f"  (skipping N={N}: time budget spent)")
            break
        g = torch.Generator(device=DEVICE).manual_seed(N)
        q, k, v = (torch.randn(2, 8, N, 64, device=DEVICE, generator=g, dtype=DTYPE).requires_grad_()
                   for _ in range(3))
        row: dict[str, Any] = {"N": N}
        for name, fn in fns.items():
            try:
                row[name] = time_impl(fn, q, k, v)
            except Exception as exc:
                print(f"  {name} failed at N={N}: {type(exc).__name__}: {str(exc)[:200]}")
                row[name] = (float("nan"),) * 3
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        rows.append(row)
        print(f"  N={N} done ({time.time() - t0:.0f} s)")

    names = list(fns)
    head = f"{'N':>6} | " + " | ".join(f"{n + ' fwd':>11}" for n in names) + " | " + " | ".join(
        f"{n + ' f+b':>11}" for n in names)
    print("\n" + head + f" | {'ent1.5 MiB':>10} | {'sdpa MiB':>8}")
    print("-" * len(head) + "-" * 25)
    for r in rows:
        fw = " | ".join(f"{r[n][0]:11.3f}" for n in names)
        fb = " | ".join(f"{r[n][1]:11.3f}" for n in names)
        print(f"{r['N']:>6} | {fw} | {fb} | {r['ent1.5'][2]:10.1f} | {r['sdpa'][2]:8.1f}")

    print("\nratios (targets at N=16384: fwd ≤ 2.5× SDPA, f+b ≤ 1.5× SDPA, α=1.3 ≤ 1.3× α=1.5)")
    for r in rows:
        s, e15, e13 = r["sdpa"], r["ent1.5"], r["ent1.3"]
        print(f"  N={r['N']:>6}: fwd ent1.5/sdpa={e15[0] / s[0]:5.2f}  f+b ent1.5/sdpa={e15[1] / s[1]:5.2f}  "
              f"fwd 1.3/1.5={e13[0] / e15[0]:5.2f}  f+b 1.3/1.5={e13[1] / e15[1]:5.2f}")


def main() -> int:
    global DEVICE, DTYPE, SMOKE
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only N ≤ 4096")
    parser.add_argument("--skip-check", action="store_true", help="skip the correctness sections")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny shapes, one timed run each; runs on a CPU under TRITON_INTERPRET=1")
    args = parser.parse_args()
    SMOKE = args.smoke
    if SMOKE and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
        DEVICE, DTYPE = "cpu", torch.float32
    elif not torch.cuda.is_available():
        print("kernel_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); nothing was run. "
              "(--smoke checks the script on a CPU.)", file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("kernel_gpu.py needs the `triton` package; nothing was run.", file=sys.stderr)
        return 2
    if not SMOKE and os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET to benchmark the compiled kernels.", file=sys.stderr)
        return 2
    t0 = time.time()
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU (Triton interpreter)"
    print(f"device: {name}  torch {torch.__version__}  triton {triton.__version__}")
    ok = True if args.skip_check else check_correctness() & check_evaluation_paths()
    if SMOKE:
        sizes, eval_sizes = [64], [96]
    elif args.quick:
        sizes, eval_sizes = [1024, 4096], [4096]
    else:
        sizes, eval_sizes = [1024, 4096, 16384, 32768], [4096, 16384, 65536]
    run_benchmarks(sizes, t0)
    run_evaluation_benchmarks(eval_sizes, t0)
    print(f"\ntotal {time.time() - t0:.0f} s; correctness {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
