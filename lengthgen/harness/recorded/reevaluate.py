"""Evaluate saved models again: at more lengths, or on a variant of their task, without retraining.

A run folder keeps what this needs: ``config.json`` (the recipe) and ``model.pt`` (the selected
weights). The evaluation goes through the same ``build_run_config`` and ``evaluate_length`` as a
fresh run, so a length added later gets exactly the row a run with the larger ``max_factor``
would have written. New rows keep the run's identity (``run_id``, ``config_hash``,
``config_json``: the model is the same) and say what was evaluated in ``eval_variant``: empty
for the training task, else the task parameters that differ (``eval_variant=sparse``) and the
backend or backend options the same weights were evaluated with (``attn=softmax``). They are
merged into the run's ``results.parquet`` and, inside a sweep folder, into its
``data/<run_id>.parquet`` after every length, under the run's lock (``lengthgen.harness.store``):
a row with the same (run, length, variant) is replaced, never duplicated, and rows another writer
adds meanwhile are kept.

A run folder may come from someone else, so it must say what it holds before anything runs: its
``config.json`` must hash to the folder's run id, its results must be that run's, and ``model.pt``
must hold weights of exactly the model the config builds (names and shapes). A plugin file named
by the config is not imported unless the user allows it (``lengthgen.registry.reading_data``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from pydantic import ValidationError

from lengthgen.config import (
    RunConfig,
    build_run_config,
    flag_overrides,
    parse_json,
    parse_value,
    validation_message,
)
from lengthgen.errors import UserError, UserNotice, exception_line
from lengthgen.files import read_text
from lengthgen.harness.evaluate import evaluate_length
from lengthgen.harness.identity import backend_package, config_hash_of, made_now, run_columns, run_id_of
from lengthgen.harness.results import read_results_file, recorded_run_ids, rows_to_frame
from lengthgen.harness.run import length_row, plot_run, resolve_device
from lengthgen.harness.store import ROW_KEY, current_rows, merge_rows, run_lock, save_rows
from lengthgen.harness.tracking import EVAL_FIELDS, TrackerError, open_tracker
from lengthgen.limits import MAX_TEXT_BYTES, check_power_of_two, check_sample_size
from lengthgen.model import Transformer
from lengthgen.registry import reading_data
from lengthgen.tasks import get_task
from lengthgen.tasks.base import Task

__all__ = ["ROW_KEY", "EvalOutcome", "EvalPlan", "SavedRun", "find_saved_runs", "load_model",
           "load_saved_run", "merge_rows", "plan_evaluation", "plan_runs", "run_evaluation", "variant_label"]

#: Columns that describe the trained run, copied from its existing rows into the new ones.
RUN_COLUMNS: tuple[str, ...] = ("run_id", "task", "attn", "pos", "seed", "preset", "train_length", "steps",
                                "best_step", "selection", "val_exact_id", "val_exact_8x", "params",
                                "train_seconds", "config_hash", "config_json")


@dataclass(frozen=True)
class SavedRun:
    """A run folder with a trained model. ``config_json`` is the recorded config as canonical JSON
    (its hash is in the run id); ``data_file`` is where its sweep keeps its rows when the folder
    is in a sweep's ``runs/`` (the rows go there too once the file exists)."""

    run_dir: Path
    run_id: str
    config: RunConfig
    config_json: str
    data_file: Path | None


def load_saved_run(run_dir: Path) -> SavedRun:
    """The run in ``run_dir``, checked to be what its name says (one-line ``UserError`` if not)."""
    path = run_dir / "config.json"
    try:
        recorded = parse_json(read_text(path, links=False, limit=MAX_TEXT_BYTES), str(path))
        config = RunConfig.model_validate(recorded)
    except ValueError as exc:  # not JSON, or not a run config
        message = validation_message(exc, "") if isinstance(exc, ValidationError) else str(exc)
        raise UserError(f"{path} is not a lengthgen run config: {message.lstrip(': ')}".splitlines()[0]) \
            from None
    canonical = json.dumps(recorded, sort_keys=True, separators=(",", ":"))
    run_id = run_id_of(config, config_hash_of(canonical))
    if run_dir.resolve().name != run_id:
        raise UserError(f"{path} is the config of run {run_id!r}, not of {run_dir.resolve().name!r}: it was "
                        "edited, or the folder renamed; evaluate the folder its run wrote")
    if not (run_dir / "model.pt").is_file():
        again = ("--restore trains it again from the rows its sweep recorded" if sweep_data_file(run_dir)
                 else "run it again")
        raise UserError(f"{run_dir} has no model.pt: the run failed or stopped before training ended; "
                        + again)
    data_file = sweep_data_path(run_dir.resolve())
    for results in (run_dir / "results.parquet", data_file):
        others = sorted((recorded_run_ids(results) if results is not None else set()) - {run_id})
        if others:
            raise UserError(f"{results} holds rows of run {others[0]!r}, not of {run_id!r}: it does not "
                            "belong to this run; move it away")
    return SavedRun(run_dir, run_id, config, canonical, data_file)


