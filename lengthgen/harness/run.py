"""One run end to end: build, train short, evaluate long, write the run folder.

The run folder holds ``config.json``, ``model.pt``, ``results.parquet`` (one row per evaluation
length), ``train_history.json`` (the learning curve) and ``accuracy_vs_length.png``. Every file is
written atomically; a failed run (NaN loss, out of memory, an exception) still writes its rows
with ``status = failed``.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch

import lengthgen
from lengthgen.config import RunConfig
from lengthgen.harness.evaluate import LengthResult, evaluate_length
from lengthgen.harness.plots import plot_accuracy_vs_length
from lengthgen.harness.results import rows_to_frame, write_parquet_atomic, write_text_atomic
from lengthgen.harness.train import TrainResult, train
from lengthgen.model import ModelConfig, Transformer
from lengthgen.tasks import get_task
from lengthgen.tasks.base import Task


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but CUDA is not available; valid devices here: auto, cpu")
    return torch.device(name)


def safe_name(text: str, max_length: int = 120) -> str:
    """A folder name for ``text``: no separators, never hidden, short enough for any filesystem.

    ``file.py:Class`` specs make run ids like ``./my/attn.py:Relu2-...``; a leading dot would hide
    the folder, and two long absolute paths could pass the 255-byte name limit, so long names keep
    their start plus a hash of the whole text (still unique).
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).lstrip("._").rstrip("_")
    if len(name) > max_length:
        name = f"{name[: max_length - 9]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return name


def build(config: RunConfig) -> tuple[Task, Transformer]:
    task = get_task(config.task, **config.task_params)
    model_config = ModelConfig(
        vocab_size=task.vocab.size, attn=config.attn, attn_options=config.attn_options,
        pos=config.pos, **config.arch.model_dump(),
    )
    return task, Transformer(model_config, seed=config.seed)


def _base_row(config: RunConfig, device: torch.device) -> dict[str, Any]:
    return {
        "run_id": safe_name(config.run_id()),
        "task": config.task,
        "attn": config.attn,
        "pos": config.pos,
        "seed": config.seed,
        "preset": config.preset,
        "train_length": config.train.train_length,
        "steps": config.train.steps,
        "selection": config.train.selection,
        "device": device.type,
        "lengthgen_version": lengthgen.__version__,
        "torch_version": torch.__version__,
        "config_hash": config.config_hash(),
        "config_json": config.canonical_json(),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def execute(
    config: RunConfig,
    out_dir: str | Path,
    device_name: str = "auto",
    progress: bool = True,
    on_length: Callable[[LengthResult], None] | None = None,
) -> pd.DataFrame:
    """Train and evaluate one configuration; returns (and writes) its result rows."""
    device = resolve_device(device_name)
    base = _base_row(config, device)
    run_dir = Path(out_dir) / base["run_id"]
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(json.dumps(config.model_dump(mode="json"), indent=2, sort_keys=True) + "\n",
                      run_dir / "config.json")
    torch.manual_seed(config.seed)  # only for anything a plugin draws from the global RNG
    rows: list[dict[str, Any]] = []
    trained: TrainResult | None = None
    try:
        task, model = build(config)
        model.to(device)
        base["params"] = model.num_parameters()
        trained = train(model, task, config, device, progress=progress)
        base.update(best_step=trained.best_step, train_seconds=trained.seconds,
                    val_exact_id=trained.val_exact_id, val_exact_8x=trained.val_exact_8x)
        write_text_atomic(json.dumps(trained.history, indent=1) + "\n", run_dir / "train_history.json")
        checkpoint = run_dir / ".model.pt.tmp"
        torch.save({"config": config.model_dump(mode="json"), "state_dict": model.state_dict()}, checkpoint)
        checkpoint.replace(run_dir / "model.pt")
        for factor in config.eval.factors():
            length = config.train.train_length * factor
            result = evaluate_length(model, task, length, factor, config.eval, device, progress=progress)
            rows.append({**base, **result.__dict__, "status": "ok", "error": None})
            if on_length is not None:
                on_length(result)
    except (Exception, torch.cuda.OutOfMemoryError) as exc:
        error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        (run_dir / "error.txt").write_text(traceback.format_exc())
        rows.append({**base, "status": "failed", "error": error,
                     "train_seconds": trained.seconds if trained else None})
    frame = rows_to_frame(rows)
    write_parquet_atomic(frame, run_dir / "results.parquet")
    if (frame["status"] == "ok").any():
        plot_accuracy_vs_length(frame, run_dir / "accuracy_vs_length.png",
                                title=f"{config.task}: {config.attn} ({config.pos}), seed {config.seed}")
    return frame
