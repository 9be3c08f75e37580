"""The Python API for notebooks and scripts: ``lengthgen.run``, ``lengthgen.sweep``,
``lengthgen.evaluate`` and ``lengthgen.load_results``, each returning a pandas DataFrame of result
rows (the columns of ``results.parquet``, see the README).

They are the command line's commands as functions: the same ``build_run_config``, the same run
folders and sweep folders, the same one-line :class:`~lengthgen.errors.UserError` for bad input.
Settings are keyword arguments: ``pos``, ``preset``, ``seed``, ``task_params``, ``attn_options``,
the dedicated ones (``steps``, ``max_factor``, ``train_length``, ``eval_samples``, ``selection``)
by name, any other config field by its dotted name through a dict, e.g.
``lengthgen.run(task="copy", attn="softmax", seed=1, steps=200, **{"arch.d_model": 64})``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from lengthgen.config import FLAG_NAMES, RunConfig, build_run_config, combine_overrides, flag_overrides
from lengthgen.errors import UserError


def _settings(overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword settings → dotted overrides (dedicated names, or ``section.field``)."""
    flags = {k: v for k, v in overrides.items() if k in FLAG_NAMES}
    dotted = {k: v for k, v in overrides.items() if k not in FLAG_NAMES}
    bad = [k for k in dotted if "." not in k]
    if bad:
        raise UserError(f"unknown setting {bad[0]!r}; use one of {', '.join(FLAG_NAMES)} or a dotted "
                        "config field such as **{'train.lr': 5e-4}")
    return combine_overrides(flag_overrides(**flags), dotted)


def _names(value: str | Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


#: Keywords of ``build_run_config`` that the functions pass on by name (the rest are overrides).
CONFIG_KEYWORDS: tuple[str, ...] = ("pos", "preset", "seed", "task_params", "attn_options")


def _config(task: str, attn: str, settings: dict[str, Any]) -> RunConfig:
    named = {key: settings.pop(key) for key in CONFIG_KEYWORDS if key in settings}
    return build_run_config(task, attn, **named, overrides=_settings(settings))


def run(
    task: str,
    attn: str,
    *,
    out: str | os.PathLike[str] = "runs",
    device: str = "auto",
    log: str | None = None,
    progress: bool = False,
    **settings: Any,
) -> pd.DataFrame:
    """Train and evaluate one run, like ``lengthgen run``; returns its rows (one per length).

    ``settings``: ``pos``, ``preset``, ``seed``, ``task_params``, ``attn_options`` (as for
    ``lengthgen.config.build_run_config``, with its defaults), the dedicated settings and dotted
    config fields. The run folder ``out/<run_id>/`` is written as by the command line. A run that
    fails (diverged, out of memory) returns its ``failed`` row rather than raising.
    """
    from lengthgen.harness.run import execute
    from lengthgen.harness.tracking import check_tracker

    config = _config(task, attn, dict(settings))
    check_tracker(log)
    return execute(config, out, device_name=device, progress=progress, log=log)


def sweep(
    task: str | Sequence[str],
    attn: str | Sequence[str],
    *,
    out: str | os.PathLike[str],
    pos: str | Sequence[str] = "nape",
    seeds: Sequence[int] = (0,),
    preset: str = "quick",
    task_params: Mapping[str, Any] | None = None,
    attn_options: Mapping[str, Any] | None = None,
    launcher: str = "local",
    jobs: int | None = None,
    device: str = "auto",
    retry_failed: bool = False,
    log: str | None = None,
    progress: bool = False,
    **overrides: Any,
) -> pd.DataFrame:
    """Run a grid into the sweep folder ``out``, like ``lengthgen sweep`` (calling it again resumes);
    returns every row of the folder's dataset."""
    from lengthgen import sweeps
    from lengthgen.harness.tracking import check_tracker

    spec = sweeps.SweepSpec(tasks=_names(task), attns=_names(attn), positions=_names(pos), seeds=tuple(seeds),
                            preset=preset, task_params=dict(task_params or {}),
                            attn_options=dict(attn_options or {}), overrides=_settings(overrides))
    configs = sweeps.validate_spec(spec)
    check_tracker(log)
    sweeps.run_sweep(configs, out, launcher=launcher, device=device, jobs=jobs, retry_failed=retry_failed,
                     progress=progress, log=log)
    return load_results(out)


def evaluate(
    path: str | os.PathLike[str],
    *,
    max_factor: int | None = None,
    eval_samples: int | None = None,
    task_params: Mapping[str, Any] | None = None,
    redo: bool = False,
    device: str = "auto",
    log: str | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """Evaluate saved models (a run folder, or every run of a sweep folder) at more lengths or on a
    task variant, like ``lengthgen eval``; returns the new rows (also merged into the results).
    Raises :class:`UserError` if an evaluation stops on an error."""
    from lengthgen.harness.reevaluate import find_saved_runs, plan_evaluation, run_evaluation
    from lengthgen.harness.results import rows_to_frame
    from lengthgen.harness.tracking import check_tracker

    plans = [plan_evaluation(run, max_factor=max_factor, eval_samples=eval_samples, task_params=task_params)
             for run in find_saved_runs(path)]
    check_tracker(log)
    frames = []
    for plan in plans:
        outcome = run_evaluation(plan, plan.factors if redo else plan.missing_factors, device_name=device,
                                 progress=progress, log=log)
        frames.append(outcome.rows)
        if outcome.error:
            raise UserError(f"evaluation of {plan.run.run_id} stopped: {outcome.error}")
    rows = [f for f in frames if not f.empty]
    return pd.concat(rows, ignore_index=True) if rows else rows_to_frame([])


def load_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every result row under ``path``: a sweep folder (its ``data/``), a run folder, a folder of
    results files or one Parquet file. Unusable files are skipped with a warning."""
    from lengthgen.harness.results import load_results as load

    return load(path)
