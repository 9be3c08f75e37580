"""One run of a sweep, recorded in its dataset: the same function in the driver (local, one job), in
a pool process (local, several jobs) and in a Ray worker, so every launcher writes the same files."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lengthgen.config import RunConfig
from lengthgen.errors import UserError, exception_line
from lengthgen.harness.storage.identity import made_now, run_columns, run_key
from lengthgen.harness.storage.results import rows_to_frame
from lengthgen.progress import Shown
from lengthgen.sweeps.dataset import data_path, run_path

__all__ = ["RunOutcome", "failed_frame", "outcome_of", "run_one"]


@dataclass(frozen=True)
class RunOutcome:
    """What the driver needs to know about a finished run (small, so cheap to ship from Ray)."""

    key: str
    status: str
    error: str | None
    seconds: float


def outcome_of(key: str, frame: pd.DataFrame, seconds: float) -> RunOutcome:
    bad = frame[frame["status"] != "ok"]
    if bad.empty:
        return RunOutcome(key, "ok", None, seconds)
    return RunOutcome(key, "failed", str(bad["error"].iloc[0]), seconds)


def failed_frame(config: RunConfig, exc: BaseException | str) -> pd.DataFrame:
    """A one-row ``failed`` record for a run that died outside the harness's own error handling."""
    error = exc if isinstance(exc, str) else exception_line(exc)
    return rows_to_frame([{**run_columns(config), **made_now(), "status": "failed",
                           "error": (error.splitlines() or ["unknown error"])[0]}])


def run_one(config: RunConfig, out: str, device: str = "auto", threads: int | None = None,
            cwd: str | None = None, log: str | None = None,
            progress: Shown = False) -> tuple[RunOutcome, pd.DataFrame]:
    """Execute one run and record it in the dataset; never raises for a failing run (only for a
    file system that cannot take its results: no space, no permission, and for a
    :class:`~lengthgen.errors.UserError` that every run would meet, such as a tracker that cannot
    start). The data file mirrors the run's ``results.parquet``, written under the run's lock, so
    rows that ``lengthgen eval`` added meanwhile are kept.

    ``cwd`` lets a worker resolve relative ``file.py:Class`` plugin specs like the driver did;
    ``progress="log"`` writes a line every tenth of the training to a log (the sweep's bar holds a
    terminal).
    """
    from lengthgen.harness.run import execute, record_failure
    from lengthgen.harness.storage.store import current_rows, run_lock, save_rows

    if cwd and os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    if threads:
        import torch

        torch.set_num_threads(threads)
    key = run_key(config)
    run_dir = run_path(out, key)
    start = time.perf_counter()
    try:
        frame = execute(config, run_dir.parent, device=device, progress=progress, log=log)
        recorded: Path | None = run_dir / "results.parquet"
    except (OSError, UserError):
        raise
    except Exception as exc:  # the harness records its own failures; this catches the rest
        record_failure(run_dir, exc)
        frame, recorded = failed_frame(config, exc), None
    with run_lock(run_dir):
        rows = current_rows(recorded) if recorded is not None else None
        save_rows(data_path(out, key), frame if rows is None or rows.empty else rows, replace_variant="")
    return outcome_of(key, frame, time.perf_counter() - start), frame
