"""Experiment trackers: stream a run's learning curve and per-length results to TensorBoard or W&B.

``--log tensorboard`` writes event files under the run folder (``<run>/tensorboard/``) through
``torch.utils.tensorboard``; ``--log wandb`` logs through ``wandb`` into a run named like the run
id (``WANDB_MODE=offline`` and the other ``WANDB_*`` variables are honoured, the files go under
``<run>/wandb/``). Both packages are optional (``pip install 'lengthgen[track]'``).

What is logged, under the same names for both:

- ``train/loss``, ``train/lr`` against the training step (every 10 steps and the last);
- ``val/<metric>`` (e.g. ``val/exact_match``) at every validation, against the step;
- ``eval/exact_match``, ``eval/exact_match_lo``, ``eval/exact_match_hi``, ``eval/token_accuracy``,
  ``eval/attn_entropy``, ``eval/attn_support`` against the evaluation length (in W&B the x
  axis is the metric ``length``, and ``eval/factor`` is logged too). Rows of an evaluation
  variant (``lengthgen eval --param``) get their own prefix, e.g.
  ``eval[eval_variant=sparse]/exact_match``.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lengthgen.choices import TRACKERS
from lengthgen.errors import UserError, exception_line

#: The package each tracker needs (all in the ``track`` extra).
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
#: Per-length fields of an evaluation result that are logged.
EVAL_FIELDS: tuple[str, ...] = ("exact_match", "exact_match_lo", "exact_match_hi", "token_accuracy",
                                "attn_entropy", "attn_support")


class TrackerError(UserError):
    """A tracker that cannot start: every run would fail the same way, so commands stop (a sweep
    does not record it as a failed run)."""


def check_tracker(name: str | None) -> None:
    """Refuse an unknown tracker, or one whose package is missing, before anything runs."""
    if name is None:
        return
    if name not in TRACKERS:
        raise UserError(f"unknown tracker {name!r}; valid trackers: {', '.join(TRACKERS)}")
    package = _PACKAGES[name]
    if importlib.util.find_spec(package) is None:
        raise UserError(f"--log {name} needs the {package} package: pip install 'lengthgen[track]'")


class Tracker:
    """Receives a run's metrics; this base class drops them (no ``--log``)."""

    def train_step(self, step: int, loss: float, lr: float) -> None:
        """One training step (1-based count of steps done)."""

    def validation(self, step: int, metrics: Mapping[str, float]) -> None:
        """Validation metrics (e.g. ``exact_match``) after ``step`` steps."""

    def length(self, length: int, factor: int, metrics: Mapping[str, float], variant: str = "") -> None:
        """Evaluation results at one length (``variant``: "" or the evaluation variant's label)."""

    def close(self) -> None:
        """Flush and release; called once, also when the run fails."""


def eval_prefix(variant: str) -> str:
    return f"eval[{variant}]" if variant else "eval"


class TensorBoardTracker(Tracker):
    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(log_dir))

    def train_step(self, step: int, loss: float, lr: float) -> None:
        self.writer.add_scalar("train/loss", loss, step)
        self.writer.add_scalar("train/lr", lr, step)

    def validation(self, step: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(f"val/{name}", value, step)

    def length(self, length: int, factor: int, metrics: Mapping[str, float], variant: str = "") -> None:
        for name, value in metrics.items():
            self.writer.add_scalar(f"{eval_prefix(variant)}/{name}", value, length)

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """One W&B run per lengthgen run. Training metrics use ``train/step`` as their x axis and
    evaluation metrics ``length``, so the two never fight over W&B's monotonic step."""

    def __init__(self, run_dir: Path, run_id: str, config: Mapping[str, Any]) -> None:
        import os

        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "lengthgen"), name=run_id,
                              config=dict(config), dir=str(run_dir), reinit="finish_previous")
        self.run.define_metric("train/step")
        self.run.define_metric("train/*", step_metric="train/step")
        self.run.define_metric("val/*", step_metric="train/step")
        self.run.define_metric("length")
        self.run.define_metric("eval*", step_metric="length")

    def train_step(self, step: int, loss: float, lr: float) -> None:
        self.run.log({"train/step": step, "train/loss": loss, "train/lr": lr})

    def validation(self, step: int, metrics: Mapping[str, float]) -> None:
        self.run.log({"train/step": step, **{f"val/{k}": v for k, v in metrics.items()}})

    def length(self, length: int, factor: int, metrics: Mapping[str, float], variant: str = "") -> None:
        prefix = eval_prefix(variant)
        self.run.log({"length": length, f"{prefix}/factor": factor,
                      **{f"{prefix}/{k}": v for k, v in metrics.items()}})

    def close(self) -> None:
        self.run.finish()


def open_tracker(name: str | None, run_dir: Path, run_id: str, config: Mapping[str, Any]) -> Tracker:
    """The tracker ``name`` for one run (the no-op :class:`Tracker` when ``name`` is None).

    A tracker that cannot start (W&B online without a login, say) is a one-line
    :class:`TrackerError`, raised before the run writes anything; what the tracker made is removed.
    """
    check_tracker(name)
    if name is None:
        return Tracker()
    made = run_dir / name  # where the tracker writes: removed again if it cannot start
    existed = made.exists()
    try:
        if name == "tensorboard":
            return TensorBoardTracker(made)
        return WandbTracker(run_dir, run_id, config)
    except Exception as exc:
        if not existed:
            shutil.rmtree(made, ignore_errors=True)
        detail = exception_line(exc)
        raise TrackerError(f"--log {name} could not start ({detail}); for W&B without an account, "
                           "set WANDB_MODE=offline") from None
