"""One GPU benchmark: correctness, attention kernels, pass counts, training steps/s, MQMTAR evaluation.

    PYTHONPATH=. python benchmarks/gpu.py            # one CUDA GPU: ≤ 6 minutes on an H200
    PYTHONPATH=. python benchmarks/gpu.py --smoke    # every section on CPU at tiny sizes (< 1 minute)

Needs torch, triton, numpy, pandas, pyarrow, pydantic and typer, and no network; ``adasplash`` and
``entmax`` are used when they import (their absence is recorded with the reason). Sections, each
with a time budget so the whole stays under 6 minutes (what a budget cut is recorded):

1. ``correctness``: the Triton α-entmax kernel against an fp64 α-entmax (bisection on the
   materialized scores), forward and gradients in fp32, bf16 and fp16, and the engine's evaluation
   calls (Triton on a row subset with diagnostics, softmax with NAPE slopes through FlexAttention)
   against the fp64 materialized path;
2. ``kernels``: forward and forward+backward at N = 4,096, 16,384 and 65,536 (B=2, H=8, D=64,
   bf16, causal, α = 1.5): torch SDPA (flash backend), this kernel, and ``adasplash``;
   ``triton.testing.do_bench`` medians, and each implementation's first call (compilation) apart;
3. ``passes``: the kernel's pass counter (``lengthgen.kernels.triton.entmax_passes``) at N = 4,096
   and 16,384: passes over K per row block and tiles computed, random / peaked / flat rows;
4. ``training``: steps/s and model TFLOP/s of the real training loop
   (``lengthgen.harness.train.train``) on MQMTAR at the ``paper-tasks`` and ``paper`` presets,
   softmax and ASEntmax, at the fixed length 64 and at lengths 32..64 drawn as a run draws them
   (fp32; the paper preset also with bf16 autocast, ``train.precision``); the steps before the
   timed ones (compilation, warm-up) are reported apart;
5. ``evaluation``: seconds of MQMTAR's 1024× evaluation (65,536 tokens, 32 samples,
   ``lengthgen.harness.evaluate.evaluate_length``) on a paper-tasks model with untrained weights
   (the time does not depend on them), ASEntmax and softmax.

It writes one JSON under ``benchmarks/results/`` (``gpu-<date>-<device>.json``; ``--out-dir``
elsewhere) and prints a table per section. Exit status 1 if a correctness check failed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

#: Seconds each section may start new cases in (the last case started may run past it), and the
#: whole run's: a section also stops where only the later sections' reserves would be left.
BUDGETS = {"correctness": 60.0, "kernels": 100.0, "passes": 30.0, "training": 110.0, "evaluation": 45.0}
TOTAL_S = 330.0
RESERVE_S = 20.0
SECTIONS = tuple(BUDGETS)


@dataclass(frozen=True)
class Setup:
    """Where and how big: the GPU sizes, or tiny CPU ones for ``--smoke``."""

    smoke: bool
    device: str
    kernel_dtype: Any
    kernel_sizes: tuple[int, ...]
    kernel_shape: tuple[int, int, int]  # B, H, D
    pass_sizes: tuple[int, ...]
    train_steps: int
    train_skip: int
    eval_factor: int
    eval_samples: int


def make_setup(smoke: bool) -> Setup:
    import torch

    if smoke:
        return Setup(True, "cuda" if torch.cuda.is_available() else "cpu", torch.float32, (64,), (1, 2, 16),
                     (128,), 3, 1, 2, 2)
    return Setup(False, "cuda", torch.bfloat16, (4096, 16384, 65536), (2, 8, 64), (4096, 16384), 200, 30,
                 1024, 32)


class Budget:
    """A section's time allowance: ``left()`` seconds before it stops starting new cases, at the
    latest at ``deadline`` (a ``time.perf_counter()`` value)."""

    def __init__(self, seconds: float, deadline: float = math.inf) -> None:
        self.seconds = seconds
        self.start = time.perf_counter()
        self.deadline = deadline

    def left(self) -> float:
        now = time.perf_counter()
        return min(self.seconds - (now - self.start), self.deadline - now)


def optional_module(name: str) -> tuple[Any, str]:
    """(module, '') when ``name`` imports, else (None, why not)."""
    try:
        return __import__(name), ""
    except Exception as exc:  # not installed, or broken on this machine
        return None, f"{type(exc).__name__}: {exc}"


# ---- 1. correctness ------------------------------------------------------------------------------


def _entmax_fp64(z: Any, alpha: Any) -> Any:
    """fp64 α-entmax of scores ``z`` along the last axis: `entmax.entmax_bisect` when installed (an
    independent implementation with its own backward), else bisection with the closed-form backward."""
    import torch

    entmax, _ = optional_module("entmax")
    if entmax is not None:
        return entmax.entmax_bisect(z, alpha, dim=-1, n_iter=60)

    class Bisect(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, z: Any, a: Any) -> Any:  # type: ignore[override]
            zp = (a - 1) * z
            lo, hi = zp.amax(-1, keepdim=True) - 1, zp.amax(-1, keepdim=True)
            for _ in range(60):
                tau = (lo + hi) / 2
                ge = (zp - tau).clamp_min(0).pow(1 / (a - 1)).sum(-1, keepdim=True) >= 1
                lo, hi = torch.where(ge, tau, lo), torch.where(ge, hi, tau)
            p = (zp - lo).clamp_min(0).pow(1 / (a - 1))
            p = p / p.sum(-1, keepdim=True)
            ctx.save_for_backward(p, a)
            return p

        @staticmethod
        def backward(ctx: Any, g: Any) -> Any:  # type: ignore[override]
            p, a = ctx.saved_tensors
            u = torch.where(p > 0, p.pow(2 - a), torch.zeros_like(p))
            return u * g - (u * g).sum(-1, keepdim=True) / u.sum(-1, keepdim=True) * u, None

    return Bisect.apply(z, alpha)


def reference_attention(q: Any, k: Any, v: Any, alpha: Any, slopes: Any = None) -> Any:
    """fp64 causal α-entmax attention on the full score matrix (small N only)."""
    import torch

    q, k, v = q.double(), k.double(), v.double()
    B, H, N, D = q.shape
    z = q @ k.transpose(-1, -2) / math.sqrt(D)
    i = torch.arange(N, device=q.device)
    if slopes is not None:
        z = z - slopes.double().view(1, H, 1, 1) * (i[:, None] - i[None, :]).double()
    z = z.masked_fill(i[None, :] > i[:, None], float("-inf"))
    a = torch.as_tensor(alpha, dtype=torch.float64, device=q.device)
    a = (a.view(1, -1, 1, 1) if a.dim() == 1 else a.view(1, 1, 1, 1)).expand(B, H, N, 1)
    return _entmax_fp64(z, a) @ v


def nape_slopes(heads: int, device: str) -> Any:
    """NAPE: ALiBi slopes 1/k on the first half of the heads, none on the other half."""
    import torch

    half = heads // 2
    return torch.tensor([1.0 / k for k in range(1, half + 1)] + [0.0] * (heads - half), device=device)


def check_kernel(setup: Setup, budget: Budget) -> list[dict[str, Any]]:
    """Forward and gradient errors of the kernel against fp64, per dtype."""
    import torch

    from lengthgen.kernels.triton.entmax import triton_entmax_attention

    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    cases = [  # B, H, N, D, dtype, alpha, alibi, forward tolerance, gradient (relative) tolerance
        (1, 2, 1000, 64, f32, 1.5, True, 1e-5, 1e-5),
        (2, 2, 513, 64, f32, torch.tensor([1.25, 2.0]), True, 1e-5, 1e-5),
        (1, 4, 2048, 64, bf16, 1.5, True, 2e-2, 3e-2),
        (1, 4, 1500, 128, f16, 1.3, False, 1e-2, 2e-2),
    ]
    if setup.smoke:
        cases = [(1, 2, 70, 16, f32, 1.5, True, 1e-5, 1e-5),
                 (1, 2, 45, 16, f32, torch.tensor([1.25, 2.0]), True, 1e-5, 1e-5)]
    g = torch.Generator(device=setup.device).manual_seed(0)
    rows = []
    for B, H, N, D, dtype, alpha, alibi, ftol, gtol in cases:
        if budget.left() < 0:
            rows.append({"case": f"N={N} {dtype}", "skipped": "time budget spent"})
            continue
        q, k, v = (torch.randn(B, H, N, D, device=setup.device, generator=g).to(dtype).requires_grad_()
                   for _ in range(3))
        slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1, device=setup.device) / H) if alibi else None
        a = alpha.to(setup.device) if isinstance(alpha, torch.Tensor) else alpha
        o = triton_entmax_attention(q, k, v, a, True, slopes)
        r = reference_attention(q, k, v, a, slopes)
        do = torch.randn_like(o)
        grads = torch.autograd.grad(o, (q, k, v), do)
        ref_grads = torch.autograd.grad(r, (q, k, v), do.double())
        ferr = (o.double() - r).abs().max().item()
        gerr = max(((x.double() - y).norm() / y.norm()).item() for x, y in zip(grads, ref_grads, strict=True))
        label = alpha.tolist() if isinstance(alpha, torch.Tensor) else alpha
        rows.append({"case": f"B={B} H={H} N={N} D={D} {str(dtype)[6:]} α={label} alibi={alibi}",
                     "forward_max_error": ferr, "gradient_relative_error": gerr,
                     "ok": bool(ferr <= ftol and gerr <= gtol and torch.isfinite(o).all())})
    return rows


def check_evaluation_paths(setup: Setup) -> list[dict[str, Any]]:
    """The engine's evaluation calls against the fp64 materialized path."""
    import warnings

    import torch

    from lengthgen.kernels import entmax_attention
    from lengthgen.kernels.engine import attend
    from lengthgen.kernels.normalizers import Softmax

    n, heads, dim = (70, 4, 16) if setup.smoke else (4096, 8, 64)
    dev = setup.device
    g = torch.Generator(device=dev).manual_seed(1)
    q, k, v = (torch.randn(1, heads, n, dim, device=dev, generator=g) for _ in range(3))
    slopes = nape_slopes(heads, dev)
    picked = torch.randperm(n - 2, generator=torch.Generator().manual_seed(2))[: n // 8] + 1
    rows_at = torch.cat([torch.tensor([0, n - 1]), picked]).to(dev)
    out_rows = []
    for alpha in (1.5, 1.25, 2.0):
        with torch.no_grad():
            out, st = entmax_attention(q[:, :, rows_at], k, v, alpha, True, slopes, q_positions=rows_at,
                                       impl="triton", return_stats=True)
            ref, rst = entmax_attention(q[:, :, rows_at].double(), k.double(), v.double(), alpha, True,
                                        slopes, q_positions=rows_at, impl="materialized", return_stats=True)
        err = (out.double() - ref).abs().max().item()
        ent = (st["entropy"].double() - rst["entropy"].double()).abs().max().item()
        sup = (st["support"] - rst["support"]).abs().max().item()
        out_rows.append({"case": f"triton α={alpha}, {rows_at.numel()} of {n} rows, diagnostics",
                         "forward_max_error": err, "entropy_max_error": ent, "support_max_error": sup,
                         "ok": err <= 1e-5 and ent <= 1e-5 and sup <= 1})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FlexAttention on a CPU (--smoke) warns that it is unfused
        for name, pos in (("all rows", torch.arange(n, device=dev)), ("row subset", rows_at)):
            out, diag = attend(q[:, :, pos], k, v, Softmax(), q_positions=pos, alibi_slopes=slopes,
                               impl="flex", diagnostics=True)
            ref, rdiag = attend(q[:, :, pos].double(), k.double(), v.double(), Softmax(), q_positions=pos,
                                alibi_slopes=slopes, impl="materialized", diagnostics=True)
            assert diag is not None and rdiag is not None
            err = (out.double() - ref).abs().max().item()
            ent = (diag.entropy.double() - rdiag.entropy.double()).abs().max().item()
            out_rows.append({"case": f"flex softmax, NAPE, {name}", "forward_max_error": err,
                             "entropy_max_error": ent, "ok": err <= 1e-4 and ent <= 1e-4})
    return out_rows


def section_correctness(setup: Setup, budget: Budget) -> dict[str, Any]:
    rows = check_kernel(setup, budget) + check_evaluation_paths(setup)
    return {"rows": rows, "ok": all(r.get("ok", True) for r in rows)}


# ---- 2. kernels ----------------------------------------------------------------------------------


def bench_ms(fn: Callable[[], object], smoke: bool) -> float:
    """Median milliseconds of ``fn`` (one timed call in smoke mode: the interpreter is slow)."""
    if smoke:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=60, return_mode="median"))


