"""CPU-time estimates of missing work: recorded timings of the same shape are used as they are,
those of another model size or length are scaled by the arithmetic of the two shapes."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from lengthgen.config import RunConfig, build_run_config
from lengthgen.plans.estimate import Timings
from lengthgen.plans.listing import missing_run_lines


def config(d_model: int = 32, d_ff: int = 64, train_length: int = 8, seed: int = 0) -> RunConfig:
    return build_run_config("copy", "softmax", seed=seed, overrides={
        "arch.d_model": d_model, "arch.d_ff": d_ff, "arch.n_heads": 4, "arch.n_layers": 2,
        "train.train_length": train_length, "train.steps": 100, "train.batch_size": 8,
        "eval.max_factor": 2, "eval.samples": 4, "eval.min_samples": 4})


def recorded(run: RunConfig, train_seconds: float, eval_seconds: dict[int, float]) -> list[dict[str, Any]]:
    """The rows a finished run leaves, reduced to what the estimator reads."""
    return [{"run_id": f"r{run.config_hash()}", "task": run.task, "attn": run.attn, "status": "ok",
             "config_json": run.canonical_json(), "train_length": run.train.train_length,
             "steps": run.train.steps, "train_seconds": train_seconds, "factor": factor,
             "eval_length": run.train.train_length * factor, "n_samples": 4, "eval_seconds": seconds}
            for factor, seconds in eval_seconds.items()]


def multiply_adds(d: int, d_ff: int, length: int, layers: int = 2) -> float:
    """Per sequence of ``length`` symbols: projections, FFN and attention over the prefix (by hand)."""
    return length * layers * (4 * d * d + 2 * d * d_ff + 2 * d * length)


def test_the_same_shape_uses_the_median_of_its_recorded_times() -> None:
    rows = [*recorded(config(seed=0), 100.0, {1: 4.0, 2: 8.0}),
            *recorded(config(seed=1), 300.0, {1: 8.0, 2: 16.0})]
    timings = Timings.from_rows(pd.DataFrame(rows))
    target = config(seed=2)
    assert timings.train_seconds(target) == pytest.approx(200.0)  # median of 1 and 3 s per step, 100 steps
    # per sample: median of 1 and 2 s at 1x, of 2 and 4 s at 2x; 4 samples each
    assert timings.eval_seconds(target, [1, 2]) == pytest.approx(4 * 1.5 + 4 * 3.0)
    assert timings.size_recorded(target)


def test_another_model_size_is_scaled_by_its_arithmetic() -> None:
    timings = Timings.from_rows(pd.DataFrame(recorded(config(), 100.0, {1: 4.0})))
    wide = config(d_model=64, d_ff=128)
    ratio = multiply_adds(64, 128, 8) / multiply_adds(32, 64, 8)
    assert timings.train_seconds(wide) == pytest.approx(100.0 * ratio)
    assert timings.eval_seconds(wide, [1]) == pytest.approx(4.0 * ratio)
    assert not timings.size_recorded(wide)
    line = missing_run_lines([wide], "/nonexistent", timings)[0]
    assert line.endswith("(scaled from another model size)")
    same = missing_run_lines([config(seed=3)], "/nonexistent", timings)[0]
    assert "scaled" not in same


def test_an_unrecorded_length_is_scaled_from_the_nearest_one() -> None:
    timings = Timings.from_rows(pd.DataFrame(recorded(config(train_length=8), 100.0, {1: 4.0, 2: 8.0})))
    longer = config(train_length=32)  # trains at 32, tested at 32 (nearest recorded: 16) and 64
    step_ratio = multiply_adds(32, 64, 32) / multiply_adds(32, 64, 8)
    assert timings.train_seconds(longer) == pytest.approx(100.0 * step_ratio)
    per_sample = [2.0 * multiply_adds(32, 64, n) / multiply_adds(32, 64, 16) for n in (32, 64)]
    assert timings.eval_seconds(longer, [1, 2]) == pytest.approx(sum(4 * s for s in per_sample))


def test_no_comparable_run_falls_back_to_the_stated_cost_model() -> None:
    """A task with no recorded run gets the cost model's estimate (per step: an overhead plus the
    work's multiply-adds at the measured rate), marked as such, never a silent 0 s."""
    from lengthgen.plans import estimate

    timings = Timings.from_rows(pd.DataFrame(recorded(config(), 100.0, {1: 4.0})))
    other_task = build_run_config("sort", "softmax")
    dumped = other_task.model_dump(mode="json")
    step = estimate.MODEL_STEP_OVERHEAD + estimate.MODEL_STEP_SECONDS * estimate._work_of(
        dumped, other_task.train.train_length) * other_task.train.batch_size
    assert timings.train_seconds(other_task) == pytest.approx(step * other_task.train.steps)
    assert timings.train_seconds(other_task) > 0 and timings.eval_seconds(other_task, [1, 2]) > 0
    lines = missing_run_lines([other_task], "/nonexistent", timings)
    assert lines[0].endswith("(cost model: no run of this task recorded)")
    assert "without a comparable recorded run" not in lines[-1]


def test_runs_of_todays_numerics_come_before_older_ones_at_any_length() -> None:
    """An older run at the very length is passed over for a run of today's numerics at another
    length (scaled); the older one is used only where nothing of today's matches."""
    from lengthgen.provenance import NUMERICS_VERSION

    old = [{**row, "numerics_version": float("nan")} for row in recorded(config(seed=0), 100.0, {2: 1.0})]
    new = [{**row, "numerics_version": NUMERICS_VERSION} for row in recorded(config(seed=1), 900.0, {1: 8.0})]
    timings = Timings.from_rows(pd.DataFrame(old + new))
    target = config(seed=2)
    assert timings.train_seconds(target) == pytest.approx(900.0)
    scaled = 8.0 * multiply_adds(32, 64, 16) / multiply_adds(32, 64, 8)  # from 1x to 2x, not the old 1.0
    assert timings.eval_seconds(target, [2]) == pytest.approx(scaled)
    only_old = Timings.from_rows(pd.DataFrame(old))
    assert only_old.eval_seconds(target, [2]) == pytest.approx(1.0)
    assert only_old.train_seconds(target) == pytest.approx(100.0)
