"""Training: one length per batch, AdamW with warmup + cosine, grad clipping, loss on targets only.

Everything random is derived from the run seed: the init (a private generator), the length of
each step and its batch (the task's seeded stream), so a run on CPU is repeatable bit for bit.
A NaN or infinite loss stops the run with ``TrainingDiverged`` instead of producing garbage.
Given a state file, training saves its state at every validation and resumes from it
(``lengthgen.harness.resume``).
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from lengthgen.config import RunConfig
from lengthgen.harness.batches import ModelBatch, masked_loss, score
from lengthgen.harness.host_memory import reuse_freed_memory
from lengthgen.harness.prefetch import prefetched
from lengthgen.harness.resume import TrainingProgress, load_progress, save_progress
from lengthgen.harness.storage.identity import run_key
from lengthgen.harness.tracking import Tracker
from lengthgen.harness.weights import checkpoint_path, save_weights
from lengthgen.model import Transformer
from lengthgen.progress import Shown, display
from lengthgen.tasks.base import Task

#: Seed component that separates the validation stream from the test stream (seed 0, eval split).
VALIDATION_SEED = 1

#: Steps between progress updates (loss, token accuracy), which are also the divergence checks.
LOG_EVERY = 10

#: Lengths (multiples of the training length) at which the selected checkpoint's validation exact
#: match is recorded: in distribution, and the paper's 8x.
VALIDATION_FACTORS = (1, 8)


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainResult:
    steps: int
    seconds: float
    best_step: int
    best_val_exact: float
    selection: str
    val_length: int
    #: Validation exact match of the selected checkpoint at the training length and at 8x, recorded
    #: whichever rule selected it, so a leaderboard can rank settings by either rule afterwards.
    val_exact_id: float = float("nan")
    val_exact_8x: float = float("nan")
    history: list[dict[str, float]] = field(default_factory=list)
    #: The step a saved state resumed this training at (0: trained from the start); ``steps`` when
    #: the state was already fully trained (a run stopped while it evaluated).
    resumed_at: int = 0


def _validated(history: list[dict[str, float]]) -> dict[str, str]:
    """The latest validation score for the progress line (none before the first)."""
    return {"val": f"{history[-1]['val_exact']:.3f}"} if history else {}


class DivergenceWatch:
    """Stops a run whose loss became NaN or infinite, without reading the loss every step.

    The first non-finite loss and its step are kept on the loss's device, so a step that logs
    nothing never waits for the accelerator; :meth:`check` reads them at every logging step and
    before every validation, so at most ``LOG_EVERY - 1`` steps run after the loss diverged, and
    no diverged weights are ever validated or saved.
    """

    def __init__(self, device: torch.device) -> None:
        self.step = torch.full((), -1, dtype=torch.int64, device=device)
        self.loss = torch.zeros((), dtype=torch.float32, device=device)

    def observe(self, loss: torch.Tensor, step: int) -> None:
        first = (self.step < 0) & ~torch.isfinite(loss.detach())
        self.step = torch.where(first, step, self.step)
        self.loss = torch.where(first, loss.detach().float(), self.loss)

    def check(self) -> None:
        step = int(self.step)
        if step >= 0:
            raise TrainingDiverged(f"loss became {float(self.loss)} at step {step}; run stopped")


def training_arithmetic(config: RunConfig, device: torch.device) -> torch.autocast:
    """The forward passes of training steps in ``train.precision``: bf16 autocast runs matrix
    products in bfloat16 (fp32 weights and optimizer, loss in fp32), which changes the numerics;
    validation and evaluation always run in fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=config.train.precision == "bf16")


def lr_at(step: int, config: RunConfig) -> float:
    """Linear warmup to lr, then cosine decay to lr · min_lr_ratio."""
    t = config.train
    if t.warmup_steps and step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    span = max(1, t.steps - t.warmup_steps)
    progress = min(1.0, (step - t.warmup_steps) / span)
    floor = t.lr * t.min_lr_ratio
    return floor + (t.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train_lengths(task: Task, config: RunConfig) -> np.ndarray:
    """The length of every training step, uniform in the training range, from the run seed."""
    low, top = task.train_range(config.train.train_length, config.train.min_train_length)
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([config.seed, 0x7E1A])))
    return rng.integers(low, top + 1, size=max(1, config.train.steps))


@torch.no_grad()
def validate(
    model: Transformer, task: Task, length: int, n: int, device: torch.device, batch_size: int
) -> float:
    """Exact match on a validation stream disjoint from both the training and the test data."""
    model.eval()
    correct = 0
    for start in range(0, n, batch_size):
        count = min(batch_size, n - start)
        data = task.sample(count, length, seed=(VALIDATION_SEED, start), split="eval")
        batch = ModelBatch.from_task(data, device)
        correct += int(score(model(batch.input_ids, batch.query_positions), batch).exact.sum())
    model.train()
    return correct / n


