"""Results: one long-format row per (run, evaluation length, evaluation variant), in Parquet.

Plots and leaderboards are pure functions of these rows. A run that failed still leaves a row
(status ``failed`` with its error) so a sweep can report it instead of losing it. This is the one
reader of result files (``leaderboard``, ``plot``, ``eval``, ``load_results``): result folders may
come from someone else, so every row is checked (``lengthgen.harness.storage.schema``) before anything
uses it. Reading is forgiving: a truncated, empty or foreign file, or bad rows, next to good ones
are skipped with one warning line per file that names it, so one bad file never hides the others.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen import provenance
from lengthgen.errors import UserError, UserNotice, exception_line
from lengthgen.files import atomic_write
from lengthgen.harness.storage.schema import AMOUNTS, COUNTS, FRACTIONS, row_problems

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


#: Columns read as numbers once their rows passed the checks (a column with a bad text value was
#: read as text).
NUMERIC: tuple[str, ...] = ("seed", "train_length", "eval_length", "factor", "n_samples", *FRACTIONS, *COUNTS,
                            *AMOUNTS)


@dataclass(frozen=True)
class CheckedFile:
    """One results file after the checks: its usable rows (None: the file is unusable), the
    warning line that says what was skipped (None: nothing), and the runs with skipped rows, each
    with the first reason (how ``lengthgen verify`` names a run whose rows it cannot use)."""

    rows: pd.DataFrame | None
    warning: str | None = None
    bad_runs: dict[str, str] = field(default_factory=dict)


def read_parquet_file(path: Path, columns: list[str] | None = None) -> pd.DataFrame:
    """A Parquet file read through one open: a file that a writer replaces (``files.atomic_write``)
    while it is read comes out whole, old or new. ``pd.read_parquet`` on a path opens it more than
    once, and a replacement in between made about 2% of reads fail (a run's rows read while it
    evaluates; a sweep would redo a run whose data file it could not read)."""
    return pd.read_parquet(io.BytesIO(path.read_bytes()), columns=columns)


def check_results_file(path: Path) -> CheckedFile:
    """Read one results file and check every row (``lengthgen.harness.storage.schema``), warning nobody. A
    symbolic link is not followed: a result folder from someone else could point anywhere."""
    if path.is_symlink():
        return CheckedFile(None, f"skipped {path}: a symbolic link (lengthgen reads no file through a link; "
                                 "copy the file instead)")
    try:
        frame = read_parquet_file(path)
    except Exception as exc:  # truncated, empty, not Parquet, unreadable: pyarrow and OS errors
        reason = exception_line(exc)
        return CheckedFile(None, f"skipped {path}: unreadable ({reason})")
    missing = [c for c in REQUIRED if c not in frame.columns]
    if missing:
        columns = ", ".join(missing)
        return CheckedFile(None, f"skipped {path}: not a lengthgen results file (no column {columns})")
    frame = conform(frame).reset_index(drop=True)
    bad = [(i, p) for i, p in enumerate(row_problems(frame)) if p is not None]
    warning, bad_runs = None, {}
    if bad:
        first, reason = bad[0]
        for i, problem in reversed(bad):
            bad_runs[str(frame["run_id"].iloc[i])] = problem
        if len(bad) == len(frame):
            whole = reason if len(frame) == 1 else f"every row is unusable (row {first}: {reason})"
            return CheckedFile(None, f"skipped {path}: {whole}", bad_runs)
        warning = f"skipped {path}: {len(bad)} of {len(frame)} rows are unusable (row {first}: {reason})"
        frame = frame.drop(index=[i for i, _ in bad]).reset_index(drop=True)
    for column in NUMERIC:
        if not pd.api.types.is_numeric_dtype(frame[column]):
            frame[column] = pd.to_numeric(frame[column])
    return CheckedFile(frame, warning, bad_runs)


def read_results_file(path: Path) -> pd.DataFrame | None:
    """The usable rows of one results file, or None when none is usable.

    A file that cannot be read, or lacks a required column, is skipped with one warning line
    naming it; rows that fail the checks of ``lengthgen.harness.storage.schema`` are skipped with one
    warning line for the file, naming the first bad row and its reason.
    """
    checked = check_results_file(path)
    if checked.warning is not None:
        warnings.warn(checked.warning, UserNotice, stacklevel=2)
    return checked.rows


def recorded_run_ids(path: Path) -> set[str]:
    """The ``run_id`` values a results file holds, unchecked (empty when it cannot be read): to
    tell whether a file belongs to a run before its rows are used."""
    try:
        ids = read_parquet_file(path, columns=["run_id"])["run_id"]
    except Exception:  # missing, truncated, foreign: the reader says why when it reads it
        return set()
    return {str(v) for v in ids.dropna()}


def results_files(path: str | os.PathLike[str]) -> list[Path]:
    """The results files under ``path`` (the file itself, or ``*.parquet`` searched recursively),
    without the dot-prefixed temporary files of an interrupted write."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(root.rglob("*.parquet"))
    return [f for f in files if not f.name.startswith(".")]


def read_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """All usable result rows under ``path`` (a Parquet file or a folder searched recursively).

    Dot-prefixed files (temporary files of an interrupted write) are ignored; unusable files are
    skipped with a warning. No usable file gives an empty frame with the results columns.
    """
    frames = [frame for f in results_files(path) if (frame := read_results_file(f)) is not None
              and not frame.empty]
    if not frames:
        return rows_to_frame([])
    return pd.concat(frames, ignore_index=True)


def results_source(path: str | os.PathLike[str]) -> Path:
    """What :func:`load_results` reads under ``path``: a sweep folder's ``data/``, else ``path``
    (a :class:`UserError` when it does not exist)."""
    root = Path(path)
    if not root.exists():
        raise UserError(f"no results under {str(path)!r}: no such file or folder")
    return root / "data" if (root / "data").is_dir() else root


def usable(rows: pd.DataFrame, where: str) -> pd.DataFrame:
    """``rows``, or the one-line ``UserError`` of a command given ``where`` (its paths, quoted)
    without any usable results file."""
    if rows.empty:
        raise UserError(f"no usable results under {where} (expected DIR/data/*.parquet from a sweep, "
                        "or results.parquet files)")
    return rows


def load_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Result rows of a sweep folder (its ``data/``), a results folder or one Parquet file.

    A sweep folder's ``runs/`` repeats every run's rows, so only ``data/`` is read there.
    Exact duplicates of a (run, length, evaluation variant) row are dropped; unusable files and
    rows are skipped with a warning; a path that does not exist is a :class:`UserError`.
    """
    rows = read_results(results_source(path))
    if rows.empty:
        return rows
    key = ["run_id", "factor", "eval_variant", "status"]
    rows = rows.sort_values(key, kind="mergesort", na_position="last")
    return rows.drop_duplicates(subset=key).reset_index(drop=True)
