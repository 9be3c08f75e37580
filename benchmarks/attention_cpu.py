"""CPU attention benchmark: the engine's evaluation paths against torch SDPA, side by side.

Every case runs in a fresh subprocess (so peak-memory figures do not leak between cases) and times
torch SDPA causal with no bias — the dense-softmax cost reference — next to the engine's paths on
the same inputs, as evaluation calls them (no gradients, diagnostics on). B=1, H=4, D=32, inputs
N(0,1), scale 1/sqrt(D). Cases (``--regimes``):

* ``nape`` — the softmax family under NAPE: ALiBi slopes (1, 1/2) on heads 0-1, none on heads 2-3;
  ``ssmax`` also multiplies the NoPE heads' queries by its query scale log(pos + 2) (σ = 1, the
  init). Rows: ``softmax``, ``ssmax``, ``adaptive`` (adaptive temperature), ``topk`` (k = 8),
  the generic ``chunked`` softmax path (the previous evaluation path; N ≤ 16384);
* ``random``, ``peaked`` (q × 4), ``flat`` (q × 0.01: near-uniform rows, dense support) — α-entmax
  (α = 1.5, no slopes): the ``fused`` CPU kernel, the ``chunked`` torch path (N ≤ 16384) and the
  ``entmax`` package on the materialized matrix (N ≤ 4096).

Columns: best time over the repeats, ratio to SDPA, peak resident-memory growth during the call
(VmHWM after a reset, minus VmRSS before), max |error| against an fp64 reference on sampled rows
(all rows up to 1024).

    python benchmarks/attention_cpu.py                         # N = 16384, 65536; every regime
    python benchmarks/attention_cpu.py --sizes 1024 4096 --regimes nape random
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

REGIMES = ("nape", "random", "peaked", "flat")
#: q multiplier per entmax regime
ENTMAX_MULT = {"random": 1.0, "peaked": 4.0, "flat": 0.01}
NAPE_SLOPES = [1.0, 0.5, 0.0, 0.0]
SOFTMAX_IMPLS = ("sdpa", "softmax", "ssmax", "adaptive", "topk", "chunked")
ENTMAX_IMPLS = ("sdpa", "fused", "chunked", "entmax15")
CHUNKED_MAX = 16384
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


def _reference(q: Any, k: Any, v: Any, rows: Any, normalizer: Any, slopes: Any) -> Any:
    """fp64 outputs of the given rows by the engine's materialized path, 64 rows at a time."""
    import torch

    from lengthgen.kernels.engine import attend

    parts = []
    for a in range(0, len(rows), 64):
        rr = rows[a : a + 64]
        kmax = int(rr.max()) + 1
        out, _ = attend(q[:, :, rr].double(), k[:, :, :kmax].double(), v[:, :, :kmax].double(), normalizer,
                        q_positions=rr, alibi_slopes=slopes, impl="materialized")
        parts.append(out)
    return torch.cat(parts, dim=2)


def _calls(regime: str, q: Any, k: Any, v: Any) -> tuple[dict[str, Any], dict[str, tuple[Any, Any, Any]]]:
    """(name → call, name → (normalizer, q, slopes) for the reference) for one regime."""
    import torch
    import torch.nn.functional as F

    from lengthgen.kernels.engine import attend
    from lengthgen.kernels.normalizers import AdaptiveTemperature, Entmax, Softmax, TopK

    def run(qq: Any, normalizer: Any, slopes: Any, impl: str = "auto") -> Any:
        return lambda: attend(qq, k, v, normalizer, alibi_slopes=slopes, diagnostics=True, impl=impl)[0]

    calls: dict[str, Any] = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    refs: dict[str, tuple[Any, Any, Any]] = {}
    if regime == "nape":
        slopes = torch.tensor(NAPE_SLOPES)
        n = q.shape[2]
        scale = torch.ones(4, n)
        scale[2:] = torch.log(torch.arange(n) + 2.0)
        qs = q * scale[None, :, :, None]
        for name, qq, normalizer in [("softmax", q, Softmax()), ("ssmax", qs, Softmax()),
                                     ("adaptive", q, AdaptiveTemperature()), ("topk", q, TopK(8))]:
            calls[name] = run(qq, normalizer, slopes)
            refs[name] = (normalizer, qq, slopes)
        calls["chunked"] = run(q, Softmax(), slopes, "chunked")
        refs["chunked"] = refs["softmax"]
    else:
        from entmax import entmax15

        normalizer = Entmax(1.5)
        calls["fused"] = run(q, normalizer, None)
        calls["chunked"] = run(q, normalizer, None, "chunked")
        refs["fused"] = refs["chunked"] = refs["entmax15"] = (normalizer, q, None)

        def package() -> Any:
            n, d = q.shape[2], q.shape[3]
            z = (q @ k.transpose(-1, -2)) / math.sqrt(d)
            z = z.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            return entmax15(z) @ v

        calls["entmax15"] = package
    return calls, refs


