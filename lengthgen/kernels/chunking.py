"""The one chunking policy: when to materialize, and how many query rows go in one block.

Every path that walks query blocks over the visible keys (the generic chunked path, the chunked
α-entmax path, the fused CPU kernels) sizes its blocks here, so a fix to the policy reaches them
all. ``lengthgen.testing.forced_chunking`` changes these numbers to force small blocks in tests;
read them through this module (``chunking.CHUNK_ENTRIES``), never by ``from … import``.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

#: Above this many score entries (B·H·Nq·Nk) without gradients, a long-sequence path is used.
MATERIALIZE_LIMIT = 1 << 24
#: ...and above this many where the whole matrix costs more per score: stick-breaking rows, whose
#: definition takes a dozen passes over it (4 × 2,048² scores: 2-4 s materialized, 0.1-0.3 s on the
#: key-tile scan), and a cumulative bias, whose float64 differences fill a matrix of their own
#: (FoX at 4 × 512²: 0.37 s materialized, 0.04-0.2 s fused).
HEAVY_MATERIALIZE_LIMIT = 1 << 20
#: Target number of score entries per block (rows × keys × the heads the block covers).
CHUNK_ENTRIES = 1 << 20
#: Fewest query rows per block. Every block re-reads all visible keys and values, and its score
#: buffer grows with them; with the handful of rows the target above leaves at long lengths
#: (4 at 65,536 keys and 4 heads) the growing blocks fragmented the heap past 12 GB resident and
#: evaluation slowed about 4x beyond quadratic. At 64 rows: 576 MiB peak
#: (benchmarks/attention_chunked.py compares both).
MIN_CHUNK_ROWS = 64
#: ...unless that breaks this memory bound on one block's scores (huge heads × keys).
MAX_CHUNK_ENTRIES = 1 << 25
#: Score entries per block for the fused CPU kernels, which write every block into one buffer
#: reused by their worker thread: nothing is allocated per block, so the row floor above has
#: nothing to prevent, while buffers past the cache cost time (two threads share the L3).
#: Measured on the fused α-entmax kernel, 2 threads: at 16,384 keys 4 MiB buffers ran at
#: 0.94-0.96× SDPA against 1.16-1.64× for 8 MiB; at 65,536 keys the 64-row floor (16 MiB)
#: took 24.7-29.2 s against 17.7-19.6 s for 4-8 MiB.
BUFFER_ENTRIES = 1 << 20


def should_materialize(entries: int, needs_grad: bool, heavy: bool = False) -> bool:
    """Materialize the whole score matrix: always for gradients, else only when it is small (``heavy``:
    a matrix that costs more per score, smaller still)."""
    limit = min(MATERIALIZE_LIMIT, HEAVY_MATERIALIZE_LIMIT) if heavy else MATERIALIZE_LIMIT
    return needs_grad or entries <= limit


def chunk_rows(entries_per_row: int, reused_buffer: bool = False) -> int:
    """Query rows per block: the entry target, raised to MIN_CHUNK_ROWS within MAX_CHUNK_ENTRIES
    (``reused_buffer``: BUFFER_ENTRIES, no floor; see there)."""
    per_row = max(1, entries_per_row)
    if reused_buffer:
        return max(1, min(BUFFER_ENTRIES, CHUNK_ENTRIES) // per_row)  # forced_chunking shrinks both
    return max(1, CHUNK_ENTRIES // per_row, min(MIN_CHUNK_ROWS, MAX_CHUNK_ENTRIES // per_row))


def plan_chunks(
    positions: Sequence[int], n_keys: int, causal: bool, width: int, max_rows: int | None = None,
    reused_buffer: bool = False,
) -> list[tuple[int, int, int]]:
    """Blocks (start, stop, keys) over query rows with these absolute positions.

    ``width`` is the number of score rows one query row stands for in a block (B·H for paths
    that score all heads at once, 1 for per-head kernels). Under causal masking a block scores
    the keys up to the largest position so far (for sorted rows: its last row's), so early
    blocks (few keys) take more rows. Each block is the largest that the policy allows.
    ``reused_buffer``: the blocks go to one buffer per worker thread (the fused CPU kernels).
    """
    n = len(positions)
    reach = list(accumulate(positions, max)) if causal else []

    def keys(stop: int) -> int:
        return min(n_keys, reach[stop - 1] + 1) if causal else n_keys

    plan = []
    start = 0
    while start < n:
        lo, hi = 1, min(n - start, max_rows or n)
        while lo < hi:  # rows ≤ chunk_rows(width · keys) is monotone in rows: bisect for the largest
            mid = (lo + hi + 1) // 2
            if mid <= chunk_rows(width * keys(start + mid), reused_buffer):
                lo = mid
            else:
                hi = mid - 1
        plan.append((start, start + lo, keys(start + lo)))
        start += lo
    return plan
