"""Host memory for CPU steps: keep freed tensor memory in the process instead of handing it back.

A CPU training step allocates and frees score-sized tensors (MQMTAR at ``paper-tasks``: 7 MB per
(B, H, N, N) tensor) dozens of times. glibc's malloc serves blocks over its mmap threshold with
fresh mappings and unmaps them on free, so every such tensor is first written through page faults:
a fresh 7 MB tensor cost about 2.5 ms where an in-place pass over one cost 0.5 ms. Raising the
threshold to its largest value (32 MiB on 64-bit glibc) and the trim threshold above it keeps those
blocks in the heap for reuse. Only where tensors live changes, never what is computed, so a run's
numbers are the same bit for bit (``benchmarks/same_numerics.py``); the process keeps up to
``TRIM_THRESHOLD`` of freed memory. Elsewhere than glibc (macOS, musl, Windows) it does nothing.

Why not jemalloc or tcmalloc, the usual advice for PyTorch on CPU: they take effect only through
``LD_PRELOAD`` before Python starts, which a ``pip install`` cannot arrange for a user's command
or a sweep's workers; two ``mallopt`` calls on the allocator already loaded give the same effect
on these allocations.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

__all__ = ["MMAP_THRESHOLD", "TRIM_THRESHOLD", "reuse_freed_memory"]

#: glibc's M_TRIM_THRESHOLD and M_MMAP_THRESHOLD parameters of ``mallopt``.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: The largest mmap threshold 64-bit glibc accepts (HEAP_MAX_SIZE / 2).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: Freed memory at the top of the heap that stays mapped.
TRIM_THRESHOLD = 512 * 1024 * 1024


@functools.cache
def reuse_freed_memory() -> bool:
    """Set glibc's thresholds once per process; True where they were set."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
        # gnu_get_libc_version exists only in glibc: other C libraries keep their own allocators
        libc.gnu_get_libc_version  # noqa: B018
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_set = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return mmap_set and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
