"""Passes over K and tiles computed by the Triton α-entmax kernels, counted (not timed).

Runs on a GPU or, without one, under the Triton interpreter (set here), with the GPU's 64×64
tiles, so the counts are those a GPU would make:

    python benchmarks/entmax_passes.py --n 4096 --out benchmarks/results/entmax_passes.json

Regimes as in ``attention_cpu.py``: q, k, v ~ N(0, 1) ("random"), q × 4 ("peaked"), q × 0.01
("flat"); α ∈ {1.25, 1.5, 2.0}; causal, no ALiBi unless ``--alibi``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

REGIMES = {"random": 1.0, "peaked": 4.0, "flat": 0.01}
ALPHAS = (1.25, 1.5, 2.0)


def pass_table(n: int, dim: int = 16, heads: int = 1, alphas: tuple[float, ...] = ALPHAS,
               regimes: tuple[str, ...] = tuple(REGIMES), device: str = "cpu", seed: int = 0,
               backward: bool = True, alibi: float | None = None) -> list[dict[str, float | str]]:
    """One row per (regime, α): ``PassCounts.summary()`` plus the case and its seconds."""
    from lengthgen.kernels.triton.entmax_passes import count_passes

    rows: list[dict[str, float | str]] = []
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, heads, n, dim, generator=g).to(device) for _ in range(3))
    slopes = None if alibi is None else torch.full((heads,), alibi, device=device)
    for regime in regimes:
        for alpha in alphas:
            start = time.perf_counter()
            counts = count_passes(q * REGIMES[regime], k, v, alpha, alibi_slopes=slopes, backward=backward)
            rows.append({"regime": regime, "alpha": alpha, "n": n, "dim": dim, "heads": heads,
                         **counts.summary(), "seconds": time.perf_counter() - start})
    return rows


def format_table(rows: list[dict[str, float | str]]) -> str:
    lines = [f"{'regime':>7} {'α':>5} | {'passes p50':>10} {'p95':>4} {'max':>4} | "
             f"{'fwd tiles/causal':>16} {'output pass':>11} {'backward':>8}"]
    for r in rows:
        bwd = f"{r['bwd_tile_share']:8.2f}" if "bwd_tile_share" in r else f"{'-':>8}"
        lines.append(f"{r['regime']:>7} {r['alpha']:>5} | {r['passes_median']:>10.0f} "
                     f"{r['passes_p95']:>4.0f} {r['passes_max']:>4.0f} | "
                     f"{r['fwd_tiles_per_causal_tile']:>16.2f} "
                     f"{r['output_pass_tile_share']:>11.2f} {bwd}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--dim", type=int, default=16)
    parser.add_argument("--heads", type=int, default=1)
    parser.add_argument("--alibi", type=float, default=None, help="one ALiBi slope for every head")
    parser.add_argument("--regimes", nargs="+", choices=tuple(REGIMES), default=tuple(REGIMES))
    parser.add_argument("--alphas", nargs="+", type=float, default=ALPHAS)
    parser.add_argument("--no-backward", action="store_true")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    rows = pass_table(args.n, args.dim, args.heads, tuple(args.alphas), tuple(args.regimes), device=device,
                      backward=not args.no_backward, alibi=args.alibi)
    alibi = f", ALiBi slope {args.alibi}" if args.alibi is not None else ""
    print(f"N={args.n} B=1 H={args.heads} D={args.dim} causal{alibi}, 64×64 tiles, "
          f"{'GPU' if device == 'cuda' else 'Triton interpreter'}")
    print(format_table(rows))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
