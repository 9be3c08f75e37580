"""Compile time of the Triton α-entmax kernels for an H100/H200, measured on a machine without a GPU.

    PYTHONPATH=. python benchmarks/triton_compile.py                       # the default variants
    PYTHONPATH=../before python benchmarks/triton_compile.py --label before  # another checkout's kernels

Why: a GPU session pays every kernel specialization's compilation (and, with autotuning, every
config's) before it measures anything; on 2026-12-04 one correctness case took ~330 s of a 6-minute
H200 session. Triton bundles NVIDIA's ``ptxas``, so the kernels compile for sm_90 on a CPU.

The launches are the real ones: ``triton_entmax_attention`` (forward, and backward through autograd)
runs on CPU tensors with the kernels replaced by a recorder, so the arguments, constexprs and
specializations are exactly those the launch code passes on a GPU (GPU tiles, not the interpreter's).
Each recorded launch is then compiled with ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` in each
tuning config (the checkout's ``_tuning_configs`` as a GPU sees them), with Triton's cache bypassed.
Per kernel × variant × config it prints and records the seconds (and per stage: TTIR, TTGIR, LLVM IR,
PTX, cubin), the PTX instruction count, and registers and stack (spills) from ``cuobjdump``. Triton
3.9's PTX needs the ptxas 13 it bundles, so registers and spills are that ptxas's (a GPU machine with
another Triton may allocate differently); the compile seconds are this CPU's.

``warm_cache`` (used by ``gpu.py``) replays the same recorded launches on a GPU machine through
Triton's public ``warmup`` in parallel worker processes: each compiles one specialization into
Triton's disk cache, where the real launch then finds it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Variant:
    """One way the engine calls the kernel: what a training step, an evaluation or gpu.py needs."""

    name: str
    dtype: str  # float32 / bfloat16 / float16
    head_dim: int
    alpha: float | None  # None: a per-head tensor α (the general power, as is any α but 1.5 and 2)
    alibi: bool
    grad: bool  # forward with the u-weighted V, and both backward kernels
    stats: bool  # entropy and support (evaluation's diagnostics)
    positions: bool  # a row subset at absolute positions


VARIANTS = {
    v.name: v for v in (
        Variant("train-fp32", "float32", 32, 1.5, True, True, False, False),
        Variant("train-bf16", "bfloat16", 32, 1.5, True, True, False, False),
        Variant("eval-fp32", "float32", 32, 1.5, True, False, True, False),
        Variant("gpu-correct-fp32", "float32", 64, 1.5, True, True, False, False),
        Variant("gpu-general-alpha", "float32", 64, None, True, True, False, False),
        Variant("gpu-kernels-bf16", "bfloat16", 64, 1.5, False, True, False, False),
        Variant("gpu-eval-subset", "float32", 64, 1.5, True, False, True, True),
    )
}
DEFAULT_VARIANTS = ("train-fp32", "train-bf16", "eval-fp32", "gpu-kernels-bf16")

#: What ``gpu.py`` launches, section by section (training and validation at head size 32 in fp32
#: and bf16, the 1024× evaluation, the kernel timings, the correctness cases); a launch not listed
#: here compiles when it first runs, as it would without the warm-up.
GPU_RUN_VARIANTS = (
    VARIANTS["train-fp32"], Variant("validate-fp32", "float32", 32, 1.5, True, False, False, False),
    VARIANTS["train-bf16"], Variant("validate-bf16", "bfloat16", 32, 1.5, True, False, False, False),
    VARIANTS["eval-fp32"],
    VARIANTS["gpu-kernels-bf16"],
    Variant("gpu-kernels-bf16-fwd", "bfloat16", 64, 1.5, False, False, False, False),
    VARIANTS["gpu-correct-fp32"], VARIANTS["gpu-general-alpha"],
    Variant("gpu-correct-bf16", "bfloat16", 64, 1.5, True, True, False, False),
    Variant("gpu-correct-fp16", "float16", 128, 1.3, False, True, False, False),
    VARIANTS["gpu-eval-subset"],
    Variant("gpu-eval-subset-1.25", "float32", 64, 1.25, True, False, True, True),
    Variant("gpu-eval-subset-2", "float32", 64, 2.0, True, False, True, True),
)


class _Recorder:
    """Stands in for the kernels module: ``kern.NAME[grid](*args, **kwargs)`` records the launch."""

    def __init__(self, real: Any, launches: list[tuple[str, tuple[Any, ...], dict[str, Any]]]) -> None:
        self._real = real
        self._launches = launches

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._real, name)
        if not hasattr(value, "fn"):  # constants such as PASS_LOG_WIDTH
            return value
        launches = self._launches

        class _Grid:
            def __getitem__(self, grid: Any) -> Callable[..., None]:
                return lambda *args, **kwargs: launches.append((name, args, kwargs))

        return _Grid()


def record_launches(variant: Variant, n: int = 256) -> tuple[Any, list[tuple[str, tuple, dict]]]:
    """(the kernels module, the launches one call of ``variant`` makes) on CPU tensors."""
    import torch

    from lengthgen.kernels.triton import entmax as te

    kernels = te._load_kernels()
    launches: list[tuple[str, tuple, dict]] = []
    saved = te._kernels, te._interpreting, te._check_inputs
    te._kernels = _Recorder(kernels, launches)
    te._interpreting = lambda: False  # the GPU's tiles
    te._check_inputs = lambda *args, **kwargs: None  # CPU tensors stand in for CUDA ones
    try:
        dtype = getattr(torch, variant.dtype)
        heads = 4
        q, k, v = (torch.randn(1, heads, n, variant.head_dim).to(dtype).requires_grad_(variant.grad)
                   for _ in range(3))
        alpha: Any = variant.alpha if variant.alpha is not None else torch.tensor([1.25, 1.5, 1.75, 2.0])
        slopes = torch.tensor([1.0, 0.5, 0.0, 0.0]) if variant.alibi else None
        kwargs: dict[str, Any] = {"return_stats": variant.stats}
        if variant.positions:
            kwargs["q_positions"] = torch.arange(n - 1, -1, -4)
            q = q[:, :, kwargs["q_positions"]].detach()
        with torch.set_grad_enabled(variant.grad):
            out = te.triton_entmax_attention(q, k, v, alpha, True, slopes, **kwargs)
            if variant.grad:
                torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    finally:
        te._kernels, te._interpreting, te._check_inputs = saved
    return kernels, launches


def launch_configs(kernels: Any, name: str, args: tuple, kwargs: dict) -> list[Any]:
    """The configs a launch compiles on a GPU: its autotuner's, as pruned for these arguments."""
    tuner = getattr(kernels, name)
    tuner.nargs = dict(zip(tuner.arg_names, args, strict=False))
    try:
        return list(tuner.prune_configs(kwargs))
    finally:
        tuner.nargs = None


