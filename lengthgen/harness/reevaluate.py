"""Evaluate saved models again: at more lengths, or on a variant of their task, without retraining.

A run folder keeps what this needs: ``config.json`` (the recipe) and ``model.pt`` (the selected
weights). The evaluation goes through the same ``build_run_config`` and ``evaluate_length`` as a
fresh run, so a length added later gets exactly the row a run with the larger ``max_factor``
would have written. New rows keep the run's identity (``run_id``, ``config_hash``,
``config_json``: the model is the same) and say what was evaluated in ``eval_variant``: empty
for the training task, else the task parameters that differ (``eval_variant=sparse``) and the
backend or backend options the same weights were evaluated with (``attn=softmax``). They are
merged into the run's ``results.parquet`` and, inside a sweep folder, into its
``data/<run_id>.parquet``: a row with the same (run, length, variant) is replaced, never
duplicated, and each file is rewritten atomically.
"""

from __future__ import annotations

import datetime as dt
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from pydantic import ValidationError

import lengthgen
from lengthgen import provenance
from lengthgen.config import RunConfig, build_run_config, dotted, parse_value, validation_message
from lengthgen.errors import UserError, UserNotice
from lengthgen.harness.evaluate import evaluate_length
from lengthgen.harness.results import conform, read_results_file, rows_to_frame, write_parquet_atomic
from lengthgen.harness.run import base_row, length_row, plot_run, resolve_device, safe_name
from lengthgen.harness.tracking import EVAL_FIELDS, open_tracker
from lengthgen.model import Transformer
from lengthgen.tasks import get_task

#: A row is replaced by a new one with the same values here.
ROW_KEY: tuple[str, ...] = ("run_id", "eval_length", "eval_variant")
#: Columns that describe the trained run, copied from its existing rows into the new ones.
RUN_COLUMNS: tuple[str, ...] = ("run_id", "task", "attn", "pos", "seed", "preset", "train_length", "steps",
                                "best_step", "selection", "val_exact_id", "val_exact_8x", "params",
                                "train_seconds", "config_hash", "config_json")


@dataclass(frozen=True)
class SavedRun:
    """A run folder with a trained model; ``data_file`` is its sweep's data file, if any."""

    run_dir: Path
    run_id: str
    config: RunConfig
    data_file: Path | None


def load_saved_run(run_dir: Path) -> SavedRun:
    try:
        config = RunConfig.model_validate_json((run_dir / "config.json").read_text(encoding="utf-8"))
    except ValidationError as exc:
        raise UserError(validation_message(exc, f"{run_dir / 'config.json'} is not a lengthgen run config")) \
            from None
    if not (run_dir / "model.pt").is_file():
        raise UserError(f"{run_dir} has no model.pt: the run failed or stopped before training ended; "
                        "run it again")
    run_id = safe_name(config.run_id())
    data_file = run_dir.parent.parent / "data" / f"{run_id}.parquet"
    in_sweep = run_dir.parent.name == "runs" and data_file.is_file()
    return SavedRun(run_dir, run_id, config, data_file if in_sweep else None)


def find_saved_runs(path: str | Path) -> list[SavedRun]:
    """The run at ``path`` (a run folder), or every trained run of a sweep folder (``runs/*``);
    runs without a model in a sweep are skipped with a warning."""
    root = Path(path)
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


def variant_label(changed: Mapping[str, Any]) -> str:
    """``k=v,k2=v2`` in the ``--param`` syntax (sorted; values as they would be typed)."""

    def typed(value: Any) -> str:
        return value if isinstance(value, str) and parse_value(value) == value else json_text(value)

    return ",".join(f"{key}={typed(value)}" for key, value in sorted(changed.items()))


