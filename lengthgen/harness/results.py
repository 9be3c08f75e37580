"""Results: one long-format row per (run, evaluation length, evaluation variant), in Parquet.

Plots and leaderboards are pure functions of these rows. A run that failed still leaves a row
(status ``failed`` with its error) so a sweep can report it instead of losing it. Reading is
forgiving: a truncated, empty or foreign file next to good ones is skipped with a one-line
warning that names it, so one bad file never hides the others.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen import provenance
from lengthgen.errors import UserNotice
from lengthgen.files import atomic_write

#: Column order of every results table (documented in the README).
COLUMNS: tuple[str, ...] = (
    "run_id", "task", "attn", "pos", "seed", "preset", "train_length", "eval_length", "factor",
    "n_samples", "exact_match", "exact_match_lo", "exact_match_hi", "token_accuracy",
    "attn_entropy", "attn_support", "steps", "best_step", "selection", "val_exact_id", "val_exact_8x",
    "params", "train_seconds", "eval_seconds", "device", "lengthgen_version", "torch_version", "config_hash",
    "config_json", "created_at", "status", "error", "eval_variant", *provenance.COLUMNS,
)

#: Columns without which a file is not a lengthgen results file (older files lack later columns,
#: e.g. ``eval_variant``; those are filled in).
REQUIRED: tuple[str, ...] = ("run_id", "task", "attn", "pos", "seed", "status", "factor", "eval_length",
                             "exact_match", "config_json")
#: Columns that must never be empty.
NOT_NULL: tuple[str, ...] = ("run_id", "task", "attn", "status")


def rows_to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    return conform(pd.DataFrame(rows))


def conform(frame: pd.DataFrame) -> pd.DataFrame:
    """The results columns in their order (missing ones empty; ``eval_variant`` "" when absent),
    then any further columns the frame has."""
    frame = frame.copy()
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    frame["eval_variant"] = frame["eval_variant"].fillna("").astype(str)
    return frame[list(COLUMNS) + [c for c in frame.columns if c not in COLUMNS]]


def write_parquet_atomic(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Results to Parquet through the one atomic writer: readers never see half a file."""
    return atomic_write(path, lambda handle: frame.to_parquet(handle, index=False))


def _problem(frame: pd.DataFrame) -> str | None:
    """Why a frame read from disk is not usable as results (None: it is)."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        return f"not a lengthgen results file (no column {', '.join(missing)})"
    for column in NOT_NULL:
        if frame[column].isna().any():
            return f"column {column!r} has empty values"
    ok = frame[frame["status"] == "ok"]
    for column in ("factor", "eval_length", "exact_match"):
        if ok[column].isna().any():
            return f"an ok row has no {column}"
    return None


def read_results_file(path: Path) -> pd.DataFrame | None:
    """One results file, or None (with a one-line warning naming it) when it is unusable."""
    try:
        frame = pd.read_parquet(path)
    except Exception as exc:  # truncated, empty, not Parquet, unreadable: pyarrow and OS errors
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        warnings.warn(f"skipped {path}: unreadable ({reason})", UserNotice, stacklevel=2)
        return None
    problem = _problem(frame)
    if problem is not None:
        warnings.warn(f"skipped {path}: {problem}", UserNotice, stacklevel=2)
        return None
    return conform(frame)


def read_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """All usable result rows under ``path`` (a Parquet file or a folder searched recursively).

    Dot-prefixed files (temporary files of an interrupted write) are ignored; unusable files are
    skipped with a warning. No usable file gives an empty frame with the results columns.
    """
    root = Path(path)
    files = [root] if root.is_file() else sorted(root.rglob("*.parquet"))
    files = [f for f in files if not f.name.startswith(".")]
    frames = [frame for f in files if (frame := read_results_file(f)) is not None and not frame.empty]
    if not frames:
        return rows_to_frame([])
    return pd.concat(frames, ignore_index=True)


def load_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Result rows of a sweep folder (its ``data/``), a results folder or one Parquet file.

    A sweep folder's ``runs/`` repeats every run's rows, so only ``data/`` is read there.
    Exact duplicates of a (run, length, evaluation variant) row are dropped; unusable files are
    skipped with a warning.
    """
    root = Path(path)
    rows = read_results(root / "data" if (root / "data").is_dir() else root)
    if rows.empty:
        return rows
    key = ["run_id", "factor", "eval_variant", "status"]
    rows = rows.sort_values(key, kind="mergesort", na_position="last")
    return rows.drop_duplicates(subset=key).reset_index(drop=True)
