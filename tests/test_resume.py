"""A run stopped mid-training resumes from its last validation and ends bit for bit where an
uninterrupted run ends: same selected weights, same learning curve, same rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd
import pytest
import torch

from lengthgen.config import RunConfig
from lengthgen.harness import resume
from lengthgen.harness import run as run_module
from lengthgen.harness.resume import STATE_FILE
from lengthgen.harness.run import build, execute
from lengthgen.harness.storage.identity import run_columns
from lengthgen.harness.tracking import Tracker
from lengthgen.harness.train import TrainResult, train

CPU = torch.device("cpu")
SETTINGS = {"train.steps": 60, "train.val_every": 20}


class StopAt(Tracker):
    """Records the steps it sees; raises KeyboardInterrupt at the validation after ``stop`` steps."""

    def __init__(self, stop: int | None = None) -> None:
        self.stop, self.steps = stop, []

    def train_step(self, step: int, loss: float, lr: float) -> None:
        self.steps.append(step)

    def validation(self, step: int, metrics: Mapping[str, float]) -> None:
        if step == self.stop:
            raise KeyboardInterrupt


def trained(config, state_path: Path | None = None, tracker: Tracker | None = None
            ) -> tuple[TrainResult, dict[str, torch.Tensor]]:
    task, model = build(config)
    result = train(model, task, config, CPU, progress=False, tracker=tracker, state_path=state_path)
    return result, model.state_dict()


def assert_same_training(got: tuple[TrainResult, dict], want: tuple[TrainResult, dict]) -> None:
    (result, weights), (expected, expected_weights) = got, want
    for name in ("steps", "best_step", "best_val_exact", "val_exact_id", "val_exact_8x", "history"):
        assert getattr(result, name) == getattr(expected, name), name
    assert weights.keys() == expected_weights.keys()
    for name, tensor in expected_weights.items():
        assert torch.equal(weights[name], tensor), name


@pytest.mark.parametrize("attn", ["softmax", "asentmax"])
def test_training_stopped_after_a_validation_resumes_bit_for_bit(
    attn, tmp_path, learning_config: Callable[..., RunConfig]
):
    config = learning_config(attn, **SETTINGS)
    state = tmp_path / STATE_FILE
    with pytest.raises(KeyboardInterrupt):  # stopped at the second validation, before its save
        trained(config, state, StopAt(stop=40))
    assert state.is_file()
    resumed = StopAt()
    assert_same_training(trained(config, state, resumed), trained(config))
    assert min(resumed.steps) > 20  # steps 1..20 were not trained again


def test_a_state_of_another_config_is_not_resumed(tmp_path, learning_config: Callable[..., RunConfig]):
    state = tmp_path / STATE_FILE
    with pytest.raises(KeyboardInterrupt):
        trained(learning_config("softmax", **SETTINGS), state, StopAt(stop=40))
    other = learning_config("softmax", **SETTINGS, **{"train.lr": 1e-3})
    seen = StopAt()
    assert_same_training(trained(other, state, seen), trained(other))
    assert min(seen.steps) == 1


def test_a_state_another_process_setup_made_is_not_resumed(
    tmp_path, monkeypatch, learning_config: Callable[..., RunConfig]
):
    """Rows name the thread count, code and instruction sets that made them: a run trained partly
    under other ones would misstate them, so it starts over."""
    config = learning_config("softmax", **SETTINGS)
    state = tmp_path / STATE_FILE
    with pytest.raises(KeyboardInterrupt):
        trained(config, state, StopAt(stop=40))
    now = resume.made_now()
    monkeypatch.setattr(resume, "made_now", lambda: {**now, "torch_threads": now["torch_threads"] + 1})
    seen = StopAt()
    trained(config, state, seen)
    assert min(seen.steps) == 1


def test_a_failed_run_leaves_no_state_to_resume(
    tmp_path, monkeypatch, learning_config: Callable[..., RunConfig]
):
    """A run that fails after a validation (here its tracker, at step 40) starts over on a retry."""

    class FailsAt40(StopAt):
        def validation(self, step: int, metrics: Mapping[str, float]) -> None:
            if step == 40:
                raise RuntimeError("the tracker broke")

    monkeypatch.setattr(run_module, "open_tracker", lambda *args: FailsAt40())
    config = learning_config("softmax", **SETTINGS)
    frame = execute(config, tmp_path, progress=False)
    assert (frame["status"] == "failed").all() and "the tracker broke" in frame["error"].iloc[0]
    assert not (tmp_path / frame["run_id"].iloc[0] / STATE_FILE).exists()


def test_a_run_killed_mid_training_resumes_in_its_folder_and_writes_the_same_rows(
    tmp_path, monkeypatch, learning_config: Callable[..., RunConfig]
):
    config = learning_config("softmax", **SETTINGS)
    run_dir = tmp_path / "a" / run_columns(config)["run_id"]
    with pytest.raises(KeyboardInterrupt):  # what a killed `lengthgen run` leaves in its folder
        trained(config, run_dir / STATE_FILE, StopAt(stop=40))
    seen = StopAt()
    monkeypatch.setattr(run_module, "open_tracker", lambda *args: seen)
    resumed = execute(config, tmp_path / "a", progress=False)
    assert min(seen.steps) > 20
    assert not (run_dir / STATE_FILE).exists()  # trained: the state is gone, model.pt holds the weights
    assert (run_dir / "model.pt").is_file()
    monkeypatch.undo()
    fresh = execute(config, tmp_path / "b", progress=False)
    volatile = ["train_seconds", "eval_seconds", "created_at"]
    pd.testing.assert_frame_equal(resumed.drop(columns=volatile), fresh.drop(columns=volatile))


def test_a_restore_stopped_mid_training_resumes_from_its_scratch_folder(tmp_path, monkeypatch):
    """A restore (a run whose model.pt is gone, trained again from its recorded rows) killed
    mid-training keeps its scratch folder; the next restore resumes there instead of starting over,
    and still reproduces the recorded rows."""
    from typer.testing import CliRunner

    from lengthgen.cli import app
    from lengthgen.harness.recorded.restore import SCRATCH_PREFIX, restore_run

    sweep = tmp_path / "sweep"
    made = CliRunner().invoke(app, [
        "sweep", "--task", "max_retrieval", "--attn", "softmax", "--steps", "60", "--max-factor", "2",
        "--train-length", "6", "--eval-samples", "8", "--quiet", "--set", "train.val_every=20",
        "--set", "train.batch_size=16", "--set", "arch.d_model=32", "--set", "arch.d_ff=64",
        "--out", str(sweep)])
    assert made.exit_code == 0, made.output
    (data,) = (sweep / "data").glob("*.parquet")
    run_dir = sweep / "runs" / data.stem
    model = (run_dir / "model.pt").read_bytes()
    recorded = pd.read_parquet(data)
    run_dir.joinpath("model.pt").unlink()
    scratch = sweep / "runs" / f"{SCRATCH_PREFIX}{data.stem}"

    monkeypatch.setattr(run_module, "open_tracker", lambda *args: StopAt(stop=40))
    with pytest.raises(KeyboardInterrupt):
        restore_run(run_dir, data)
    assert (scratch / data.stem / STATE_FILE).is_file() and not (run_dir / "model.pt").exists()

    seen = StopAt()
    monkeypatch.setattr(run_module, "open_tracker", lambda *args: seen)
    assert restore_run(run_dir, data) == ""  # bitwise: the recorded rows reproduce exactly
    assert min(seen.steps) > 20  # steps 1..20 were not trained again
    assert (run_dir / "model.pt").read_bytes() == model and not scratch.exists()
    pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "results.parquet"), recorded)


def test_a_run_stopped_while_it_evaluated_keeps_its_lengths_and_does_not_train_again(
    tmp_path, monkeypatch, capsys, learning_config: Callable[..., RunConfig]
):
    """A kill during evaluation (a budget study's longest length takes half an hour) costs the
    length in progress, not the training nor the lengths finished."""
    config = learning_config("softmax", **SETTINGS)
    factors = config.eval.factors()
    assert len(factors) >= 2
    real_length = run_module.evaluate_length
    evaluated: list[int] = []

    def evaluate_length(model, task, length, factor, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        if stop_at is not None and factor == stop_at:
            raise KeyboardInterrupt  # what a kill during this length does
        evaluated.append(factor)
        return real_length(model, task, length, factor, *args, **kwargs)

    monkeypatch.setattr(run_module, "evaluate_length", evaluate_length)
    stop_at: int | None = factors[-1]
    with pytest.raises(KeyboardInterrupt):
        execute(config, tmp_path / "a", progress=False)
    run_dir = tmp_path / "a" / run_columns(config)["run_id"]
    assert (run_dir / STATE_FILE).is_file()
    stop_at, evaluated[:] = None, []
    seen = StopAt()
    monkeypatch.setattr(run_module, "open_tracker", lambda *args: seen)
    resumed = execute(config, tmp_path / "a", progress="log")
    assert f"{factors[0]}x kept from the stopped attempt" in capsys.readouterr().err
    assert seen.steps == []  # no step trained again
    assert evaluated == [factors[-1]]  # the lengths it finished are kept
    assert not (run_dir / STATE_FILE).exists()
    monkeypatch.undo()
    fresh = execute(config, tmp_path / "b", progress=False)
    volatile = ["train_seconds", "eval_seconds", "created_at"]
    pd.testing.assert_frame_equal(resumed.drop(columns=volatile), fresh.drop(columns=volatile))
    assert resumed["train_seconds"].nunique() == 1
