"""The local launcher: the runs one after another in this process, or ``jobs`` at once in a pool of
processes that share the cores."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

from lengthgen.config import RunConfig
from lengthgen.errors import UserError, exception_line
from lengthgen.progress import Shown
from lengthgen.sweeps.dataset import record_if_missing, run_key
from lengthgen.sweeps.worker import RunOutcome, failed_frame, outcome_of, run_one

__all__ = ["OnDone", "launch_local", "terminate_workers"]

OnDone = Callable[[RunOutcome], None]


def _pool_worker(config: RunConfig, out: str, device: str, threads: int | None, cwd: str,
                 log: str | None, progress: Shown) -> RunOutcome:
    return run_one(config, out, device, threads, cwd, log, progress)[0]


def launch_local(todo: Sequence[RunConfig], out: str, device: str, jobs: int, on_done: OnDone,
                 log: str | None = None, progress: Shown = False) -> None:
    """In this process (jobs = 1) or in a pool of ``jobs`` processes sharing the cores."""
    if jobs <= 1:
        for config in todo:
            on_done(run_one(config, out, device, log=log, progress=progress)[0])
        return
    import multiprocessing
    from concurrent.futures import as_completed

    threads = max(1, (os.cpu_count() or 1) // jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_pool_worker, c, out, device, threads, os.getcwd(), log, progress): c
                   for c in todo}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except UserError:  # the same for every run (a tracker that cannot start): stop
                raise
            except Exception as exc:  # the worker process died (killed, out of memory)
                config = futures[future]
                frame = failed_frame(config, f"worker died: {exception_line(exc)}")
                record_if_missing(config, out, frame)
                outcome = outcome_of(run_key(config), frame, 0.0)
            on_done(outcome)
    except BaseException:  # Ctrl-C: stop the runs in progress now, not after they finish
        terminate_workers(pool)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def terminate_workers(pool: ProcessPoolExecutor) -> None:
    """Stop a process pool's workers now (Ctrl-C, SIGTERM), not after their runs finish.

    Python 3.14 gives pools ``terminate_workers``. Before it the pool has no public way, and this is
    the one place lengthgen reads another module's private name, the pool's ``_processes``: the
    public alternatives are unsound (``multiprocessing.active_children()`` would also stop
    children the caller started for itself) or need every creator of a pool to pass an initializer
    (workers reporting their PIDs, whose numbers the system may give to another process once a
    worker dies).
    """
    public = getattr(pool, "terminate_workers", None)
    if callable(public):
        public()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()
