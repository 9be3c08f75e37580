"""Where a sweep stands, read from its dataset alone: ``DIR/data/<run_id>.parquet``, one file per
recorded run, written whole or not at all (a kill leaves at most a dot-prefixed temp file, which
readers ignore). Re-running a sweep does exactly the runs these files do not record as done."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pandas as pd

from lengthgen.config import RunConfig
from lengthgen.harness.resume import STATE_FILE, saved_step
from lengthgen.harness.storage.identity import run_key
from lengthgen.harness.storage.results import read_parquet_file, write_parquet_atomic
from lengthgen.harness.storage.store import current_rows, kept_rows

__all__ = ["Plan", "RunState", "data_dir", "data_path", "kept_factors", "plan", "record_if_missing",
           "run_key", "run_path", "resume_step", "run_state"]

RunState = Literal["ok", "failed", "missing"]


def data_dir(out: str | os.PathLike[str]) -> Path:
    return Path(out) / "data"


def data_path(out: str | os.PathLike[str], key: str) -> Path:
    return data_dir(out) / f"{key}.parquet"


def run_path(out: str | os.PathLike[str], key: str) -> Path:
    """A run's folder (model, learning curve, state) in the sweep folder ``out``."""
    return Path(out) / "runs" / key


def resume_step(out: str | os.PathLike[str], config: RunConfig) -> int | None:
    """The step from which a stopped run of ``config`` in the sweep folder ``out`` resumes its
    training (its state in the run folder); None when it trains from step 0."""
    path = run_path(out, run_key(config)) / STATE_FILE
    return saved_step(path, config) if path.is_file() else None


def kept_factors(out: str | os.PathLike[str], config: RunConfig, step: int | None) -> tuple[int, ...]:
    """The lengths (factors) a run of ``config`` stopped while it evaluated has recorded and keeps
    when it resumes, given the ``step`` its saved state reached (``resume_step``); () for a run that
    still trains, whose new attempt evaluates every length."""
    if step is None or step < config.train.steps:
        return ()
    frame = kept_rows(current_rows(run_path(out, run_key(config)) / "results.parquet"), config.config_hash())
    return () if frame is None else tuple(sorted({int(f) for f in frame["factor"]}))


def run_state(path: Path) -> RunState:
    """``ok`` when every row of the data file is ok, ``failed`` when any is not, ``missing`` when
    there is no readable file (an unreadable one is redone, and overwritten, like a missing one)."""
    if not path.is_file():
        return "missing"
    try:
        status = read_parquet_file(path, columns=["status"])["status"]
    except (OSError, ValueError):  # unreadable, not Parquet, no status column (pyarrow: ArrowInvalid)
        return "missing"
    if status.empty:
        return "missing"
    return "ok" if (status == "ok").all() else "failed"


@dataclass
class Plan:
    todo: list[RunConfig]
    done_ok: list[str]
    done_failed: list[str]


def plan(configs: Sequence[RunConfig], out: str | os.PathLike[str], retry_failed: bool = False) -> Plan:
    """Split the grid into runs to do and runs already recorded."""
    result = Plan([], [], [])
    for config in configs:
        key = run_key(config)
        state = run_state(data_path(out, key))
        if state == "ok":
            result.done_ok.append(key)
        elif state == "failed" and not retry_failed:
            result.done_failed.append(key)
        else:
            result.todo.append(config)
    return result


def record_if_missing(config: RunConfig, out: str, frame: pd.DataFrame) -> None:
    """Write ``frame`` as the run's data file unless the run recorded one itself."""
    path = data_path(out, run_key(config))
    if run_state(path) == "missing":
        write_parquet_atomic(frame, path)
