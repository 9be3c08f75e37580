"""Writing a run's result rows: merged into the file under the run's lock, so no writer loses rows.

A run's rows can have several writers at once: the run itself (``lengthgen run``, a sweep) and
``lengthgen eval`` adding lengths or variants of the same saved model. Each write takes the run's
lock (``<run>/.lock``, an exclusive ``flock``), reads what the file holds, merges the new rows in
and rewrites the file atomically; a row with the same (run, length, variant) is replaced, never
duplicated. Writers save after every evaluated length, so an interrupted command keeps what it
finished.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen.harness.storage.results import conform, read_results_file, write_parquet_atomic

#: A row is replaced by a new one with the same values here.
ROW_KEY: tuple[str, ...] = ("run_id", "eval_length", "eval_variant")

LOCK_NAME = ".lock"


@contextmanager
def run_lock(run_dir: Path) -> Iterator[None]:
    """Hold the run's exclusive lock for the block (a no-op where ``fcntl`` does not exist)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: writers are not serialized
        yield
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    # not through a link: a run folder from someone else could point .lock at any file of yours
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _key_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isnan(value) and value.is_integer():
        return int(value)
    return value


def merge_rows(existing: pd.DataFrame | None, new: pd.DataFrame,
               replace_variant: str | None = None) -> pd.DataFrame:
    """``existing`` with ``new`` added: rows of ``existing`` with a (run, length, variant) of a new
    row are dropped, and every row of the variant ``replace_variant`` when given (a run trained
    again replaces its training-task rows: ``""``); the result is sorted by variant, then factor
    (failed rows without a length last)."""
    if existing is None or existing.empty:
        combined = new
    else:
        replaced = {tuple(_key_value(v) for v in row) for row in new[list(ROW_KEY)].itertuples(index=False)}
        keep = [tuple(_key_value(v) for v in row) not in replaced
                for row in existing[list(ROW_KEY)].itertuples(index=False)]
        kept = existing[keep]
        if replace_variant is not None:
            kept = kept[kept["eval_variant"] != replace_variant]
        combined = pd.concat([kept, new], ignore_index=True) if not kept.empty else new
    order = combined.sort_values(["eval_variant", "factor"], kind="mergesort", na_position="last").index
    return conform(combined.loc[order].reset_index(drop=True))


def current_rows(path: Path) -> pd.DataFrame | None:
    """The usable rows a results file holds now (None: no file); its warnings were shown when the
    command first read it."""
    if not path.is_file():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return read_results_file(path)


def kept_rows(frame: pd.DataFrame | None, config_hash: str) -> pd.DataFrame | None:
    """The rows a run stopped while it evaluated keeps when it resumes: the ok training-task rows
    of its own config (None: no results file). The run and the sweep's listing both read this."""
    if frame is None:
        return None
    own = (frame["eval_variant"] == "") & (frame["config_hash"] == config_hash)
    return frame[own & (frame["status"] == "ok")]


def save_rows(path: Path, new: pd.DataFrame, replace_variant: str | None = None) -> pd.DataFrame:
    """Merge ``new`` into the results file ``path`` and rewrite it atomically; returns what the file
    now holds. The caller holds the run's lock."""
    merged = merge_rows(current_rows(path), new, replace_variant)
    write_parquet_atomic(merged, path)
    return merged
