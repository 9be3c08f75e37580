"""The one chunking policy: when to materialize, and how many query rows go in one block.

Every path that walks query blocks over the visible keys (the generic chunked path, the chunked
α-entmax path, the fused CPU kernels) sizes its blocks here, so a fix to the policy reaches them
all. ``lengthgen.testing.forced_chunking`` changes these numbers to force small blocks in tests;
read them through this module (``chunking.CHUNK_ENTRIES``), never by ``from … import``.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Above this many score entries (B·H·Nq·Nk) without gradients, a long-sequence path is used.
MATERIALIZE_LIMIT = 1 << 24
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


def should_materialize(entries: int, needs_grad: bool) -> bool:
    """Materialize the whole score matrix: always for gradients, else only when it is small."""
    return needs_grad or entries <= MATERIALIZE_LIMIT


def chunk_rows(entries_per_row: int) -> int:
    """Query rows per block: the entry target, raised to MIN_CHUNK_ROWS within MAX_CHUNK_ENTRIES."""
    per_row = max(1, entries_per_row)
    return max(1, CHUNK_ENTRIES // per_row, min(MIN_CHUNK_ROWS, MAX_CHUNK_ENTRIES // per_row))


def plan_chunks(
    positions: Sequence[int], n_keys: int, causal: bool, width: int, max_rows: int | None = None
) -> list[tuple[int, int, int]]:
    """Blocks (start, stop, visible keys) over query rows with these absolute positions.

    ``width`` is the number of score rows one query row stands for in a block (B·H for paths
    that score all heads at once, 1 for per-head kernels). Under causal masking a block only
    scores the keys its last row sees, so early blocks (few keys) take more rows.
    """
    n = len(positions)
    plan = []
    start = 0
    while start < n:

        def keys(rows: int, start: int = start) -> int:
            return min(n_keys, max(positions[start : start + rows]) + 1) if causal else n_keys

        rows = min(n - start, chunk_rows(width * keys(1)), max_rows or n)
        while rows > 1 and rows > chunk_rows(width * keys(rows)):
            rows = max(1, min(rows - 1, chunk_rows(width * keys(rows))))
        plan.append((start, start + rows, keys(rows)))
        start += rows
    return plan
