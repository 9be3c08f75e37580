"""What the tests share: the Triton interpreter and one thread, then, as fixtures, the tiny run
(its settings, its command-line flags, its config, a tiny published sweep) and the check of a
one-line error. One home each, so a test states only what its own run changes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import torch

# Triton kernels run on CPU through the interpreter in tests; it must be chosen before triton is
# imported. An explicit setting (or a CUDA machine) wins.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The models in tests are tiny: one thread is faster than two, and far faster on a busy 2-core box.
torch.set_num_threads(1)

#: The model and batches of a tiny run: it trains and evaluates in seconds on a shared 2-core CPU.
TINY_MODEL: dict[str, Any] = {"train.batch_size": 8, "train.val_samples": 8, "arch.d_model": 32,
                              "arch.d_ff": 64}
#: How long the usual tiny run trains, and how far it is evaluated (1× and 2×).
TINY_RUN: dict[str, Any] = {"train.steps": 4, "train.val_every": 2, "train.train_length": 6,
                            "eval.samples": 8, "eval.min_samples": 4, "eval.max_factor": 2}
#: A tiny max_retrieval run that learns: what the checks of training itself need.
LEARNING_RUN: dict[str, Any] = {
    "arch.n_layers": 2, "arch.d_model": 32, "arch.n_heads": 4, "arch.d_ff": 64,
    "train.steps": 150, "train.batch_size": 32, "train.lr": 3e-3, "train.warmup_steps": 10,
    "train.train_length": 6, "train.val_every": 75, "train.val_samples": 64,
    "eval.max_factor": 2, "eval.samples": 32, "eval.min_samples": 8,
}
LEARNING_TASK: dict[str, Any] = {"n_priorities": 6, "n_classes": 3}
#: The settings the command line has a short flag for.
SHORT_FLAGS = {"train.steps": "--steps", "eval.max_factor": "--max-factor", "eval.samples": "--eval-samples",
               "train.train_length": "--train-length"}


def _settings(run: Mapping[str, Any] = TINY_RUN) -> dict[str, Any]:
    return {**TINY_MODEL, **run}


def _flags(run: Mapping[str, Any] = TINY_RUN) -> list[str]:
    settings = _settings(run)
    short = [f for name, flag in SHORT_FLAGS.items() if name in settings for f in (flag, str(settings[name]))]
    sets = [f for name, value in settings.items() if name not in SHORT_FLAGS
            for f in ("--set", f"{name}={value}")]
    return [*short, *sets, "--quiet"]


def _config(task: str = "copy", attn: str = "softmax", *, run: Mapping[str, Any] = TINY_RUN, seed: int = 0,
            task_params: Mapping[str, Any] | None = None, **changes: Any) -> Any:
    from lengthgen.config import build_run_config

    return build_run_config(task, attn, seed=seed, task_params=task_params,
                            overrides={**_settings(run), **changes})


def _one_line_error(result: Any, expected: str, *, silent: bool = False) -> None:
    """Exit code 2 and exactly one line on stderr, ``error: …`` containing ``expected``; ``silent``:
    nothing on stdout either. ``result`` is a CliRunner result or a finished subprocess."""
    code = result.returncode if isinstance(result, subprocess.CompletedProcess) else result.exit_code
    lines = result.stderr.strip().splitlines()
    assert code == 2, result.stderr if isinstance(result, subprocess.CompletedProcess) else result.output
    if silent:
        assert result.stdout == "", result.stdout
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], lines


@pytest.fixture(scope="session")
def tiny_settings() -> Callable[..., dict[str, Any]]:
    """``tiny_settings(run=TINY_RUN)``: the tiny model's settings with ``run``'s (dotted names)."""
    return _settings


@pytest.fixture(scope="session")
def tiny_flags() -> Callable[..., list[str]]:
    """``tiny_flags(run=TINY_RUN)``: the same settings as ``run``/``sweep`` flags, and --quiet."""
    return _flags


@pytest.fixture(scope="session")
def tiny_config() -> Callable[..., Any]:
    """``tiny_config(task="copy", attn="softmax", *, run=TINY_RUN, seed, task_params, **changes)``:
    the checked config of a tiny run (``changes`` are dotted settings: ``**{"train.lr": 1e-3}``)."""
    return _config


@pytest.fixture(scope="session")
def learning_config() -> Callable[..., Any]:
    """``learning_config(attn, seed=0, **changes)``: a tiny max_retrieval run that learns."""

    def config(attn: str, seed: int = 0, **changes: Any) -> Any:
        return _config("max_retrieval", attn, run=LEARNING_RUN, seed=seed, task_params=LEARNING_TASK,
                       **changes)

    return config


@pytest.fixture(scope="session")
def tiny_sweep() -> Callable[[Path], Path]:
    """``tiny_sweep(out)``: a sweep of two tiny flip_flop runs (softmax, entmax) under ``out``, as a
    colleague would publish it."""

    def sweep(out: Path) -> Path:
        from typer.testing import CliRunner

        from lengthgen.cli import app

        run = {"train.steps": 6, "eval.max_factor": 2, "eval.samples": 8, "train.val_every": 3}
        flags = ["--task", "flip_flop", "--attn", "softmax,entmax", "--out", str(out), *_flags(run)]
        made = CliRunner().invoke(app, ["sweep", *flags])
        assert made.exit_code == 0, made.output
        return out

    return sweep


@pytest.fixture(scope="session")
def one_line_error() -> Callable[..., None]:
    """``one_line_error(result, expected, silent=False)``: the command failed as a user error should."""
    return _one_line_error