def json_text(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class EvalPlan:
    run: SavedRun
    config: RunConfig  # the run's config with the evaluation's settings
    variant: str
    factors: list[int]
    missing_factors: list[int]


def plan_evaluation(run: SavedRun, *, max_factor: int | None = None, eval_samples: int | None = None,
                    task_params: Mapping[str, Any] | None = None, attn: str | None = None,
                    attn_options: Mapping[str, Any] | None = None) -> EvalPlan:
    """What evaluating ``run`` with these settings means, checked before any model is loaded.

    ``attn`` / ``attn_options`` evaluate the same weights with another normalizer or other
    backend options (an ablation, e.g. adaptive temperature without its inference-time
    sharpening: ``attn="softmax"``); the weights must fit the other backend's parameters.
    """
    base = run.config
    overrides = dotted(base)
    if max_factor is not None:
        overrides["eval.max_factor"] = max_factor
    if eval_samples is not None:
        overrides["eval.samples"] = eval_samples
        overrides["eval.min_samples"] = min(base.eval.min_samples, eval_samples)
    params = {**base.task_params, **(task_params or {})}
    eval_attn = attn or base.attn
    options = dict(base.attn_options) if eval_attn == base.attn else {}
    options.update(attn_options or {})
    config = build_run_config(base.task, eval_attn, pos=base.pos, preset=base.preset, seed=base.seed,
                              task_params=params, attn_options=options, overrides=overrides)
    trained, evaluated = get_task(base.task, **base.task_params), get_task(base.task, **params)
    if evaluated.vocab.tokens != trained.vocab.tokens:
        raise UserError(f"--param {variant_label(task_params or {})} changes the task's vocabulary "
                        f"({trained.vocab.size} → {evaluated.vocab.size} tokens); the saved model cannot "
                        "read it")
    before, after = trained.config.model_dump(mode="json"), evaluated.config.model_dump(mode="json")
    changed = {k: v for k, v in after.items() if before.get(k) != v}
    if config.attn != base.attn:
        changed["attn"] = config.attn
    changed.update({f"attn.{k}": v for k, v in config.attn_options.items()
                    if config.attn != base.attn or base.attn_options.get(k) != v})
    variant = variant_label(changed)
    if config.attn != base.attn or config.attn_options != base.attn_options:
        _fitting_state(run, config, Transformer(config.model(evaluated.vocab.size), seed=config.seed))
    factors = config.eval.factors()
    done = _evaluated_factors(run, variant)
    return EvalPlan(run, config, variant, factors, [f for f in factors if f not in done])


def _existing_rows(path: Path | None) -> pd.DataFrame | None:
    if path is None or not path.is_file():
        return None
    return read_results_file(path)


def _evaluated_factors(run: SavedRun, variant: str) -> set[int]:
    """Factors with an ok row for ``variant`` in the run's results and (in a sweep) its data file."""
    found: set[int] | None = None
    for path in (run.run_dir / "results.parquet", run.data_file):
        if path is None:
            continue
        rows = _existing_rows(path)
        ok = set() if rows is None else {
            int(f) for f, s, v in zip(rows["factor"], rows["status"], rows["eval_variant"], strict=True)
            if s == "ok" and v == variant and not pd.isna(f)
        }
        found = ok if found is None else found & ok
    return found or set()


def merge_rows(existing: pd.DataFrame | None, new: pd.DataFrame) -> pd.DataFrame:
    """``existing`` with ``new`` added: rows of ``existing`` with a (run, length, variant) of a new
    row are dropped; the result is sorted by variant, then factor (failed rows without a length
    last)."""
    if existing is None or existing.empty:
        combined = new
    else:
        replaced = {tuple(_key_value(v) for v in row) for row in new[list(ROW_KEY)].itertuples(index=False)}
        keep = [tuple(_key_value(v) for v in row) not in replaced
                for row in existing[list(ROW_KEY)].itertuples(index=False)]
        combined = pd.concat([existing[keep], new], ignore_index=True)
    order = combined.sort_values(["eval_variant", "factor"], kind="mergesort", na_position="last").index
    return conform(combined.loc[order].reset_index(drop=True))


def _key_value(value: Any) -> Any:
    if isinstance(value, float) and not math.isnan(value) and value.is_integer():
        return int(value)
    return value


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


def _fitting_state(run: SavedRun, config: RunConfig, model: Transformer) -> dict[str, Any]:
    """The saved weights, checked to name exactly the parameters of ``model`` (one-line error)."""
    path = run.run_dir / "model.pt"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    except Exception as exc:  # a truncated file: the user can only redo the run
        raise UserError(f"cannot load {path}: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    own = set(model.state_dict())
    missing, unexpected = sorted(own - set(state)), sorted(set(state) - own)
    if missing or unexpected:
        detail = ", ".join([*(f"missing {k}" for k in missing[:2]),
                            *(f"unexpected {k}" for k in unexpected[:2])])
        other = f" with backend {config.attn!r}" if config.attn != run.config.attn else ""
        raise UserError(f"the weights in {path} do not fit the model{other} ({detail})")
    return state


def _identity(run: SavedRun, device: torch.device, params: int) -> dict[str, Any]:
    """The run columns of the new rows: copied from the run's own rows, else from its config."""
    rows = _existing_rows(run.run_dir / "results.parquet")
    if rows is not None and not rows.empty:
        first = rows.iloc[0]
        row = {column: first[column] for column in RUN_COLUMNS}
    else:
        row = {k: v for k, v in base_row(run.config, device).items() if k in RUN_COLUMNS}
        row["params"] = params
    return {**row, "device": device.type, "lengthgen_version": lengthgen.__version__,
            "torch_version": torch.__version__, **provenance.software(),
            "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}


def run_evaluation(plan: EvalPlan, factors: Sequence[int], *, device_name: str = "auto",
                   progress: bool = True, log: str | None = None) -> EvalOutcome:
    """Evaluate ``plan.run``'s model at L·f for every f in ``factors`` and merge the rows into its
    results. An error at some length (e.g. out of memory) keeps the rows of the lengths before it
    and is returned, not raised, so the other runs of a sweep folder still get evaluated."""
    if not factors:
        return EvalOutcome(rows_to_frame([]))
    run, config = plan.run, plan.config
    device = resolve_device(device_name)
    task = get_task(config.task, **config.task_params)
    model = load_model(run, config, task.vocab.size, device)
    identity = _identity(run, device, model.num_parameters())
    rows: list[dict[str, Any]] = []
    error = None
    tracker = open_tracker(log, run.run_dir, run.run_id, config.model_dump(mode="json"))
    try:
        for factor in factors:
            length = config.train.train_length * factor
            result = evaluate_length(model, task, length, factor, config.eval, device, progress=progress)
            rows.append({**identity, **length_row(result), "status": "ok", "error": None,
                         "eval_variant": plan.variant})
            tracker.length(length, factor, {k: getattr(result, k) for k in EVAL_FIELDS}, plan.variant)
    except (Exception, torch.cuda.OutOfMemoryError) as exc:
        if isinstance(exc, OSError):
            raise
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    finally:
        tracker.close()
    new = rows_to_frame(rows)
    outcome = EvalOutcome(new, error=error)
    if rows:
        for path in (run.run_dir / "results.parquet", run.data_file):
            if path is not None:
                merged = merge_rows(_existing_rows(path), new)
                outcome.written.append(write_parquet_atomic(merged, path))
                if path.parent == run.run_dir:
                    plot_run(merged, run.config, run.run_dir)
    return outcome
