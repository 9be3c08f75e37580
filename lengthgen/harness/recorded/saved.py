"""A saved run: a run folder with a trained model, found, loaded once and checked before use.

A run folder keeps ``config.json`` (the recipe) and ``model.pt`` (the selected weights), and may
keep the weights every so many steps (``checkpoints/``, ``harness.weights``). It may
come from someone else, so it must say what it holds before anything runs: its ``config.json``
must hash to the folder's run id, its results must be that run's, and ``model.pt`` must hold
weights of exactly the model a config builds (names and shapes), saved for the run's own config.
A plugin file named by the config is not imported unless the user allows it
(``lengthgen.registry.reading_data``). Every problem is a one-line ``UserError``.

Everything that reads a saved run goes through here: ``lengthgen eval`` (``reevaluate``), plans
extending their runs, and the probes of one length (``positions``, ``heads``: :func:`open_trained`).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from lengthgen.choices import Precision
from lengthgen.config import RunConfig, config_hash_of, parse_json, parse_value, validation_message
from lengthgen.errors import UserError, UserNotice, exception_line
from lengthgen.files import read_text
from lengthgen.harness.devices import resolve_device
from lengthgen.harness.storage.identity import run_id_of
from lengthgen.harness.storage.results import recorded_run_ids
from lengthgen.harness.weights import MODEL_FILE, checkpoint_path, kept_steps
from lengthgen.limits import MAX_TEXT_BYTES, check_power_of_two, check_sample_size
from lengthgen.model import Transformer
from lengthgen.registry import reading_data
from lengthgen.tasks import get_task
from lengthgen.tasks.base import Task

__all__ = ["SavedRun", "TaskVariant", "TrainedModel", "changed_task_params", "find_saved_runs",
           "fitting_state", "load_model", "load_saved_run", "open_trained", "sweep_data_file",
           "sweep_data_path", "task_variant", "variant_label"]


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

    @cached_property
    def state(self) -> dict[str, Any]:
        """The weights in ``model.pt``, read once however often the run is planned and evaluated,
        and memory-mapped (a sweep folder's plans hold every run's without holding its memory);
        checked to be a lengthgen checkpoint saved for this run's config."""
        return self._read_weights(self.run_dir / MODEL_FILE)

    def weights(self, checkpoint: int | None = None) -> dict[str, Any]:
        """The selected weights (``model.pt``), or those the run kept after ``checkpoint`` steps
        (``train.keep_every``); a step it did not keep is a one-line ``UserError`` naming those it did."""
        if checkpoint is None:
            return self.state
        path = checkpoint_path(self.run_dir, checkpoint)
        if not path.is_file():
            kept = kept_steps(self.run_dir)
            choices = (f"choose one of {', '.join(map(str, kept))}" if kept else "it keeps none (train "
                       "with --set train.keep_every=N to keep the weights every N steps)")
            raise UserError(f"{self.run_dir} kept no checkpoint at step {checkpoint}; {choices}")
        return self._read_weights(path)

    def weights_file(self, checkpoint: int | None = None) -> Path:
        """The file :meth:`weights` reads."""
        return self.run_dir / MODEL_FILE if checkpoint is None else checkpoint_path(self.run_dir, checkpoint)

    def _read_weights(self, path: Path) -> dict[str, Any]:
        try:
            checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # a truncated or foreign file: the user can only redo the run
            raise UserError(f"cannot load {path}: {exception_line(exc)}") from None
        state = checkpoint.get("state_dict") if isinstance(checkpoint, dict) else None
        if not isinstance(state, dict):
            raise UserError(f"{path} is not a lengthgen checkpoint (no state_dict of weights)")
        saved_config = checkpoint.get("config")
        try:
            same = saved_config is None or \
                RunConfig.model_validate(saved_config).config_hash() == self.config.config_hash()
        except ValidationError:
            same = False
        if not same:
            raise UserError(f"{path} was saved for another config than {self.run_dir / 'config.json'}; "
                            "the folder mixes two runs")
        return state


def load_saved_run(run_dir: Path, checkpoint: int | None = None) -> SavedRun:
    """The run in ``run_dir``, checked to be what its name says (one-line ``UserError`` if not).
    With ``checkpoint`` (the weights it kept after that many steps), the run may still be training:
    its selected weights (``model.pt``) are not needed."""
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
    if checkpoint is None and not (run_dir / MODEL_FILE).is_file():
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


def find_saved_runs(path: str | Path, checkpoint: int | None = None) -> list[SavedRun]:
    """The run at ``path`` (a run folder), or every trained run of a sweep folder (``runs/*``);
    runs of a sweep that cannot be used (no model, an edited config) are skipped with a warning.
    ``checkpoint``: kept weights will be read, so runs still training count (``load_saved_run``)."""
    root = Path(path)
    if not root.is_dir() and sweep_data_file(root) is not None:
        raise UserError(f"{str(path)!r} does not exist, but its sweep's data records the run: the data files "
                        "carry no models; --restore trains it again from its recorded config")
    if not root.is_dir():
        raise UserError(f"{str(path)!r} is not a folder: give a run folder (config.json, model.pt) "
                        "or a sweep folder (runs/, data/)")
    if (root / "config.json").is_file():
        return [load_saved_run(root, checkpoint)]
    if not (root / "runs").is_dir():
        raise UserError(f"{str(path)!r} is neither a run folder (no config.json) nor a sweep folder "
                        "(no runs/)")
    runs = []
    for run_dir in sorted(d for d in (root / "runs").iterdir() if (d / "config.json").is_file()):
        try:
            runs.append(load_saved_run(run_dir, checkpoint))
        except UserError as exc:
            warnings.warn(f"skipped {run_dir}: {exc}", UserNotice, stacklevel=2)
    if not runs:
        raise UserError(f"no trained runs under {str(root / 'runs')!r}")
    return runs


