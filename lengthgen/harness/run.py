"""One run end to end: build, train short, evaluate long, write the run folder.

The run folder holds ``config.json``, ``model.pt``, ``results.parquet`` (one row per evaluation
length), ``train_history.json`` (the learning curve) and ``accuracy_vs_length.png``, and with
``train.keep_every`` the weights every so many steps (``checkpoints/``, ``harness.weights``); until it has
evaluated every length, also ``train_state.pt``, from which a stopped run resumes
(``lengthgen.harness.resume``): one stopped while it evaluated keeps the lengths it finished and
evaluates the rest, without training again. Every file is
written atomically (``lengthgen.files``); a failed run (NaN loss, out of memory, an exception, a
plugin that calls ``sys.exit``) still writes its rows with ``status = failed`` and its traceback in
``error.txt``, which a later successful run of the same config removes. The rows are saved after
every evaluated length (``lengthgen.harness.storage.store``), merged with rows that ``lengthgen eval``
adds meanwhile; the run replaces only its own training-task rows.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from lengthgen.config import RunConfig
from lengthgen.errors import exception_line
from lengthgen.files import atomic_write, new_folder
from lengthgen.harness.devices import resolve_device
from lengthgen.harness.evaluate import LengthResult, evaluate_length
from lengthgen.harness.plots import plot_accuracy_vs_length
from lengthgen.harness.resume import STATE_FILE
from lengthgen.harness.storage.identity import backend_package, made_now, run_columns
from lengthgen.harness.storage.results import rows_to_frame
from lengthgen.harness.storage.store import current_rows, kept_rows, run_lock, save_rows
from lengthgen.harness.tracking import EVAL_FIELDS, Tracker, open_tracker
from lengthgen.harness.train import TrainResult, train
from lengthgen.harness.weights import MODEL_FILE, save_weights
from lengthgen.model import Transformer
from lengthgen.progress import Shown, format_seconds, log_line
from lengthgen.tasks import get_task
from lengthgen.tasks.base import Task


def build(config: RunConfig) -> tuple[Task, Transformer]:
    """The task and the untrained model of ``config``: the same weights in every process. The model
    draws its own layers from a private generator; a plugin backend's parameters (FoX's gates) come
    from torch's global one, seeded here with the run's seed, so every caller gets them alike."""
    task = get_task(config.task, **config.task_params)
    torch.manual_seed(config.seed)
    return task, Transformer(config.model(task.vocab.size), seed=config.seed)


def config_text(config: RunConfig) -> str:
    """``config.json``: the full config, readable (the canonical JSON is in every results row)."""
    return json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def record_failure(run_dir: Path, exc: BaseException) -> str:
    """``error.txt`` gets the traceback; returns the one-line error for the results row."""
    atomic_write(run_dir / "error.txt", "".join(traceback.format_exception(exc)))
    return exception_line(exc)


def length_row(result: LengthResult) -> dict[str, Any]:
    """The per-length columns of a results row."""
    return dict(result.__dict__)


def plot_run(frame: pd.DataFrame, config: RunConfig, run_dir: Path) -> None:
    """``accuracy_vs_length.png`` of the training task's rows (none yet: no figure)."""
    training = frame[frame["eval_variant"] == ""]
    if (training["status"] == "ok").any():
        plot_accuracy_vs_length(training, run_dir / "accuracy_vs_length.png",
                                title=f"{config.task}: {config.attn} ({config.pos}), seed {config.seed}")


def base_row(config: RunConfig, device: torch.device) -> dict[str, Any]:
    """The columns every row of this run shares: the run, the device, the code (the backend's
    package included)."""
    return {**run_columns(config), "device": device.type, **made_now(),
            "attn_package": backend_package(config.attn)}


def execute(
    config: RunConfig,
    out_dir: str | Path,
    device: str | torch.device = "auto",
    progress: Shown = True,
    on_length: Callable[[LengthResult], None] | None = None,
    log: str | None = None,
) -> pd.DataFrame:
    """Train and evaluate one configuration; returns (and writes) its result rows.

    ``log`` names a tracker (``tensorboard``, ``wandb``) that receives the learning curve and the
    per-length results. A file-system error while writing (no space left, no permission) is
    raised; folders this call created are removed again if they are still empty.
    """
    where = resolve_device(device)
    base = base_row(config, where)
    with new_folder(Path(out_dir) / base["run_id"]) as run_dir:
        # the tracker first: one that cannot start leaves no run folder behind (open_tracker
        # removes what it made; new_folder the folders left empty)
        tracker = open_tracker(log, run_dir, base["run_id"], config.model_dump(mode="json"))
        try:
            atomic_write(run_dir / "config.json", config_text(config))
            (run_dir / "error.txt").unlink(missing_ok=True)  # a stale report of an earlier failure
            return _train_and_evaluate(config, run_dir, base, where, progress, on_length, tracker)
        finally:
            tracker.close()