def attention_impls(setup: Setup) -> tuple[dict[str, Callable[..., Any]], dict[str, str]]:
    """The implementations timed, by name, and those skipped with the reason."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from lengthgen.kernels.triton.entmax import triton_entmax_attention

    def sdpa(q: Any, k: Any, v: Any) -> Any:
        if setup.device != "cuda":  # no flash backend on a CPU
            return scaled_dot_product_attention(q, k, v, is_causal=True)
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return scaled_dot_product_attention(q, k, v, is_causal=True)

    impls: dict[str, Callable[..., Any]] = {
        "sdpa": sdpa,
        "entmax1.5": lambda q, k, v: triton_entmax_attention(q, k, v, 1.5, True),
    }
    skipped: dict[str, str] = {}
    adasplash, why = optional_module("adasplash")
    if adasplash is None:
        skipped["adasplash1.5"] = why
    elif not torch.cuda.is_available():
        skipped["adasplash1.5"] = "needs a CUDA device"
    else:
        impls["adasplash1.5"] = lambda q, k, v: adasplash.adasplash(q, k, v, alpha=1.5, is_causal=True)
    return impls, skipped


def _calls(fn: Callable[..., Any], q: Any, k: Any, v: Any, do: Any) -> tuple[Callable[[], Any], ...]:
    """(forward without gradients, forward and backward) of one implementation on q, k, v."""
    import torch

    def forward() -> Any:
        with torch.no_grad():
            return fn(q, k, v)

    def forward_backward() -> Any:
        return torch.autograd.grad(fn(q, k, v), (q, k, v), do)

    return forward, forward_backward


def section_kernels(setup: Setup, budget: Budget) -> dict[str, Any]:
    import torch

    impls, skipped = attention_impls(setup)
    B, H, D = setup.kernel_shape
    rows: list[dict[str, Any]] = []
    compiled: set[str] = set()
    for n in setup.kernel_sizes:
        if budget.left() < 0:
            rows.append({"n": n, "skipped": "time budget spent"})
            continue
        g = torch.Generator(device=setup.device).manual_seed(n)
        q, k, v = (torch.randn(B, H, n, D, device=setup.device, generator=g, dtype=setup.kernel_dtype)
                   .requires_grad_() for _ in range(3))
        do = torch.randn_like(q)
        for name, fn in impls.items():
            row: dict[str, Any] = {"n": n, "impl": name}
            try:
                forward, forward_backward = _calls(fn, q, k, v, do)
                start = time.perf_counter()
                if not setup.smoke:  # (the interpreter compiles nothing)
                    forward_backward()  # compilation and autotuning, apart from the timings
                    forward()
                    torch.cuda.synchronize()
                first = time.perf_counter() - start
                row["forward_ms"] = bench_ms(forward, setup.smoke)
                row["forward_backward_ms"] = bench_ms(forward_backward, setup.smoke)
                row["first_call_s"] = first
                if name not in compiled:  # the first size pays for compilation
                    compiled.add(name)
                    steady = 1e-3 * (row["forward_ms"] + row["forward_backward_ms"])
                    row["compile_s"] = max(0.0, first - steady)
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            if setup.device == "cuda":
                torch.cuda.empty_cache()
    by_n: dict[int, dict[str, Any]] = {}
    for row in rows:
        if "impl" in row and "forward_ms" in row:
            by_n.setdefault(row["n"], {})[row["impl"]] = row
    ratios = []
    for n, at in by_n.items():
        if "sdpa" in at and "entmax1.5" in at:
            ratio = {"n": n, "forward_vs_sdpa": at["entmax1.5"]["forward_ms"] / at["sdpa"]["forward_ms"],
                     "forward_backward_vs_sdpa":
                         at["entmax1.5"]["forward_backward_ms"] / at["sdpa"]["forward_backward_ms"]}
            ada = at.get("adasplash1.5")
            if ada:
                ratio["forward_vs_adasplash"] = at["entmax1.5"]["forward_ms"] / ada["forward_ms"]
                ratio["forward_backward_vs_adasplash"] = (at["entmax1.5"]["forward_backward_ms"]
                                                          / ada["forward_backward_ms"])
            ratios.append(ratio)
    shape = {"B": B, "H": H, "D": D, "dtype": str(setup.kernel_dtype)[6:], "causal": True, "alpha": 1.5}
    return {"shape": shape,
            "rows": rows, "ratios": ratios, "skipped": skipped,
            "compile_s": sum(r.get("compile_s", 0.0) for r in rows)}


# ---- 3. passes -----------------------------------------------------------------------------------


def section_passes(setup: Setup, budget: Budget) -> dict[str, Any]:
    from entmax_passes import ALPHAS, REGIMES, pass_table

    rows: list[dict[str, Any]] = []
    for i, n in enumerate(setup.pass_sizes):
        if budget.left() < 0:
            rows.append({"n": n, "skipped": "time budget spent"})
            continue
        # Every regime and α at the first size; the training regime (random, α = 1.5) above it.
        alphas, regimes = (ALPHAS, tuple(REGIMES)) if i == 0 else ((1.5,), ("random",))
        if setup.smoke:
            alphas = (1.5,)
        on_gpu = setup.device == "cuda"
        rows += pass_table(n, dim=64 if on_gpu else 16, heads=8 if on_gpu else 1, alphas=alphas,
                           regimes=regimes, device=setup.device)
    return {"tiles": "64×64", "rows": rows}


# ---- 4. training ---------------------------------------------------------------------------------


def model_flops(config: Any, vocab: int, tokens: int) -> float:
    """FLOPs of one training step on one sample of ``tokens`` tokens: 3× the forward's matrix
    products (projections, FFN, output layer, and QKᵀ and P·V over the causal pairs)."""
    a = config.arch
    d, layers, d_ff = a.d_model, a.n_layers, a.d_ff
    per_layer = 2 * tokens * (4 * d * d + 2 * d * d_ff) + 2 * tokens * tokens * d  # causal: half of 4·T²·d
    return 3.0 * (layers * per_layer + 2 * tokens * d * vocab)


def time_training(preset: str, attn: str, varying: bool, precision: str, setup: Setup) -> dict[str, Any]:
    """Steps/s and TFLOP/s of ``train`` on MQMTAR; the first ``train_skip`` steps are timed apart."""
    import torch

    from lengthgen.config import build_run_config
    from lengthgen.harness import train as training
    from lengthgen.harness.evaluate import sequence_tokens
    from lengthgen.harness.run import build

    steps = setup.train_steps
    overrides: dict[str, Any] = {"train.steps": steps, "train.val_every": steps, "train.val_samples": 32,
                                 "train.precision": precision}
    base = build_run_config("mqmtar", attn, preset=preset)
    if not varying:
        overrides["train.min_train_length"] = base.train.train_length
    if setup.smoke:  # the loop's code at a toy size
        overrides.update({"train.batch_size": 2, "train.val_samples": 2, "arch.n_layers": 1,
                          "arch.d_model": 32, "arch.n_heads": 2, "arch.d_ff": 64})
    config = build_run_config("mqmtar", attn, preset=preset, overrides=overrides)
    device = torch.device(setup.device)
    task, model = build(config)
    model.to(device)
    marks: list[float] = []
    real_lr = training.lr_at

    def mark(step: int, cfg: Any) -> float:
        marks.append(time.perf_counter())
        return real_lr(step, cfg)

    training.lr_at = mark
    start = time.perf_counter()
    try:
        training.train(model, task, config, device, progress=False)
    finally:
        training.lr_at = real_lr
    total = time.perf_counter() - start
    # Step i spans marks[i] .. marks[i + 1]; the last step (validation) is left out.
    skip = setup.train_skip
    timed = len(marks) - 1 - skip
    seconds = marks[-1] - marks[skip]
    lengths = training.train_lengths(task, config)[skip: skip + timed]
    tokens = {int(n): sequence_tokens(task, int(n)) for n in set(lengths.tolist())}
    vocab = task.vocab.size
    flops = config.train.batch_size * sum(model_flops(config, vocab, tokens[int(n)]) for n in lengths)
    step_s = seconds / max(1, timed)
    return {"preset": preset, "attn": attn, "lengths": "32..64" if varying else "64", "precision": precision,
            "batch_size": config.train.batch_size, "steps_timed": timed, "steps_per_s": 1.0 / step_s,
            "tflops": flops / seconds / 1e12, "before_timed_s": marks[skip] - start,
            "compile_s": max(0.0, marks[skip] - start - skip * step_s), "loop_s": total}


def section_training(setup: Setup, budget: Budget) -> dict[str, Any]:
    cases = [(preset, attn, varying, precision)
             for preset in ("paper-tasks", "paper")
             for attn in ("asentmax", "softmax")
             for precision in (("fp32", "bf16") if preset == "paper" else ("fp32",))
             for varying in (False, True)]
    rows: list[dict[str, Any]] = []
    for preset, attn, varying, precision in cases:
        if budget.left() < 0:
            rows.append({"preset": preset, "attn": attn, "lengths": "32..64" if varying else "64",
                         "precision": precision, "skipped": "time budget spent"})
            continue
        try:
            rows.append(time_training(preset, attn, varying, precision, setup))
        except Exception as exc:
            rows.append({"preset": preset, "attn": attn, "precision": precision,
                         "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
    return {"task": "mqmtar", "rows": rows, "compile_s": sum(r.get("compile_s", 0.0) for r in rows)}


# ---- 5. evaluation -------------------------------------------------------------------------------


def section_evaluation(setup: Setup, budget: Budget) -> dict[str, Any]:
    import torch

    from lengthgen.config import build_run_config
    from lengthgen.harness.evaluate import evaluate_length
    from lengthgen.harness.run import build

    rows: list[dict[str, Any]] = []
    for attn in ("asentmax", "softmax"):
        if budget.left() < 0:
            rows.append({"attn": attn, "skipped": "time budget spent"})
            continue
        config = build_run_config("mqmtar", attn, preset="paper-tasks")
        task, model = build(config)
        device = torch.device(setup.device)
        model.to(device)
        length = config.train.train_length * setup.eval_factor
        start = time.perf_counter()
        evaluate_length(model, task, length, setup.eval_factor, config.eval, device, n_samples=1,
                        progress=False)
        warm = time.perf_counter() - start
        result = evaluate_length(model, task, length, setup.eval_factor, config.eval, device,
                                 n_samples=setup.eval_samples, progress=False)
        rows.append({"attn": attn, "length": length, "factor": setup.eval_factor, "samples": result.n_samples,
                     "seconds": result.eval_seconds, "first_sample_s": warm, "weights": "untrained"})
    for row in rows:
        if "seconds" in row:  # the first sample's time above a timed sample's: compilation, warm-up
            row["compile_s"] = max(0.0, row["first_sample_s"] - row["seconds"] / row["samples"])
    return {"task": "mqmtar", "preset": "paper-tasks", "rows": rows,
            "compile_s": sum(r.get("compile_s", 0.0) for r in rows)}


# ---- the run -------------------------------------------------------------------------------------

RUNNERS: dict[str, Callable[[Setup, Budget], dict[str, Any]]] = {
    "correctness": section_correctness, "kernels": section_kernels, "passes": section_passes,
    "training": section_training, "evaluation": section_evaluation,
}


def environment(setup: Setup) -> dict[str, Any]:
    import torch
    import triton

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") + ("+changes" if git("status", "--porcelain") else "")
    device = (torch.cuda.get_device_name() if setup.device == "cuda"
              else f"CPU ({platform.processor() or platform.machine()})")
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "device": device,
            "smoke": setup.smoke, "triton_interpreter": os.environ.get("TRITON_INTERPRET", "0") == "1",
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "commit": commit,
            "optional": {name: (optional_module(name)[1] or "present") for name in ("adasplash", "entmax")}}


def print_tables(result: dict[str, Any]) -> None:
    """A compact table per section (the JSON has everything)."""
    env = result["environment"]
    print(f"device: {env['device']}  torch {env['torch']}  triton {env['triton']}  commit {env['commit']}")
    for name, section in result["sections"].items():
        print(f"\n== {name} ({section['seconds']:.0f} s, {section['status']}) ==")
        for row in section.get("rows", []):
            print("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in row.items()))
        for ratio in section.get("ratios", []):
            print("  ratio " + "  ".join(f"{k}={_fmt(v)}" for k, v in ratio.items()))
        for impl, why in section.get("skipped", {}).items():
            print(f"  {impl} skipped: {why}")
    print(f"\ntotal {result['seconds']['total']:.0f} s, of which compilation/warm-up "
          f"{result['seconds']['compile']:.0f} s")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="every section at tiny sizes on CPU (Triton under TRITON_INTERPRET=1)")
    parser.add_argument("--out-dir", type=Path, default=HERE / "results", help="where the JSON goes")
    parser.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = parser.parse_args()
    import torch

    if args.smoke and not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton
    elif not torch.cuda.is_available():
        print("gpu.py needs a CUDA GPU (--smoke runs it on a CPU); nothing was run.", file=sys.stderr)
        return 2
    elif os.environ.get("TRITON_INTERPRET", "0") == "1":
        print("unset TRITON_INTERPRET to benchmark the compiled kernels.", file=sys.stderr)
        return 2
    setup = make_setup(args.smoke)
    start = time.perf_counter()
    result: dict[str, Any] = {"environment": environment(setup), "budgets_s": {**BUDGETS, "total": TOTAL_S},
                              "sections": {}}
    for i, name in enumerate(args.sections):
        t0 = time.perf_counter()
        deadline = start + TOTAL_S - RESERVE_S * (len(args.sections) - 1 - i)
        try:
            section = {"status": "ok", **RUNNERS[name](setup, Budget(BUDGETS[name], deadline))}
        except Exception as exc:
            section = {"status": "error", "error": f"{type(exc).__name__}: {exc}",
                       "traceback": traceback.format_exc()[-3000:]}
        section["seconds"] = time.perf_counter() - t0
        result["sections"][name] = section
        print(f"[{name}: {section['seconds']:.0f} s, {section['status']}]", flush=True)
    result["seconds"] = {"total": time.perf_counter() - start,
                         "compile": sum(s.get("compile_s", 0.0) for s in result["sections"].values())}
    device = re.sub(r"[^a-z0-9]+", "-", result["environment"]["device"].lower()).strip("-")
    stamp = datetime.date.today().isoformat()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    path = args.out_dir / f"gpu-{stamp}-{device}{'-smoke' if setup.smoke else ''}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print_tables(result)
    print(f"\nwrote {path}")
    correct = result["sections"].get("correctness", {}).get("ok", True)
    return 0 if correct and all(s["status"] == "ok" for s in result["sections"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