def _resources(cubin: bytes) -> dict[str, int]:
    """Registers, spill stores/loads and static shared memory of a cubin (``cuobjdump -res-usage``)."""
    import triton

    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    found = {key: int(val) for key, val in re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", text)}
    return {"registers": found.get("REG", -1), "stack_bytes": found.get("STACK", -1),
            "local_bytes": found.get("LOCAL", -1)}


def _ptx_instructions(ptx: str) -> int:
    """Instructions in the PTX (lines that are not directives, labels, braces or comments)."""
    skip = (".", "//", "$", "{", "}", "@$")
    return sum(1 for line in ptx.splitlines() if (s := line.strip()) and not s.startswith(skip))


def compile_launch(kernels: Any, name: str, args: tuple, kwargs: dict, config: Any) -> dict[str, Any]:
    """Compile one recorded launch in one config for sm_90, uncached; seconds per stage and size."""
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    jit = getattr(kernels, name).fn
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(jit.signature, jit.params, backend)
    meta = {**kwargs, **config.all_kwargs()}
    bound, specialization, options = binder(*args, **meta)
    options, signature, constexprs, attrs = jit._pack_args(backend, meta, bound, specialization, options)
    stages: dict[str, float] = {}

    def listener(src: Any, metadata: Any, metadata_group: Any, times: Any, cache_hit: bool) -> None:
        stages["frontend"] = times.ir_initialization / 1e6
        stages.update({stage: us / 1e6 for stage, us in times.lowering_stages})

    knobs.compilation.listener, knobs.compilation.always_compile = listener, True
    try:
        start = time.perf_counter()
        compiled = triton.compile(ASTSource(jit, signature, constexprs, attrs), target=target,
                                  options=options.__dict__)
        seconds = time.perf_counter() - start
    finally:
        knobs.compilation.listener, knobs.compilation.always_compile = None, False
    return {"seconds": seconds, "stages_s": stages,
            "ptx_instructions": _ptx_instructions(compiled.asm["ptx"]),
            "shared_bytes": int(compiled.metadata.shared), **_resources(compiled.asm["cubin"])}


def _launch_key(name: str, args: tuple, kwargs: dict) -> str:
    """What decides a launch's binary: the kernel, its constexprs and its arguments' kinds."""
    kinds = [f"{a.dtype}{tuple(a.stride())}" if hasattr(a, "dtype") else repr(a) if isinstance(a, tuple)
             else type(a).__name__ for a in args]
    return repr((name, sorted((k, repr(v)) for k, v in kwargs.items()), kinds))


def _warm_one(variant: Variant, index: int) -> dict[str, Any]:
    """(In a worker process.) Compile launch ``index`` of ``variant`` for this machine's GPU in every
    tuning config, into Triton's disk cache (``Autotuner.warmup``: compiled, not run)."""
    kernels, launches = record_launches(variant)
    name, args, kwargs = launches[index]
    start = time.perf_counter()
    getattr(kernels, name).warmup(*args, grid=(1,), **kwargs)
    return {"kernel": name, "variant": variant.name, "seconds": time.perf_counter() - start}


def warm_cache(variants: Iterable[Variant], workers: int, timeout: float,
               on_row: Callable[[dict[str, Any]], None]) -> None:
    """Compile every distinct launch of ``variants`` in ``workers`` processes, reporting each as it
    finishes; after ``timeout`` seconds the rest is abandoned (those compile when first launched)."""
    tasks, seen = [], set()
    for variant in variants:
        _kernels, launches = record_launches(variant)
        for i, (name, args, kwargs) in enumerate(launches):
            key = _launch_key(name, args, kwargs)
            if key not in seen:
                seen.add(key)
                tasks.append((variant, i, name))
    deadline = time.perf_counter() + timeout
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))
    futures = {pool.submit(_warm_one, variant, i): (variant, name) for variant, i, name in tasks}
    try:
        for future in as_completed(futures, timeout=max(0.0, deadline - time.perf_counter())):
            variant, name = futures[future]
            try:
                on_row(future.result())
            except Exception as exc:  # a kernel that does not compile fails again, visibly, when run
                why = f"{type(exc).__name__}: {exc}"[:300]
                on_row({"kernel": name, "variant": variant.name, "error": why})
    except FutureTimeout:
        for future, (variant, name) in futures.items():
            if not future.done():
                on_row({"kernel": name, "variant": variant.name, "skipped": "compile budget spent"})
    finally:
        workers_started = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in workers_started:  # only those this call started, still compiling
            if process.is_alive():
                process.terminate()