def evaluate_lengths(model: Transformer, task: Task, config: RunConfig, factors: Sequence[int],
                     device: torch.device, base: Mapping[str, Any], rows: list[dict[str, Any]],
                     save: Callable[[list[dict[str, Any]]], object], tracker: Tracker, *, progress: Shown,
                     variant: str = "", on_length: Callable[[LengthResult], None] | None = None) -> None:
    """Evaluate ``model`` at L·f for every f in ``factors``: the one loop over lengths, of a run and
    of ``lengthgen eval``. Each length's row (``base``, its numbers, ``variant``) is appended to
    ``rows`` and ``save`` gets the rows at once, so an interruption or an error at a later length
    keeps the lengths done; the tracker and ``on_length`` hear of each length."""
    for factor in factors:
        length = config.train.train_length * factor
        result = evaluate_length(model, task, length, factor, config.eval, device, progress=progress)
        rows.append({**base, **length_row(result), "status": "ok", "error": None, "eval_variant": variant})
        save(rows)
        tracker.length(length, factor, {k: getattr(result, k) for k in EVAL_FIELDS}, variant)
        log_line(length_line(str(base["run_id"]), result, variant), progress)
        if on_length is not None:
            on_length(result)


def length_line(run_id: str, result: LengthResult, variant: str = "") -> str:
    """One evaluated length for a log: ``eval RUN: 1024x (length 65,536): 3.1% exact match over 64
    samples in 28 min``."""
    on = f" [{variant}]" if variant else ""
    return (f"eval {run_id}{on}: {result.factor}x (length {result.eval_length:,}): "
            f"{100 * result.exact_match:.1f}% exact match over {result.n_samples} samples "
            f"in {format_seconds(result.eval_seconds)}")


def save_training_rows(run_dir: Path, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The run's training-task rows so far into its ``results.parquet`` (replacing the ones an
    earlier attempt left; rows of evaluation variants stay); returns what the file holds."""
    with run_lock(run_dir):
        return save_rows(run_dir / "results.parquet", rows_to_frame(rows), replace_variant="")


def _evaluated_rows(run_dir: Path, config_hash: str) -> list[dict[str, Any]]:
    """The lengths this attempt evaluated before it was stopped: its ok training rows of the same
    config."""
    with run_lock(run_dir):
        mine = kept_rows(current_rows(run_dir / "results.parquet"), config_hash)
    return [] if mine is None else mine.to_dict("records")


def _train_and_evaluate(
    config: RunConfig, run_dir: Path, base: dict[str, Any], device: torch.device, progress: Shown,
    on_length: Callable[[LengthResult], None] | None, tracker: Tracker,
) -> pd.DataFrame:
    state_path = run_dir / STATE_FILE
    if not state_path.is_file() and (run_dir / "results.parquet").is_file():
        save_training_rows(run_dir, [])  # a new attempt: training rows an earlier one left are not its own
    rows: list[dict[str, Any]] = []
    trained: TrainResult | None = None
    try:
        task, model = build(config)
        model.to(device)
        base["params"] = model.num_parameters()
        trained = train(model, task, config, device, progress=progress, tracker=tracker,
                        state_path=state_path, keep_dir=run_dir)
        base.update(best_step=trained.best_step, train_seconds=trained.seconds,
                    val_exact_id=trained.val_exact_id, val_exact_8x=trained.val_exact_8x)
        atomic_write(run_dir / "train_history.json", json.dumps(trained.history, indent=1) + "\n")
        save_weights(model, config, run_dir / MODEL_FILE)
        if trained.resumed_at == config.train.steps:  # stopped while it evaluated: keep its lengths
            rows.extend(_evaluated_rows(run_dir, base["config_hash"]))
        if rows:  # the rows still to come state the training time the kept ones do
            base["train_seconds"] = rows[0]["train_seconds"]
        done = {row["factor"] for row in rows}
        if done:
            log_line(f"eval {base['run_id']}: {', '.join(f'{f}x' for f in sorted(done))} kept from the "
                     f"stopped attempt", progress)
        evaluate_lengths(model, task, config, [f for f in config.eval.factors() if f not in done], device,
                         base, rows, lambda done: save_training_rows(run_dir, done), tracker,
                         progress=progress, on_length=on_length)
        state_path.unlink(missing_ok=True)  # evaluated: a rerun starts over, as its config asks
    except (Exception, torch.cuda.OutOfMemoryError, SystemExit) as exc:  # SystemExit: a plugin's exit
        if isinstance(exc, OSError):
            raise  # the disk, not the run: nothing more can be written
        state_path.unlink(missing_ok=True)  # a retry starts over (and fails alike)
        rows.append({**base, "status": "failed", "error": record_failure(run_dir, exc),
                     "train_seconds": trained.seconds if trained else None})
    saved = save_training_rows(run_dir, rows)
    plot_run(saved, config, run_dir)
    return rows_to_frame(rows)
