"""Single-GPU check and benchmark of the fused Triton α-entmax attention kernel.

Run from the repository root on one CUDA GPU (sized for an H200, finishes in well under 8 minutes):

    python benchmarks/kernel_gpu.py            # correctness + timing table
    python benchmarks/kernel_gpu.py --quick    # N ≤ 4096 only

1. correctness on CUDA against an fp64 reference (bisection α-entmax on the materialized scores) at a
   few shapes, forward and gradients;
2. `triton.testing.do_bench` medians of forward and forward+backward for N ∈ {1024, 4096, 16384,
   32768}, B=2, H=8, D=64, bf16, causal: torch SDPA (flash backend), this kernel at α = 1.5 and 1.3,
   and the `adasplash` package if it is installed;
3. a compact table, the ratios the issue targets, and peak memory per N (it should grow linearly).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lengthgen.kernels.triton_entmax import triton_entmax_attention  # noqa: E402

BUDGET_S = 7 * 60  # stop timing new sizes past this, so the script stays under 8 minutes
DEVICE = "cuda"
DTYPE = torch.bfloat16


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


def bench(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=100, return_mode="median"))


def time_impl(run: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
              q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[float, float, float]:
    """(forward ms, forward+backward ms, peak MiB of one forward+backward above the inputs)."""
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
        row = {"N": N}
        for name, fn in fns.items():
            try:
                row[name] = time_impl(fn, q, k, v)
            except Exception as exc:
                print(f"  {name} failed at N={N}: {type(exc).__name__}: {str(exc)[:200]}")
                row[name] = (float("nan"),) * 3
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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only N ≤ 4096")
    parser.add_argument("--skip-check", action="store_true", help="skip the correctness section")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("kernel_gpu.py needs a CUDA GPU (torch.cuda.is_available() is False); nothing was run.",
              file=sys.stderr)
        return 2
    try:
        import triton
    except ImportError:
        print("kernel_gpu.py needs the `triton` package; nothing was run.", file=sys.stderr)
        return 2
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET to benchmark the compiled kernels.", file=sys.stderr)
        return 2
    t0 = time.time()
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}")
    ok = True if args.skip_check else check_correctness()
    sizes = [1024, 4096] if args.quick else [1024, 4096, 16384, 32768]
    run_benchmarks(sizes, t0)
    print(f"\ntotal {time.time() - t0:.0f} s; correctness {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
