"""Results: one long-format row per (run, evaluation length), written to Parquet atomically.

Plots and leaderboards are pure functions of these rows. A run that failed still leaves a row
(status ``failed`` with its error) so a sweep can report it instead of losing it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

#: Column order of every results table (documented in the README).
COLUMNS: tuple[str, ...] = (
    "run_id", "task", "attn", "pos", "seed", "preset", "train_length", "eval_length", "factor",
    "n_samples", "exact_match", "exact_match_lo", "exact_match_hi", "token_accuracy",
    "attn_entropy", "attn_support", "steps", "best_step", "selection", "val_exact_id", "val_exact_8x",
    "params", "train_seconds", "eval_seconds", "device", "lengthgen_version", "torch_version", "config_hash",
    "config_json", "created_at", "status", "error",
)


def rows_to_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    for column in COLUMNS:
        if column not in frame:
            frame[column] = None
    return frame[list(COLUMNS)]


def write_parquet_atomic(frame: pd.DataFrame, path: str | os.PathLike[str]) -> Path:
    """Write to a temporary file in the same folder, fsync, then rename: readers never see half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        frame.to_parquet(tmp, index=False)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def write_text_atomic(text: str, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, target)
    return target


def read_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """All result rows under ``path`` (a Parquet file or a folder searched recursively)."""
    root = Path(path)
    files = [root] if root.is_file() else sorted(root.rglob("*.parquet"))
    files = [f for f in files if not f.name.startswith(".")]
    if not files:
        return rows_to_frame([])
    return pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