def _commit() -> str:
    root = Path(os.environ.get("PYTHONPATH", ".").split(os.pathsep)[0]).resolve()
    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "lengthgen"],
                           capture_output=True, text=True).stdout.strip()
    return done.stdout.strip() + ("+changes" if dirty else "")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", choices=tuple(VARIANTS), default=list(DEFAULT_VARIANTS))
    parser.add_argument("--configs", choices=("first", "all"), default="all",
                        help="compile each launch in the first of its configs only, or in all (one unless "
                             "LENGTHGEN_TRITON_AUTOTUNE=1)")
    parser.add_argument("--label", default="", help="a name for this checkout in the JSON's file name")
    parser.add_argument("--out", type=Path, default=None,
                        help="JSON path (default: results/triton_compile-DATE[-LABEL].json)")
    args = parser.parse_args()
    import triton

    rows: list[dict[str, Any]] = []
    print(f"{'kernel':24} {'variant':18} {'config':6} {'s':>6} {'llir':>5} {'cubin':>5} {'ptx ins':>8} "
          f"{'regs':>4} {'stack':>5}", flush=True)
    for vname in args.variants:
        kernels, launches = record_launches(VARIANTS[vname])
        for name, largs, lkwargs in launches:
            configs = launch_configs(kernels, name, largs, lkwargs)
            for config in configs[:1] if args.configs == "first" else configs:
                label = f"w{config.num_warps}s{config.num_stages}"
                row = {"kernel": name, "variant": vname, "config": label,
                       **compile_launch(kernels, name, largs, lkwargs, config)}
                rows.append(row)
                st = row["stages_s"]
                print(f"{name:24} {vname:18} {label:6} {row['seconds']:6.1f} {st.get('llir', 0):5.1f} "
                      f"{st.get('cubin', 0):5.1f} {row['ptx_instructions']:8d} {row['registers']:4d} "
                      f"{row['stack_bytes']:5d}", flush=True)
    total = sum(r["seconds"] for r in rows)
    print(f"total {total:.0f} s over {len(rows)} compilations", flush=True)
    result = {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": _commit(),
              "label": args.label, "triton": triton.__version__, "target": "cuda sm_90 (warp 32)",
              "configs": args.configs, "rows": rows, "total_s": total}
    out = args.out or HERE / "results" / (
        f"triton_compile-{datetime.date.today().isoformat()}{'-' + args.label if args.label else ''}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
