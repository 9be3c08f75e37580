"""CPU attention benchmark: exact α-entmax attention vs dense softmax.

Side by side, per sequence length N and score regime: torch SDPA softmax (causal), our
``entmax_attention`` fused path, the chunked torch path, and the ``entmax`` package
(``entmax_bisect`` / ``entmax15``) on the materialized matrix where memory allows (N ≤ 4096).
Columns: best time over the repeats, ratio to SDPA, peak resident-memory growth during the call
(VmHWM after a reset, minus VmRSS before), and max |error| against an fp64 ``entmax_bisect``
reference (all rows up to 1024, a sample of rows above).

Each (N, regime) runs in a fresh subprocess so that the peak-memory figures do not leak between
cases. Score regimes (B=1, H=4, D=32, causal, inputs N(0,1), scale 1/sqrt(D), α = 1.5):
``random`` — the issue's speed target; ``peaked`` — q scaled by 4 (trained-model-like focus);
``flat`` — q scaled by 0.01 (near-uniform scores: dense support, the fallback path); optional
``nape`` — random with ALiBi slopes (1, 1/2, 0, 0) on the entmax paths (SDPA stays plain causal as
the dense-softmax cost reference). The chunked torch path is skipped above N = 16384 (minutes).

    python benchmarks/attention_cpu.py            # N = 1024, 4096, 16384, 65536
    python benchmarks/attention_cpu.py --quick    # N = 1024, 4096
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

#: regime → (multiplier of q, ALiBi slopes for the entmax paths or None)
REGIMES: dict[str, tuple[float, list[float] | None]] = {
    "random": (1.0, None),
    "peaked": (4.0, None),
    "flat": (0.01, None),
    "nape": (1.0, [1.0, 0.5, 0.0, 0.0]),  # NAPE-like: ALiBi on half the heads (not in the default set)
}
DEFAULT_REGIMES = ("random", "peaked", "flat")
CHUNKED_MAX = 16384
IMPLS = ("sdpa", "fused", "chunked", "entmax_bisect", "entmax15")
MATERIALIZE_MAX = 4096
REF_ALL_ROWS_MAX = 1024
REF_SAMPLE_ROWS = 48


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux ≥ 4.0); harmless elsewhere."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _reference_rows(q: Any, k: Any, v: Any, rows: Any, alpha: float, slopes: Any) -> Any:
    """fp64 entmax_bisect output for the given query rows (causal, over their visible keys)."""
    import torch
    from entmax import entmax_bisect

    B, H, N, D = q.shape
    out = torch.empty(B, H, len(rows), D, dtype=torch.float64)
    for a in range(0, len(rows), 64):
        rr = rows[a : a + 64]
        kmax = int(rr.max()) + 1
        z = q[:, :, rr].double() @ k[:, :, :kmax].double().transpose(-1, -2) / math.sqrt(D)
        mask = torch.arange(kmax)[None, :] > rr[:, None]
        if slopes is not None:
            z = z - slopes.double().view(1, -1, 1, 1) * (rr[:, None] - torch.arange(kmax)[None, :]).double()
        z = z.masked_fill(mask, float("-inf"))
        p = entmax_bisect(z, alpha, n_iter=80)
        out[:, :, a : a + 64] = p @ v[:, :, :kmax].double()
    return out


def _materialized(q: Any, k: Any, v: Any, fn: Any) -> Any:
    import torch

    N, D = q.shape[2], q.shape[3]
    z = (q @ k.transpose(-1, -2)) / math.sqrt(D)
    z = z.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    return fn(z) @ v


def run_case(
    n: int, regime: str, impls: list[str], reps: int, alpha: float, seed: int
) -> list[dict[str, Any]]:
    """Time every implementation on one (N, regime); runs inside the child process."""
    import torch
    from entmax import entmax15, entmax_bisect

    from lengthgen.kernels import entmax_attention

    g = torch.Generator().manual_seed(seed)
    B, H, D = 1, 4, 32
    mult, slope_list = REGIMES[regime]
    slopes = None if slope_list is None else torch.tensor(slope_list)
    q = torch.randn(B, H, n, D, generator=g) * mult
    k = torch.randn(B, H, n, D, generator=g)
    v = torch.randn(B, H, n, D, generator=g)
    small = [t[:, :, :64].contiguous() for t in (q, k, v)]
    entmax_attention(*small, alpha, impl="fused")  # compile / load numba's cache outside the timing
    entmax_attention(*small, alpha, impl="chunked")

    calls = {
        "sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "fused": lambda: entmax_attention(q, k, v, alpha, alibi_slopes=slopes, impl="fused"),
        "chunked": lambda: entmax_attention(q, k, v, alpha, alibi_slopes=slopes, impl="chunked"),
        "entmax_bisect": lambda: _materialized(q, k, v, lambda z: entmax_bisect(z, alpha)),
        "entmax15": lambda: _materialized(q, k, v, entmax15),
    }
    if n <= REF_ALL_ROWS_MAX:
        rows = torch.arange(n)
    else:
        rows = torch.cat([torch.randperm(n, generator=g)[: REF_SAMPLE_ROWS - 8], torch.arange(n - 8, n)])
    ref = _reference_rows(q, k, v, rows, alpha, slopes)
    results = []
    with torch.no_grad():
        for name in impls:
            if name.startswith("entmax") and (n > MATERIALIZE_MAX or alpha != 1.5 and name == "entmax15"):
                continue
            if name.startswith("entmax") and slopes is not None:
                continue  # the package baselines run without ALiBi
            if name == "chunked" and n > CHUNKED_MAX:
                continue
            times = []
            growth = 0
            out = None
            n_reps = 1 if n > 16384 or name.startswith("entmax") else reps
            for _ in range(n_reps):
                out = None
                _reset_peak()
                rss0 = _status_kib("VmRSS")
                t0 = time.perf_counter()
                out = calls[name]()
                times.append(time.perf_counter() - t0)
                growth = max(growth, _status_kib("VmHWM") - rss0)
            assert out is not None
            err = None if name == "sdpa" else float((out[:, :, rows].double() - ref).abs().max())
            results.append({"n": n, "regime": regime, "impl": name, "seconds": min(times),
                            "peak_mib": growth / 1024, "max_err": err})
    return results


def _format(rows: list[dict[str, Any]]) -> str:
    sdpa = {(r["n"], r["regime"]): r["seconds"] for r in rows if r["impl"] == "sdpa"}
    head = f"{'N':>6} {'scores':>7} {'impl':>14} {'time s':>9} {'/SDPA':>7} {'peak MiB':>9} {'max err':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        base = sdpa.get((r["n"], r["regime"]))
        ratio = f"{r['seconds'] / base:7.2f}" if base else f"{'-':>7}"
        err = f"{r['max_err']:9.1e}" if r["max_err"] is not None else f"{'-':>9}"
        lines.append(
            f"{r['n']:>6} {r['regime']:>7} {r['impl']:>14} {r['seconds']:9.4f} {ratio} "
            f"{r['peak_mib']:9.1f} {err}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="N = 1024, 4096 only")
    ap.add_argument("--sizes", type=int, nargs="*", help="sequence lengths (overrides --quick)")
    ap.add_argument("--regimes", nargs="*", default=list(DEFAULT_REGIMES), choices=list(REGIMES))
    ap.add_argument("--impls", nargs="*", default=list(IMPLS), choices=list(IMPLS))
    ap.add_argument("--reps", type=int, default=3, help="repeats per case (1 above N = 16384)")
    ap.add_argument("--alpha", type=float, default=1.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        n, regime = args.child.split(":")
        rows = run_case(int(n), regime, args.impls, args.reps, args.alpha, args.seed)
        print("RESULT " + json.dumps(rows))
        return 0

    sizes = args.sizes or ([1024, 4096] if args.quick else [1024, 4096, 16384, 65536])
    load = tuple(round(x, 2) for x in os.getloadavg())
    print(f"# cpus={os.cpu_count()} load={load} alpha={args.alpha} B=1 H=4 D=32 causal", flush=True)
    all_rows: list[dict[str, Any]] = []
    for n in sizes:
        for regime in args.regimes:
            cmd = [sys.executable, __file__, "--child", f"{n}:{regime}", "--reps", str(args.reps),
                   "--alpha", str(args.alpha), "--seed", str(args.seed), "--impls", *args.impls]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            found = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not found:
                print(f"# N={n} {regime}: failed (rc={proc.returncode})\n{proc.stderr[-2000:]}", flush=True)
                continue
            rows = json.loads(found[-1][len("RESULT ") :])
            all_rows.extend(rows)
            print(_format(rows).split("\n", 2)[2] if all_rows != rows else _format(rows), flush=True)
    print()
    print(_format(all_rows))
    print(f"# load after: {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(all_rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