def train(
    model: Transformer, task: Task, config: RunConfig, device: torch.device, progress: Shown = True,
    tracker: Tracker | None = None, state_path: Path | None = None, prefetch: bool = True,
    keep_dir: Path | None = None,
) -> TrainResult:
    """Train ``model`` in place and load the selected checkpoint into it. With ``state_path``, the
    state is saved there at every validation, and a state found there is resumed. With
    ``keep_dir`` (a run folder), the weights every ``train.keep_every`` steps are kept in its
    ``checkpoints/`` (``harness.weights``). ``prefetch``
    makes each step's batch while the previous step computes (``harness.prefetch``; the same
    batches either way)."""
    reuse_freed_memory()
    t = config.train
    tracker = tracker or Tracker()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=t.lr, betas=t.betas, weight_decay=t.weight_decay
    )
    lengths = train_lengths(task, config)
    val_length = t.validation_length()
    saved = load_progress(state_path, config, model, optimizer, device) if state_path else None
    done = saved or TrainingProgress()
    best_exact, best_step, best_state = done.best_exact, done.best_step, done.best_state
    history: list[dict[str, float]] = done.history
    start = time.perf_counter() - done.seconds
    model.train()
    label = f"train {run_key(config)}" + (f" (resumed at step {done.step})" if done.step else "")
    bar = display(t.steps, label, enabled=progress, unit="steps", leave=False, initial=done.step)
    divergence = DivergenceWatch(device)
    arithmetic = training_arithmetic(config, device)

    def make_batch(step: int) -> ModelBatch:
        data = task.sample(t.batch_size, int(lengths[step]), seed=(config.seed, step), split="train")
        return ModelBatch.from_task(data, "cpu", pin=device.type == "cuda")

    with prefetched(make_batch, range(done.step, t.steps), ahead=prefetch) as batches:
        for step, host_batch in batches:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step, config)
            batch = host_batch.to(device)
            with arithmetic:
                logits = model(batch.input_ids, batch.query_positions)
            loss = masked_loss(logits, batch)
            divergence.observe(loss, step)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip)
            optimizer.step()
            last = step == t.steps - 1
            validating = (step + 1) % t.val_every == 0 or last
            if step % LOG_EVERY == 0 or last or validating:
                divergence.check()  # the one host-device synchronisation of the steps that log
            if step % LOG_EVERY == 0 or last:
                acc = score(logits.detach(), batch)
                token_acc = acc.tokens_right / max(1, acc.tokens_scored)
                bar.set_postfix(loss=f"{loss.item():.3f}", acc=f"{token_acc:.3f}", **_validated(history))
                tracker.train_step(step + 1, float(loss.item()), optimizer.param_groups[0]["lr"])
            bar.update(1)
            if keep_dir is not None and t.keep_every and (step + 1) % t.keep_every == 0:
                save_weights(model, config, checkpoint_path(keep_dir, step + 1))
            if validating:
                exact = validate(model, task, val_length, t.val_samples, device, t.batch_size)
                history.append({"step": step + 1, "loss": float(loss.item()), "val_exact": exact})
                tracker.validation(step + 1, {"exact_match": exact})
                bar.set_postfix(loss=f"{loss.item():.3f}", **_validated(history))
                if exact >= best_exact:  # ties go to the later, longer-trained checkpoint
                    best_exact, best_step = exact, step + 1
                    best_state = copy.deepcopy(model.state_dict())
                if state_path is not None:
                    save_progress(state_path, config, model, optimizer, TrainingProgress(
                        step + 1, time.perf_counter() - start, best_exact, best_step, best_state, history))
    bar.close()
    if best_state is not None:
        model.load_state_dict(best_state)
    scores = {}
    for factor in VALIDATION_FACTORS:
        length = t.train_length * factor
        if best_state is not None and length == val_length:
            scores[factor] = best_exact  # the selected checkpoint's own score on the same stream
        else:
            scores[factor] = validate(model, task, length, t.val_samples, device, t.batch_size)
    model.eval()
    return TrainResult(
        steps=t.steps,
        seconds=time.perf_counter() - start,
        best_step=best_step,
        best_val_exact=max(best_exact, 0.0),
        selection=t.selection,
        val_length=val_length,
        val_exact_id=scores[1],
        val_exact_8x=scores[8],
        history=history,
        resumed_at=saved.step if saved else 0,
    )