def sweep_data_path(run_dir: Path) -> Path | None:
    """Where a run folder's sweep keeps its rows (``DIR/data/RUN.parquet`` for ``DIR/runs/RUN``);
    None for a folder outside a sweep's ``runs/``."""
    if run_dir.parent.name != "runs":
        return None
    return run_dir.parent.parent / "data" / f"{run_dir.name}.parquet"


def sweep_data_file(run_dir: Path) -> Path | None:
    """:func:`sweep_data_path` when that file exists (the run folder itself need not)."""
    data = sweep_data_path(run_dir)
    return data if data is not None and data.is_file() else None


def find_saved_runs(path: str | Path) -> list[SavedRun]:
    """The run at ``path`` (a run folder), or every trained run of a sweep folder (``runs/*``);
    runs of a sweep that cannot be used (no model, an edited config) are skipped with a warning."""
    root = Path(path)
    if not root.is_dir() and sweep_data_file(root) is not None:
        raise UserError(f"{str(path)!r} does not exist, but its sweep's data records the run: the data files "
                        "carry no models; --restore trains it again from its recorded config")
    if not root.is_dir():
        raise UserError(f"{str(path)!r} is not a folder: give a run folder (config.json, model.pt) "
                        "or a sweep folder (runs/, data/)")
    if (root / "config.json").is_file():
        return [load_saved_run(root)]
    if not (root / "runs").is_dir():
        raise UserError(f"{str(path)!r} is neither a run folder (no config.json) nor a sweep folder "
                        "(no runs/)")
    runs = []
    for run_dir in sorted(d for d in (root / "runs").iterdir() if (d / "config.json").is_file()):
        try:
            runs.append(load_saved_run(run_dir))
        except UserError as exc:
            warnings.warn(f"skipped {run_dir}: {exc}", UserNotice, stacklevel=2)
    if not runs:
        raise UserError(f"no trained runs under {str(root / 'runs')!r}")
    return runs


def plan_runs(path: str | Path, **settings: Any) -> list[EvalPlan]:
    """:func:`plan_evaluation` of every run under ``path`` (``settings`` as it takes them), before
    any model is evaluated. A run folder's problem is a ``UserError``; in a sweep folder a broken
    run is skipped with a warning and the others are planned (when every run fails the same way,
    a bad setting, that one message is the error)."""
    runs = find_saved_runs(path)
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


def variant_label(changed: Mapping[str, Any]) -> str:
    """``k=v,k2=v2`` in the ``--param`` syntax (sorted; values as they would be typed)."""

    def typed(value: Any) -> str:
        return value if isinstance(value, str) and parse_value(value) == value else json_text(value)

    return ",".join(f"{key}={typed(value)}" for key, value in sorted(changed.items()))


def json_text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class EvalPlan:
    run: SavedRun
    config: RunConfig  # the run's config with the evaluation's settings
    variant: str
    factors: list[int]
    missing_factors: list[int]


@reading_data()  # backend and task names come from the run's config: data
def plan_evaluation(run: SavedRun, *, max_factor: int | None = None, eval_samples: int | None = None,
                    task_params: Mapping[str, Any] | None = None, attn: str | None = None,
                    attn_options: Mapping[str, Any] | None = None,
                    min_factor: int | None = None) -> EvalPlan:
    """What evaluating ``run`` with these settings means, checked before any model is evaluated:
    the settings, and that the saved weights fit the model (names and shapes).

    ``min_factor`` leaves out the shorter lengths: a task variant that only exists from some
    length on (MQMTAR's planted near misses need pairs), or only the long lengths of a run.

    ``attn`` / ``attn_options`` evaluate the same weights with another normalizer or other
    backend options (an ablation, e.g. adaptive temperature without its inference-time
    sharpening: ``attn="softmax"``); the weights must fit the other backend's parameters.
    """
    base = run.config
    overrides = flag_overrides(max_factor=max_factor, eval_samples=eval_samples)
    params = {**base.task_params, **(task_params or {})}
    eval_attn = attn or base.attn
    options = dict(base.attn_options) if eval_attn == base.attn else {}
    options.update(attn_options or {})
    config = build_run_config(base.task, eval_attn, pos=base.pos, preset=base.preset, seed=base.seed,
                              task_params=params, attn_options=options, overrides=overrides, start=base)
    evaluated = variant_task(base, task_params)
    changed = changed_task_params(base, task_params)
    if config.attn != base.attn:
        changed["attn"] = config.attn
    changed.update({f"attn.{k}": v for k, v in config.attn_options.items()
                    if config.attn != base.attn or base.attn_options.get(k) != v})
    variant = variant_label(changed)
    _fitting_state(run, config, Transformer(config.model(evaluated.vocab.size), seed=config.seed))
    factors = [f for f in config.eval.factors() if f >= (min_factor or 1)]
    if min_factor is not None and (min_factor < 1 or min_factor & (min_factor - 1) or not factors):
        raise UserError(f"--min-factor must be a power of two from 1 to the largest factor "
                        f"({config.eval.max_factor}), got {min_factor}")
    done = _evaluated_factors(run, variant)
    return EvalPlan(run, config, variant, factors, [f for f in factors if f not in done])