# -- the run's task, or a variant of it ------------------------------------------------------------
def variant_label(changed: Mapping[str, Any]) -> str:
    """``k=v,k2=v2`` in the ``--param`` syntax (sorted; values as they would be typed)."""

    def typed(value: Any) -> str:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"))
        return value if isinstance(value, str) and parse_value(value) == value else text

    return ",".join(f"{key}={typed(value)}" for key, value in sorted(changed.items()))


@dataclass(frozen=True)
class TaskVariant:
    """The task a run trained on and the one it is tested on (the same one without parameters),
    each built once, and the task parameters that differ, as a variant label names them."""

    trained: Task
    evaluated: Task
    changed: dict[str, Any]


def task_variant(config: RunConfig, task_params: Mapping[str, Any] | None) -> TaskVariant:
    """The run's task with ``task_params`` set on top of its own; a change of vocabulary is refused:
    the saved model could not read it."""
    trained = get_task(config.task, **config.task_params)
    if not task_params:
        return TaskVariant(trained, trained, {})
    evaluated = get_task(config.task, **{**config.task_params, **task_params})
    if evaluated.vocab.tokens != trained.vocab.tokens:
        raise UserError(f"--param {variant_label(task_params)} changes the task's vocabulary "
                        f"({trained.vocab.size} → {evaluated.vocab.size} tokens); the saved model cannot "
                        "read it")
    before, after = trained.config.model_dump(mode="json"), evaluated.config.model_dump(mode="json")
    return TaskVariant(trained, evaluated, {k: v for k, v in after.items() if before.get(k) != v})


def changed_task_params(config: RunConfig, task_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """The task parameters an evaluation with ``task_params`` changes, as the variant names them."""
    return task_variant(config, task_params).changed


# -- the weights -----------------------------------------------------------------------------------
def fitting_state(run: SavedRun, config: RunConfig, model: Transformer,
                  checkpoint: int | None = None) -> dict[str, Any]:
    """The saved weights (the selected ones, or a kept checkpoint's), checked to be tensors of
    exactly the parameters of ``model`` (built from ``config``: the run's, or an evaluation's with
    another backend), with their shapes."""
    state = run.weights(checkpoint)
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
        path = run.weights_file(checkpoint)
        raise UserError(f"the weights in {path} do not fit the model{other} ({', '.join(problems[:3])})")
    return state


def load_model(run: SavedRun, config: RunConfig, vocab_size: int, device: str | torch.device,
               precision: Precision = "fp32", checkpoint: int | None = None) -> Transformer:
    """The run's weights (selected, or kept after ``checkpoint`` steps) in a model built from
    ``config`` (the run's, or an evaluation variant's), cast to bfloat16 for ``precision="bf16"``."""
    model = Transformer(config.model(vocab_size), seed=config.seed)
    model.load_state_dict(fitting_state(run, config, model, checkpoint))
    model = model.to(resolve_device(device)).eval()
    return model.to(torch.bfloat16) if precision == "bf16" else model


@dataclass(frozen=True)
class TrainedModel:
    """A saved run's model, loaded to be probed at one length (``lengthgen positions``, ``heads``)."""

    run: SavedRun
    tasks: TaskVariant
    model: Transformer
    length: int
    device: torch.device

    @property
    def task(self) -> Task:
        """The task the model is probed on (the run's own, or the variant asked for)."""
        return self.tasks.evaluated


@reading_data()  # the task and backend names come from the folder's config: a plugin it names never runs
def open_trained(run_dir: Path, factor: int, n_samples: int, device: str | torch.device = "auto",
                 task_params: Mapping[str, Any] | None = None, checkpoint: int | None = None) -> TrainedModel:
    """The trained run in ``run_dir`` with its task (or the variant ``task_params`` make of it) and
    the length L·``factor``, after checking the arguments (one-line ``UserError``). Like ``eval``,
    it imports no plugin file the folder's config names unless the user allows it
    (``--trust-plugins``): ``positions`` and ``heads`` load folders through this one gate.
    ``checkpoint``: the weights the run kept after that many steps instead of the selected ones."""
    if factor < 1 or n_samples < 1:
        raise UserError(f"factor and samples must be at least 1 (got factor {factor}, samples {n_samples})")
    check_power_of_two("factor", factor)
    if not (run_dir / "config.json").is_file():
        raise UserError(f"{run_dir} is not a run folder (it has no config.json): give one of a sweep's "
                        "runs/* folders or the folder `lengthgen run` wrote")
    run = load_saved_run(run_dir, checkpoint)
    length = run.config.train.train_length * factor
    check_sample_size(n_samples, length)
    where = resolve_device(device)
    tasks = task_variant(run.config, task_params)
    model = load_model(run, run.config, tasks.evaluated.vocab.size, where, checkpoint=checkpoint)
    return TrainedModel(run, tasks, model, length, where)
