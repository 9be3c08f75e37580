"""The Python API for notebooks and scripts: ``lengthgen.run``, ``lengthgen.sweep``,
``lengthgen.evaluate`` and ``lengthgen.load_results``, each returning a pandas DataFrame of result
rows (the columns of ``results.parquet``, see the README).

They are the command line's commands as functions: the same ``build_run_config``, the same run
folders and sweep folders, the same checks of paths (``lengthgen.paths``), the same one-line
:class:`~lengthgen.errors.UserError` for bad input of any type (``task=3``, ``seeds=5``, ``out=""``).
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


def _names(value: str | Sequence[str], what: str) -> tuple[str, ...]:
    """One name or a list of names (each checked by ``build_run_config``)."""
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, Sequence):
        raise UserError(f"{what} must be a name or a list of names, got {value!r}")
    return tuple(value)


def _seeds(value: Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or \
            not all(isinstance(s, int) and not isinstance(s, bool) for s in value):
        raise UserError(f"seeds must be a list of integers (e.g. seeds=[0, 1, 2]), got {value!r}")
    return tuple(value)


def _mapping(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise UserError(f"{what} must be a mapping of names to values (a dict), got {value!r}")
    return dict(value)


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
    from lengthgen.harness.devices import check_environment
    from lengthgen.harness.run import execute
    from lengthgen.paths import folder_for_writing

    config = _config(task, attn, dict(settings))
    where = check_environment(device, log)
    return execute(config, folder_for_writing(out, "out"), device=where, progress=progress, log=log)


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
    from lengthgen.paths import folder_for_writing

    sweeps.check_jobs(jobs)
    sweeps.check_launcher(launcher)
    spec = sweeps.SweepSpec(tasks=_names(task, "task"), attns=_names(attn, "attn"),
                            positions=_names(pos, "pos"), seeds=_seeds(seeds), preset=preset,
                            task_params=_mapping(task_params, "task_params"),
                            attn_options=_mapping(attn_options, "attn_options"),
                            overrides=_settings(overrides))
    configs = sweeps.validate_spec(spec)
    sweeps.check_environment(launcher, device, log)
    folder = folder_for_writing(out, "out")
    sweeps.run_sweep(configs, folder, launcher=launcher, device=device, jobs=jobs, retry_failed=retry_failed,
                     progress=progress, log=log)
    return load_results(folder)


def evaluate(
    path: str | os.PathLike[str],
    *,
    max_factor: int | None = None,
    min_factor: int | None = None,
    eval_samples: int | None = None,
    task_params: Mapping[str, Any] | None = None,
    attn: str | None = None,
    attn_options: Mapping[str, Any] | None = None,
    precision: str = "fp32",
    checkpoint: int | None = None,
    redo: bool = False,
    device: str = "auto",
    log: str | None = None,
    progress: bool = False,
    trust_plugins: bool = False,
) -> pd.DataFrame:
    """Evaluate saved models (a run folder, or every run of a sweep folder) at more lengths, on a
    task variant, with another backend (``attn``, ``attn_options``), in bfloat16
    (``precision="bf16"``) or at a checkpoint the run kept (``checkpoint=step``), like ``lengthgen eval``;
    returns the new rows (also merged into the results). A plugin file named by a run's config is
    imported only with ``trust_plugins=True``. Raises :class:`UserError` if an evaluation stops on
    an error."""
    from lengthgen.harness.devices import check_environment
    from lengthgen.harness.recorded.reevaluate import evaluate_runs, plan_runs, stopped
    from lengthgen.harness.storage.results import rows_to_frame
    from lengthgen.paths import input_path
    from lengthgen.registry import trusted_plugins

    if attn is not None and not isinstance(attn, str):
        raise UserError(f"attn must be a backend name (text) or None, got {attn!r}")
    with trusted_plugins([attn], everything=trust_plugins):
        plans = plan_runs(input_path(path, "path"), max_factor=max_factor, eval_samples=eval_samples,
                          task_params=_mapping(task_params, "task_params"), attn=attn,
                          attn_options=_mapping(attn_options, "attn_options"), min_factor=min_factor,
                          precision=precision, checkpoint=checkpoint)
        where = check_environment(device, log)
        frames = []
        for plan, outcome in evaluate_runs(plans, redo=redo, device=where, progress=progress, log=log):
            frames.append(outcome.rows)
            if outcome.error:
                raise UserError(stopped(plan, outcome))
    rows = [f for f in frames if not f.empty]
    return pd.concat(rows, ignore_index=True) if rows else rows_to_frame([])


def load_results(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Every result row under ``path``: a sweep folder (its ``data/``), a run folder, a folder of
    results files or one Parquet file. Unusable files and rows are skipped with a warning; a path
    that does not exist raises :class:`UserError`."""
    from lengthgen.harness.storage.results import load_results as load
    from lengthgen.paths import input_path

    return load(input_path(path, "path"))
