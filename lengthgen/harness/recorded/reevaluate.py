"""Evaluate saved models again: at more lengths, on a variant of their task, with another backend, in
bfloat16 or at a checkpoint the run kept, without retraining (``lengthgen eval``,
``lengthgen.evaluate``, a plan's extensions).

The run folder is found, loaded and checked by ``saved``. The evaluation goes through the same
``build_run_config`` and the same loop over lengths (``harness.run.evaluate_lengths``) as a fresh
run, so a length added later gets exactly the row a run with the larger ``max_factor`` would have
written. New rows keep the run's identity (``run_id``, ``config_hash``, ``config_json``: the model is
the same) and say what was evaluated in ``eval_variant``: empty for the training task, else the
task parameters that differ (``eval_variant=sparse``) and the backend or backend options the same
weights were evaluated with (``attn=softmax``), a number format other than fp32
(``precision=bf16``) and kept weights other than the selected ones (``checkpoint=6000``). They are
merged into the run's ``results.parquet`` and, inside a sweep folder, into its
``data/<run_id>.parquet`` after every length, under the run's lock
(``lengthgen.harness.storage.store``): a row with the same (run, length, variant) is replaced,
never duplicated, and rows another writer adds meanwhile are kept.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from lengthgen.choices import PRECISIONS, Precision
from lengthgen.config import RunConfig, build_run_config, config_hash_of, flag_overrides
from lengthgen.errors import UserError, UserNotice, exception_line
from lengthgen.harness.devices import resolve_device
from lengthgen.harness.evaluate import LengthResult
from lengthgen.harness.recorded.saved import (
    SavedRun,
    find_saved_runs,
    fitting_state,
    load_model,
    task_variant,
    variant_label,
)
from lengthgen.harness.run import evaluate_lengths, plot_run
from lengthgen.harness.storage.identity import backend_package, made_now, run_columns
from lengthgen.harness.storage.results import read_results_file, rows_to_frame
from lengthgen.harness.storage.store import current_rows, run_lock, save_rows
from lengthgen.harness.tracking import TrackerError, open_tracker
from lengthgen.limits import is_power_of_two
from lengthgen.model import Transformer
from lengthgen.registry import reading_data
from lengthgen.tasks.base import Task

__all__ = ["EvalOutcome", "EvalPlan", "evaluate_runs", "plan_evaluation", "plan_runs", "run_evaluation",
           "stopped"]

#: Columns that describe the trained run, copied from its existing rows into the new ones.
RUN_COLUMNS: tuple[str, ...] = ("run_id", "task", "attn", "pos", "seed", "preset", "train_length", "steps",
                                "best_step", "selection", "val_exact_id", "val_exact_8x", "params",
                                "train_seconds", "config_hash", "config_json")


@dataclass(frozen=True)
class EvalPlan:
    run: SavedRun
    config: RunConfig  # the run's config with the evaluation's settings
    task: Task  # what is evaluated: the run's task, or the variant asked for
    variant: str
    factors: list[int]
    missing_factors: list[int]
    precision: Precision = "fp32"  # the weights' and activations' format while evaluating
    checkpoint: int | None = None  # the step of the kept weights evaluated (None: the selected ones)

    def todo(self, redo: bool) -> list[int]:
        """The factors to evaluate: all of them with ``redo``, else those without an ok row."""
        return self.factors if redo else self.missing_factors


def plan_runs(path: str | Path, **settings: Any) -> list[EvalPlan]:
    """:func:`plan_evaluation` of every run under ``path`` (``settings`` as it takes them), before
    any model is evaluated. A run folder's problem is a ``UserError``; in a sweep folder a broken
    run is skipped with a warning and the others are planned (when every run fails the same way,
    a bad setting, that one message is the error)."""
    runs = find_saved_runs(path, settings.get("checkpoint"))
    if (Path(path) / "config.json").is_file():
        return [plan_evaluation(runs[0], **settings)]
    plans, failures = [], []
    for run in runs:
        try:
            plans.append(plan_evaluation(run, **settings))
        except TrackerError:
            raise
        except UserError as exc:
            failures.append((run, str(exc)))
    if not plans and len({message for _, message in failures}) == 1:
        raise UserError(failures[0][1])
    for run, message in failures:
        warnings.warn(f"skipped {run.run_dir}: {message}", UserNotice, stacklevel=2)
    if not plans:
        raise UserError(f"no run under {str(Path(path) / 'runs')!r} can be evaluated (see the warnings)")
    return plans


@reading_data()  # backend and task names come from the run's config: data
def plan_evaluation(run: SavedRun, *, max_factor: int | None = None, eval_samples: int | None = None,
                    task_params: Mapping[str, Any] | None = None, attn: str | None = None,
                    attn_options: Mapping[str, Any] | None = None,
                    min_factor: int | None = None, precision: str | None = None,
                    checkpoint: int | None = None) -> EvalPlan:
    """What evaluating ``run`` with these settings means, checked before any model is evaluated:
    the settings, and that the saved weights fit the model (names and shapes).

    ``min_factor`` leaves out the shorter lengths: a task variant that only exists from some
    length on (MQMTAR's planted near misses need pairs), or only the long lengths of a run.

    ``attn`` / ``attn_options`` evaluate the same weights with another normalizer or other
    backend options (an ablation, e.g. adaptive temperature without its inference-time
    sharpening: ``attn="softmax"``); the weights must fit the other backend's parameters.

    ``precision="bf16"`` evaluates the weights cast to bfloat16, activations in bfloat16 too, as a
    model trained and tested in pure bf16 (the paper's ``bf16-true``) runs; attention scores and
    normalizers stay fp32, as flash-attention computes them from bf16 inputs.

    ``checkpoint`` evaluates the weights the run kept after that many steps (``train.keep_every``)
    instead of the selected ones: whether the checkpoint a selection rule keeps matters at long
    lengths. Its rows keep the run's columns (``best_step`` is still the selected checkpoint's).
    """
    if precision is not None and precision not in PRECISIONS:
        raise UserError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    if checkpoint is not None and (type(checkpoint) is not int or checkpoint < 1):
        raise UserError(f"checkpoint must be a training step (a whole number from 1), got {checkpoint!r}")
    base = run.config
    overrides = flag_overrides(max_factor=max_factor, eval_samples=eval_samples)
    params = {**base.task_params, **(task_params or {})}
    eval_attn = attn or base.attn
    options = dict(base.attn_options) if eval_attn == base.attn else {}
    options.update(attn_options or {})
    config = build_run_config(base.task, eval_attn, pos=base.pos, preset=base.preset, seed=base.seed,
                              task_params=params, attn_options=options, overrides=overrides, start=base)
    tasks = task_variant(base, task_params)
    changed = dict(tasks.changed)
    if config.attn != base.attn:
        changed["attn"] = config.attn
    changed.update({f"attn.{k}": v for k, v in config.attn_options.items()
                    if config.attn != base.attn or base.attn_options.get(k) != v})
    if precision not in (None, "fp32"):
        changed["precision"] = precision
    if checkpoint is not None:
        changed["checkpoint"] = checkpoint
    variant = variant_label(changed)
    fitting_state(run, config, Transformer(config.model(tasks.evaluated.vocab.size), seed=config.seed),
                  checkpoint)
    factors = [f for f in config.eval.factors() if f >= (min_factor or 1)]
    if min_factor is not None and (not is_power_of_two(min_factor) or not factors):
        raise UserError(f"--min-factor must be a power of two from 1 to the largest factor "
                        f"({config.eval.max_factor}), got {min_factor}")
    done = _evaluated_factors(run, variant)
    return EvalPlan(run, config, tasks.evaluated, variant, factors, [f for f in factors if f not in done],
                    precision or "fp32", checkpoint)


def _evaluated_factors(run: SavedRun, variant: str) -> set[int]:
    """Factors with an ok row for ``variant`` in the run's results and (in a sweep) its data file,
    when that file exists: a sweep stopped during the run's evaluation leaves none, and ``_save``
    writes none either, so evaluating the recorded lengths again would only repeat them."""
    found: set[int] | None = None
    for path in (run.run_dir / "results.parquet", run.data_file):
        if path is None or not path.is_file():
            continue
        rows = read_results_file(path)
        ok = {int(f) for f, s, v in zip(rows["factor"], rows["status"], rows["eval_variant"], strict=True)
              if s == "ok" and v == variant and not pd.isna(f)}
        found = ok if found is None else found & ok
    return found or set()


@dataclass
class EvalOutcome:
    rows: pd.DataFrame
    written: list[Path] = field(default_factory=list)
    error: str | None = None


def stopped(plan: EvalPlan, outcome: EvalOutcome) -> str:
    """What is said of an evaluation that stopped on an error (the command line and the Python API)."""
    return f"evaluation of {plan.run.run_id} stopped: {outcome.error}"


def _identity(run: SavedRun, device: torch.device, params: int) -> dict[str, Any]:
    """The run columns of the new rows: copied from the run's own rows, else from its config."""
    rows = current_rows(run.run_dir / "results.parquet")  # without repeating its first read's warnings
    if rows is not None and not rows.empty:
        first = rows.iloc[0]
        row = {column: first[column] for column in RUN_COLUMNS}
    else:
        # the config as recorded, whose hash is in the run id (a newer lengthgen may add fields)
        row = {**run_columns(run.config), "run_id": run.run_id, "params": params,
               "config_json": run.config_json, "config_hash": config_hash_of(run.config_json)}
    return {**row, "device": device.type, **made_now(), "attn_package": backend_package(run.config.attn)}


def _save(run: SavedRun, new: pd.DataFrame) -> list[Path]:
    """Merge ``new`` into the run's results and (once it exists) its sweep's data file, under the
    run's lock; returns the files written."""
    written = []
    with run_lock(run.run_dir):
        for path in (run.run_dir / "results.parquet", run.data_file):
            if path is not None and (path.parent == run.run_dir or path.is_file()):
                save_rows(path, new)
                written.append(path)
    return written


@reading_data()  # backend and task names come from the run's config: data
def run_evaluation(plan: EvalPlan, factors: Sequence[int], *, device: str | torch.device = "auto",
                   progress: bool = True, log: str | None = None,
                   on_length: Callable[[LengthResult], None] | None = None) -> EvalOutcome:
    """Evaluate ``plan.run``'s model at L·f for every f in ``factors`` and merge the rows into its
    results after every length (Ctrl-C keeps the lengths done). An error at some length (e.g. out
    of memory, a plugin that calls ``sys.exit``) keeps the rows of the lengths before it and is
    returned, not raised, so the other runs of a sweep folder still get evaluated."""
    outcome = EvalOutcome(rows_to_frame([]))
    if not factors:
        return outcome
    run, config = plan.run, plan.config
    where = resolve_device(device)
    model = load_model(run, config, plan.task.vocab.size, where, plan.precision, plan.checkpoint)
    base = _identity(run, where, model.num_parameters())
    rows: list[dict[str, Any]] = []

    def save(rows: list[dict[str, Any]]) -> None:
        outcome.rows = rows_to_frame(rows)
        outcome.written += [p for p in _save(run, outcome.rows.tail(1)) if p not in outcome.written]

    tracker = open_tracker(log, run.run_dir, run.run_id, config.model_dump(mode="json"))
    try:
        evaluate_lengths(model, plan.task, config, factors, where, base, rows, save, tracker,
                         progress=progress, variant=plan.variant, on_length=on_length)
    except (Exception, torch.cuda.OutOfMemoryError, SystemExit) as exc:  # SystemExit: a plugin's exit
        if isinstance(exc, OSError):
            raise
        outcome.error = exception_line(exc)
    finally:
        tracker.close()
    if rows:
        results = current_rows(run.run_dir / "results.parquet")
        if results is not None:
            plot_run(results, run.config, run.run_dir)
    return outcome


def evaluate_runs(plans: Sequence[EvalPlan], *, redo: bool = False, device: str | torch.device = "auto",
                  progress: bool = True, log: str | None = None,
                  starting: Callable[[EvalPlan, list[int]], None] | None = None,
                  ) -> Iterator[tuple[EvalPlan, EvalOutcome]]:
    """Evaluate planned runs one after the other, each at the factors it still misses (all of them
    with ``redo``); ``starting`` hears of each run before its evaluation begins. The one loop of
    ``lengthgen eval`` and ``lengthgen.evaluate``: they differ only in what they do with an outcome."""
    for plan in plans:
        todo = plan.todo(redo)
        if starting is not None:
            starting(plan, todo)
        yield plan, run_evaluation(plan, todo, device=device, progress=progress, log=log)
