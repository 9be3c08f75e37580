"""The generic chunked path (plugin normalizers, fallback of every fused kernel): rows per block.

Usage:
    python benchmarks/attention_chunked.py [--lengths 16384,32768] [--heads 4] [--dim 32]

Every block re-reads all visible keys and values, and its score block grows with the visible
keys. The old policy sized blocks by score entries alone (2^20), which leaves 4 query rows per
block at 65,536 keys; the one policy now (``lengthgen.kernels.chunking``) keeps at least
MIN_CHUNK_ROWS rows. Both are timed here in one process on the same inputs (softmax under NAPE
slopes, causal, B = 1, the engine's ``chunked`` path), new first, and their outputs compared.
"peak MiB" is the process's peak resident memory after each call (so the old path's column is
the peak of both).
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from lengthgen.functional.positions import POSITION_SCHEMES
from lengthgen.kernels import chunking
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import Softmax


def timed(
    inputs: tuple[torch.Tensor, ...], slopes: torch.Tensor, min_rows: int
) -> tuple[float, torch.Tensor]:
    saved = chunking.MIN_CHUNK_ROWS
    chunking.MIN_CHUNK_ROWS = min_rows
    try:
        start = time.perf_counter()
        with torch.no_grad():
            out, _ = attend(*inputs, Softmax(), alibi_slopes=slopes, impl="chunked")
        return time.perf_counter() - start, out
    finally:
        chunking.MIN_CHUNK_ROWS = saved


def peak_mib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024  # Linux reports KiB


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", default="16384,32768")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--dim", type=int, default=32)
    args = parser.parse_args()
    slopes = torch.tensor(POSITION_SCHEMES["nape"].slopes(args.heads))
    print(f"threads={torch.get_num_threads()} heads={args.heads} dim={args.dim} "
          f"MIN_CHUNK_ROWS={chunking.MIN_CHUNK_ROWS}")
    print(f"{'N':>7} {'rows old':>8} {'rows new':>8} {'old s':>8} {'new s':>8} {'speed-up':>8} "
          f"{'max |diff|':>10} {'peak new':>9} {'peak old':>9}")
    for n in (int(x) for x in args.lengths.split(",")):
        gen = torch.Generator().manual_seed(n)
        inputs = tuple(torch.randn(1, args.heads, n, args.dim, generator=gen) for _ in range(3))
        new_s, new = timed(inputs, slopes, chunking.MIN_CHUNK_ROWS)
        new_peak = peak_mib()
        old_s, old = timed(inputs, slopes, 1)
        old_peak = peak_mib()
        per_row = args.heads * n
        old_rows = max(1, chunking.CHUNK_ENTRIES // per_row)
        print(f"{n:>7} {old_rows:>8} {chunking.chunk_rows(per_row):>8} {old_s:>8.2f} {new_s:>8.2f} "
              f"{old_s / new_s:>8.2f} {float((old - new).abs().max()):>10.2e} {new_peak:>9} {old_peak:>9}",
              flush=True)


if __name__ == "__main__":
    main()
