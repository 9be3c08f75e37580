"""Training batches made one step ahead, in a background thread.

Making a batch (the task's generator, the model's view, pinning) is host work; the model's step
is the accelerator's, or other cores' on a CPU. Handing step s + 1's batch to a thread while step s
computes hides the first behind the second. Each batch is still a pure function of its step
(the task's seeded stream), so a run makes the same batches, in the same order, either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

Batch = TypeVar("Batch")


@contextmanager
def prefetched(make: Callable[[int], Batch], steps: Sequence[int],
               ahead: bool = True) -> Iterator[Iterator[tuple[int, Batch]]]:
    """``(step, make(step))`` for each step, the next one made while the caller works on the
    current; ``ahead=False`` makes each in turn in the caller's thread (the same batches). An
    exception raised by ``make`` reaches the caller at the step it belongs to; leaving the block
    early waits only for the one batch in flight."""
    if not ahead:
        yield ((step, make(step)) for step in steps)
        return
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lengthgen-batches")

    def batches() -> Iterator[tuple[int, Batch]]:
        pending: Future[Batch] | None = pool.submit(make, steps[0]) if len(steps) else None
        for i, step in enumerate(steps):
            assert pending is not None
            batch = pending.result()
            pending = pool.submit(make, steps[i + 1]) if i + 1 < len(steps) else None
            yield step, batch

    try:
        yield batches()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