def changed_task_params(config: RunConfig, task_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The task parameters an evaluation with ``task_params`` changes, as the variant names them."""
    trained, evaluated = get_task(config.task, **config.task_params), variant_task(config, task_params)
    before, after = trained.config.model_dump(mode="json"), evaluated.config.model_dump(mode="json")
    return {k: v for k, v in after.items() if before.get(k) != v}


def variant_task(config: RunConfig, task_params: Mapping[str, Any] | None) -> Task:
    """The run's task with ``task_params`` set on top of its own; a change of vocabulary is refused:
    the saved model could not read it."""
    trained = get_task(config.task, **config.task_params)
    evaluated = get_task(config.task, **{**config.task_params, **(task_params or {})})
    if evaluated.vocab.tokens != trained.vocab.tokens:
        raise UserError(f"--param {variant_label(task_params or {})} changes the task's vocabulary "
                        f"({trained.vocab.size} → {evaluated.vocab.size} tokens); the saved model cannot "
                        "read it")
    return evaluated


def _existing_rows(path: Path | None) -> pd.DataFrame | None:
    if path is None or not path.is_file():
        return None
    return read_results_file(path)


def _quiet_rows(path: Path | None) -> pd.DataFrame | None:
    """The rows now in ``path``, without repeating the warnings its first read gave."""
    return None if path is None else current_rows(path)


def _evaluated_factors(run: SavedRun, variant: str) -> set[int]:
    """Factors with an ok row for ``variant`` in the run's results and (in a sweep) its data file,
    when that file exists: a sweep stopped during the run's evaluation leaves none, and ``_save``
    writes none either, so evaluating the recorded lengths again would only repeat them."""
    found: set[int] | None = None
    for path in (run.run_dir / "results.parquet", run.data_file):
        if path is None or not path.is_file():
            continue
        rows = _existing_rows(path)
        ok = set() if rows is None else {
            int(f) for f, s, v in zip(rows["factor"], rows["status"], rows["eval_variant"], strict=True)
            if s == "ok" and v == variant and not pd.isna(f)
        }
        found = ok if found is None else found & ok
    return found or set()


@dataclass
class EvalOutcome:
    rows: pd.DataFrame
    written: list[Path] = field(default_factory=list)
    error: str | None = None


def load_model(run: SavedRun, config: RunConfig, vocab_size: int, device: torch.device) -> Transformer:
    """The run's weights in a model built from ``config`` (the run's, or an evaluation variant's)."""
    model = Transformer(config.model(vocab_size), seed=config.seed)
    model.load_state_dict(_fitting_state(run, config, model))
    return model.to(device).eval()


@dataclass(frozen=True)
class TrainedModel:
    """A saved run's model, loaded to be probed at one length (``lengthgen positions``, ``heads``)."""

    run: SavedRun
    task: Task
    model: Transformer
    length: int
    device: torch.device


@reading_data()  # the task and backend names come from the folder's config: a plugin it names never runs
def open_trained(run_dir: Path, factor: int, n_samples: int, device_name: str = "auto",
                 task_params: Mapping[str, Any] | None = None) -> TrainedModel:
    """The trained run in ``run_dir`` with its task (or the variant ``task_params`` make of it) and
    the length L·``factor``, after checking the arguments (one-line ``UserError``). Like ``eval``,
    it imports no plugin file the folder's config names unless the user allows it
    (``--trust-plugins``): ``positions`` and ``heads`` load folders through this one gate."""
    if factor < 1 or n_samples < 1:
        raise UserError(f"factor and samples must be at least 1 (got factor {factor}, samples {n_samples})")
    check_power_of_two("factor", factor)
    if not (run_dir / "config.json").is_file():
        raise UserError(f"{run_dir} is not a run folder (it has no config.json): give one of a sweep's "
                        "runs/* folders or the folder `lengthgen run` wrote")
    run = load_saved_run(run_dir)
    length = run.config.train.train_length * factor
    check_sample_size(n_samples, length)
    device = resolve_device(device_name)
    task = variant_task(run.config, task_params)
    return TrainedModel(run, task, load_model(run, run.config, task.vocab.size, device), length, device)


def _fitting_state(run: SavedRun, config: RunConfig, model: Transformer) -> dict[str, Any]:
    """The saved weights, checked to be tensors of exactly the parameters of ``model``, with their
    shapes, saved for the run's own config (one-line error)."""
    path = run.run_dir / "model.pt"
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a truncated or foreign file: the user can only redo the run
        raise UserError(f"cannot load {path}: {exception_line(exc)}") from None
    state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
    if not isinstance(state, dict):
        raise UserError(f"{path} is not a lengthgen checkpoint (no state_dict of weights)")
    own = model.state_dict()
    missing, unexpected = sorted(set(own) - set(state)), sorted(set(state) - set(own))
    other = f" with backend {config.attn!r}" if config.attn != run.config.attn else ""
    problems = [*(f"missing {k}" for k in missing[:2]), *(f"unexpected {k}" for k in unexpected[:2])]
    for name, tensor in own.items():
        saved = state.get(name)
        if name in state and not isinstance(saved, torch.Tensor):
            problems.append(f"{name} is a {type(saved).__name__}, not a tensor")
        elif isinstance(saved, torch.Tensor) and saved.shape != tensor.shape:
            problems.append(f"{name} has shape {tuple(saved.shape)}, the model's is {tuple(tensor.shape)}")
    if problems:
        raise UserError(f"the weights in {path} do not fit the model{other} ({', '.join(problems[:3])})")
    saved_config = checkpoint.get("config")
    try:
        same = saved_config is None or \
            RunConfig.model_validate(saved_config).config_hash() == run.config.config_hash()
    except ValidationError:
        same = False
    if not same:
        raise UserError(f"{path} was saved for another config than {run.run_dir / 'config.json'}; "
                        "the folder mixes two runs")
    return state


def _identity(run: SavedRun, device: torch.device, params: int) -> dict[str, Any]:
    """The run columns of the new rows: copied from the run's own rows, else from its config."""
    rows = _quiet_rows(run.run_dir / "results.parquet")
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
def run_evaluation(plan: EvalPlan, factors: Sequence[int], *, device_name: str = "auto",
                   progress: bool = True, log: str | None = None) -> EvalOutcome:
    """Evaluate ``plan.run``'s model at L·f for every f in ``factors`` and merge the rows into its
    results after every length (Ctrl-C keeps the lengths done). An error at some length (e.g. out
    of memory, a plugin that calls ``sys.exit``) keeps the rows of the lengths before it and is
    returned, not raised, so the other runs of a sweep folder still get evaluated."""
    if not factors:
        return EvalOutcome(rows_to_frame([]))
    run, config = plan.run, plan.config
    device = resolve_device(device_name)
    task = get_task(config.task, **config.task_params)
    model = load_model(run, config, task.vocab.size, device)
    identity = _identity(run, device, model.num_parameters())
    rows: list[dict[str, Any]] = []
    outcome = EvalOutcome(rows_to_frame([]))
    tracker = open_tracker(log, run.run_dir, run.run_id, config.model_dump(mode="json"))
    try:
        for factor in factors:
            length = config.train.train_length * factor
            result = evaluate_length(model, task, length, factor, config.eval, device, progress=progress)
            rows.append({**identity, **length_row(result), "status": "ok", "error": None,
                         "eval_variant": plan.variant})
            outcome.rows = rows_to_frame(rows)
            outcome.written += [p for p in _save(run, outcome.rows.tail(1)) if p not in outcome.written]
            tracker.length(length, factor, {k: getattr(result, k) for k in EVAL_FIELDS}, plan.variant)
    except (Exception, torch.cuda.OutOfMemoryError, SystemExit) as exc:  # SystemExit: a plugin's exit
        if isinstance(exc, OSError):
            raise
        outcome.error = exception_line(exc)
    finally:
        tracker.close()
    if rows:
        results = _quiet_rows(run.run_dir / "results.parquet")
        if results is not None:
            plot_run(results, run.config, run.run_dir)
    return outcome