def run_case(n: int, regime: str, impls: list[str], reps: int, seed: int) -> list[dict[str, Any]]:
    """Time every implementation on one (N, regime); runs inside the child process."""
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 4, n, 32, generator=g) * ENTMAX_MULT.get(regime, 1.0)
    k = torch.randn(1, 4, n, 32, generator=g)
    v = torch.randn(1, 4, n, 32, generator=g)
    calls, refs = _calls(regime, q, k, v)
    small = [t[:, :, :64].contiguous() for t in (q, k, v)]
    with torch.no_grad():  # compile / load numba's caches outside the timing: every call, once, small
        for call in _calls(regime, *small)[0].values():
            call()
    if n <= REF_ALL_ROWS_MAX:
        rows = torch.arange(n)
    else:
        rows = torch.cat([torch.randperm(n, generator=g)[: REF_SAMPLE_ROWS - 8], torch.arange(n - 8, n)])
    results = []
    with torch.no_grad():
        for name in impls:
            if name not in calls or (name == "chunked" and n > CHUNKED_MAX):
                continue
            if name == "entmax15" and n > MATERIALIZE_MAX:
                continue
            seconds, peak_mib, out = timed(calls[name], 1 if n > 16384 or name == "entmax15" else reps)
            err = None
            if name in refs and out is not None:
                normalizer, qq, slopes = refs[name]
                want = _reference(qq, k, v, rows, normalizer, slopes)
                err = float((out[:, :, rows].double() - want).abs().max())
            results.append({"n": n, "regime": regime, "impl": name, "seconds": seconds,
                            "peak_mib": peak_mib, "max_err": err})
    return results


def timed(call: Any, repeats: int) -> tuple[float, float, Any]:
    """(best seconds, peak resident-memory growth in MiB, last output) of ``repeats`` calls."""
    times, growth, out = [], 0, None
    for _ in range(repeats):
        out = None
        _reset_peak()
        rss0 = _status_kib("VmRSS")
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
        growth = max(growth, _status_kib("VmHWM") - rss0)
    return min(times), growth / 1024, out


def _format(rows: list[dict[str, Any]]) -> str:
    sdpa = {(r["n"], r["regime"]): r["seconds"] for r in rows if r["impl"] == "sdpa"}
    head = f"{'N':>6} {'case':>7} {'impl':>10} {'time s':>9} {'/SDPA':>7} {'peak MiB':>9} {'max err':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        base = sdpa.get((r["n"], r["regime"]))
        ratio = f"{r['seconds'] / base:7.2f}" if base else f"{'-':>7}"
        err = f"{r['max_err']:9.1e}" if r["max_err"] is not None else f"{'-':>9}"
        lines.append(f"{r['n']:>6} {r['regime']:>7} {r['impl']:>10} {r['seconds']:9.3f} {ratio} "
                     f"{r['peak_mib']:9.1f} {err}")
    return "\n".join(lines)


def parser(
    doc: str | None, regimes: tuple[str, ...], impls: tuple[str, ...] | None = None
) -> argparse.ArgumentParser:
    """The options of an attention benchmark driven by ``drive``; ``impls``: the valid row names."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="*", default=[16384, 65536], help="sequence lengths")
    ap.add_argument("--regimes", nargs="*", default=list(regimes), choices=list(regimes))
    ap.add_argument("--impls", nargs="*", default=None, choices=impls, help="subset of the rows to time")
    ap.add_argument("--reps", type=int, default=3, help="repeats per case (1 above N = 16384)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="also write the rows to this JSON file")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, REGIMES).parse_args(argv)

    if args.child:
        n, regime = args.child.split(":")
        impls = args.impls or list(SOFTMAX_IMPLS if regime == "nape" else ENTMAX_IMPLS)
        print("RESULT " + json.dumps(run_case(int(n), regime, impls, args.reps, args.seed)))
        return 0

    return drive(__file__, args)


def drive(script: str, args: argparse.Namespace) -> int:
    """Every (size, regime) of ``args`` in a fresh ``script --child`` process, each case's rows
    printed as it comes, then all of them (and, with ``args.json``, written there)."""
    import torch

    load = tuple(round(x, 2) for x in os.getloadavg())
    print(f"# cpus={os.cpu_count()} threads={torch.get_num_threads()} load={load} B=1 H=4 D=32 causal "
          f"torch {torch.__version__}", flush=True)
    all_rows: list[dict[str, Any]] = []
    for n in args.sizes:
        for regime in args.regimes:
            cmd = [sys.executable, script, "--child", f"{n}:{regime}", "--reps", str(args.reps),
                   "--seed", str(args.seed)]
            if args.impls:
                cmd += ["--impls", *args.impls]
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
    print(f"# load after: {tuple(round(x, 2) for x in os.getloadavg())}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(all_rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
