"""CPU benchmark of the baselines' attention (lengthgen-baselines: FoX, stick-breaking) against torch
SDPA, side by side, in the style of ``attention_cpu.py``.

Every case runs in a fresh subprocess and times torch SDPA causal with no bias next to the engine
called as evaluation calls these backends (no gradients, diagnostics on, ``impl="auto"``): B=1,
H=4, D=32, inputs N(0,1), scale 1/sqrt(D), no position bias (the papers' ``--pos nope``).
Cases (``--regimes``):

* ``fox-forget`` — softmax with the cumulative bias of forget gates f = σ(logit), logits
  N(0, 0.25²): FoX at its initialization (f ≈ ½), keys out of reach after a few dozen tokens;
* ``fox-slow`` — logits N(5, 0.25²) (f ≈ 0.993): the bias spans hundreds of nats over the
  sequence, every block of rows takes its own reference, windows of thousands of keys;
* ``fox-open`` — logits N(12, 0.25²) (f ≈ 1 − 6e-6): the bias spans < 1 nat, one causal call;
* ``sb-random`` — stick-breaking rows of N(0,1) inputs: β ≈ ½, each stick runs out (to float32's
  smallest weight) within a few hundred keys, so a row costs that many keys;
* ``sb-far`` — stick-breaking rows whose scores sit near −12 (β ≈ 6e-6): every stick reaches back
  over every key, the worst case (every score computed, as SDPA does).

Rows: ``sdpa``, ``engine`` (the path evaluation takes), and ``torch`` (the pure-torch path the
engine falls back to and runs on CUDA: ``chunked``; N ≤ 16384). Columns as ``attention_cpu.py``:
best time over the repeats (1 run above 16,384 tokens), ratio to SDPA, peak resident-memory growth,
max |error| against the engine's materialized path in float64 on sampled rows.

    python benchmarks/attention_baselines.py                  # N = 16384, 65536; every regime
    python benchmarks/attention_baselines.py --sizes 4096 --regimes sb-far fox-slow
"""

from __future__ import annotations

import json
import math
from typing import Any

from attention_cpu import drive, parser, timed

REGIMES = ("fox-forget", "fox-slow", "fox-open", "sb-random", "sb-far")
#: Mean forget-gate logit per FoX regime.
GATE_MEAN = {"fox-forget": 0.0, "fox-slow": 5.0, "fox-open": 12.0}
IMPLS = ("sdpa", "engine", "torch")
TORCH_MAX = 16384
REF_SAMPLE_ROWS = 48


def _case(regime: str, n: int, seed: int) -> tuple[Any, ...]:
    """q, k, v, the bias increments (or None) and the normalizer of one regime."""
    import torch
    import torch.nn.functional as F

    from lengthgen.api import SoftmaxRows, StickBreakingRows

    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 4, n, 32, generator=g) for _ in range(3))
    if regime.startswith("fox"):
        logits = torch.randn(1, 4, n, generator=g) * 0.25 + GATE_MEAN[regime]
        return q, k, v, F.logsigmoid(logits), SoftmaxRows()
    if regime == "sb-far":  # a constant channel puts every score near −12
        k[..., 0] = 1.0
        q[..., 0] = -12.0 * math.sqrt(32)
    return q, k, v, None, StickBreakingRows()


def run_case(n: int, regime: str, impls: list[str], reps: int, seed: int) -> list[dict[str, Any]]:
    """Time every implementation on one (N, regime); runs inside the child process."""
    import torch
    import torch.nn.functional as F

    from lengthgen.kernels.engine import attend

    q, k, v, inc, norm = _case(regime, n, seed)
    calls = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "engine": lambda: attend(q, k, v, norm, bias_increments=inc, diagnostics=True)[0],
        "torch": lambda: attend(q, k, v, norm, bias_increments=inc, diagnostics=True, impl="chunked")[0],
    }
    with torch.no_grad():  # compile / load numba's caches outside the timing: each long path, small
        sq, sk, sv, sinc, _ = _case(regime, 300, seed)
        for impl in ("fused", "chunked"):
            attend(sq, sk, sv, norm, bias_increments=sinc, diagnostics=True, impl=impl)
        F.scaled_dot_product_attention(sq, sk, sv, is_causal=True)
    g = torch.Generator().manual_seed(seed + 1)
    sampled = torch.randperm(n, generator=g)[: REF_SAMPLE_ROWS - 8]
    rows = torch.cat([sampled, torch.arange(n - 8, n)]).unique()
    results = []
    with torch.no_grad():
        for name in impls:
            if name not in calls or (name == "torch" and n > TORCH_MAX):
                continue
            seconds, peak_mib, out = timed(calls[name], 1 if n > 16384 else reps)
            err = None
            if name != "sdpa" and out is not None:
                err = float((out[:, :, rows].double() - _reference(q, k, v, inc, norm, rows)).abs().max())
            results.append({"n": n, "regime": regime, "impl": name, "seconds": seconds,
                            "peak_mib": peak_mib, "max_err": err})
    return results


def _reference(q: Any, k: Any, v: Any, inc: Any, norm: Any, rows: Any) -> Any:
    """float64 outputs of the given rows by the engine's materialized path, a few rows at a time."""
    import torch

    from lengthgen.kernels.engine import attend

    parts = []
    for a in range(0, len(rows), 8):
        rr = rows[a : a + 8]
        kmax = int(rr.max()) + 1
        part_inc = None if inc is None else inc[..., :kmax]
        out, _ = attend(q[:, :, rr].double(), k[:, :, :kmax].double(), v[:, :, :kmax].double(), norm,
                        q_positions=rr, bias_increments=part_inc, impl="materialized")
        parts.append(out)
    return torch.cat(parts, dim=2)


def main(argv: list[str] | None = None) -> int:
    args = parser(__doc__, REGIMES, IMPLS).parse_args(argv)

    if args.child:
        n, regime = args.child.split(":")
        rows = run_case(int(n), regime, args.impls or list(IMPLS), args.reps, args.seed)
        print("RESULT " + json.dumps(rows))
        return 0

    return drive(__file__, args)


if __name__ == "__main__":
    raise SystemExit(main())
