"""Running (head, query block) work items of the fused CPU kernels on worker threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

import numpy as np
import torch
from torch import Tensor

__all__ = ["as_f32", "run_blocks"]


def as_f32(t: Tensor) -> np.ndarray:
    """A float32 numpy view (or copy) of a CPU tensor."""
    return t.detach().to(torch.float32).numpy()


def run_blocks(
    work: Callable[..., int], blocks: Sequence[tuple[int, ...]], buf_len: int, threads: int | None
) -> int:
    """Run ``work(*block, buf)`` on worker threads, biggest blocks first; returns the summed results.

    A block is (head, first row, rows, keys). Each worker runs its BLAS call and the (GIL-free)
    numba kernel single-threaded, so the workers never wait on each other: one shared OpenMP pool
    would put a barrier in every block, and on a busy machine a descheduled pool thread stalled
    all the others (measured 5-20× slowdowns). ``buf`` is a per-thread float32 score buffer.
    """
    n_threads = max(1, min(threads or torch.get_num_threads(), len(blocks)))
    order = sorted(blocks, key=lambda b: -b[-1] * b[-2])
    if n_threads == 1:
        buf = torch.empty(buf_len, dtype=torch.float32)
        return sum(work(*b, buf) for b in order)
    lock = threading.Lock()
    queue = iter(order)
    totals = [0] * n_threads
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        try:
            torch.set_num_threads(1)  # this thread's OpenMP ICV (and MKL's, restored below)
            buf = torch.empty(buf_len, dtype=torch.float32)
            while True:
                with lock:
                    b = next(queue, None)
                if b is None or errors:
                    return
                totals[slot] += work(*b, buf)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    saved = torch.get_num_threads()
    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n_threads)]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        torch.set_num_threads(saved)
    if errors:
        raise errors[0]
    return sum(totals)


