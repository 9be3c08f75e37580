"""Reading result rows, and the per-run view every other leaderboard module works from.

A *setting* is a run's recipe without its seed (the hash of its config minus ``seed``): runs that
differ only by seed share it, and a grid over, say, learning rates gives one setting per rate.
Rows of a re-evaluation on a variant of the task (``lengthgen eval --param``, recorded in
``eval_variant``) measure something else than the training task, so they form rows of their own:
their backend reads ``softmax [near_misses=8]``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen.harness.storage.results import conform, load_results
from lengthgen.leaderboard.stats import is_missing


def load_rows(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Result rows of a sweep folder (its ``data/``), a results folder or one Parquet file; columns
    older files lack (``val_exact_id``, ``val_exact_8x``, ``eval_variant``) read as missing."""
    return load_results(Path(path))


def setting_of(config_json: Any) -> str:
    """Hash of the run's config without its seed: runs that differ only by seed share it."""
    return recipe_hash(config_json, ("seed",))


def recipe_hash(config_json: Any, without: Sequence[str]) -> str:
    """8 hex digits naming a recorded config without the fields ``without`` ("" for no config):
    configs that differ only in those fields share it (a setting: all but the seed)."""
    config = config_dict(config_json)
    if not config:
        return ""
    for key in without:
        config.pop(key, None)
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]


def config_dict(config_json: Any) -> dict[str, Any]:
    if not isinstance(config_json, str) or not config_json:
        return {}
    return json.loads(config_json)


def prepared(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with a ``setting`` column, no missing ``pos``, task variants and submitted runs
    (``sources``) as backends (and runs) of their own, in a stable order."""
    frame = conform(rows)
    frame["setting"] = [setting_of(c) for c in frame["config_json"]]
    frame["pos"] = frame["pos"].fillna("")
    variant = frame["eval_variant"].fillna("").astype(str)
    source = frame["source"].fillna("").astype(str) if "source" in frame else pd.Series("", frame.index)
    for column in ("attn", "run_id"):  # a (run, variant) is evaluated, and counted, on its own
        frame[column] = [f"{a} [{v}]" if v else a for a, v in zip(frame[column], variant, strict=True)]
        frame[column] = [f"{a} @ {s}" if s else a for a, s in zip(frame[column], source, strict=True)]
    return frame.sort_values(["task", "attn", "pos", "setting", "seed", "run_id", "factor"], kind="mergesort",
                             na_position="last").reset_index(drop=True)


def ok_rows(rows: pd.DataFrame, task: str | None = None) -> pd.DataFrame:
    """Successful evaluation rows (of one task when given)."""
    keep = rows["status"] == "ok"
    if task is not None:
        keep &= rows["task"] == task
    return rows[keep].dropna(subset=["factor"])


def first_present(values: pd.Series) -> float | None:
    for value in values:
        if not is_missing(value):
            return float(value)
    return None


def runs(frame: pd.DataFrame) -> pd.DataFrame:
    """One line per run of a :func:`prepared` frame.

    ``evaluated``: the run has at least one ok evaluation row; ``failed``: some row is not ok;
    ``exact_1x``: its 1× test exact match; ``val_id`` / ``val_8x``: the selected checkpoint's
    validation scores (None where the rows predate those columns or training died first);
    ``source``: the submission's label, "" for the board's own runs.
    """
    out = []
    for run_id, group in frame.groupby("run_id", sort=True):
        first = group.iloc[0]
        ok = ok_rows(group)
        at_1x = ok[ok["factor"] == 1]
        out.append({
            "run_id": run_id, "task": first["task"], "attn": first["attn"], "pos": first["pos"],
            "seed": None if is_missing(first["seed"]) else int(first["seed"]), "setting": first["setting"],
            "preset": first["preset"], "config_json": first["config_json"], "created_at": first["created_at"],
            "evaluated": not ok.empty, "failed": bool((group["status"] != "ok").any()),
            "exact_1x": None if at_1x.empty else float(at_1x["exact_match"].iloc[0]),
            "val_id": first_present(group["val_exact_id"]), "val_8x": first_present(group["val_exact_8x"]),
            "source": str(first["source"]) if "source" in group and isinstance(first["source"], str) else "",
        })
    columns = ["run_id", "task", "attn", "pos", "seed", "setting", "preset", "config_json", "created_at",
               "evaluated", "failed", "exact_1x", "val_id", "val_8x", "source"]
    table = pd.DataFrame(out, columns=columns)
    return table.sort_values(["task", "attn", "pos", "setting", "seed", "run_id"], kind="mergesort",
                             na_position="last").reset_index(drop=True)
