"""Accuracy by answer position (``lengthgen positions``): each prediction is counted at its index in
its own sample's answer, checked against a stand-in model whose errors start at a known position."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.harness.recorded.answers import PositionAccuracy, accuracy_by_position, answer_positions
from lengthgen.harness.run import execute
from lengthgen.tasks import get_task

runner = CliRunner()


class RightUpTo(torch.nn.Module):
    """Predicts the true next token at the first ``k`` scored rows and a wrong one after them (every
    sample of a copy test set shares one layout, so row order is answer order)."""

    def __init__(self, k: int, vocab: int) -> None:
        super().__init__()
        self.k, self.vocab = k, vocab

    def forward(self, ids: torch.Tensor, rows: torch.Tensor, stats: object) -> torch.Tensor:
        targets = ids[:, rows + 1]
        guess = torch.where(torch.arange(len(rows)) < self.k, targets, (targets + 1) % self.vocab)
        return torch.nn.functional.one_hot(guess, self.vocab).float()


def test_answer_positions_count_within_each_sample() -> None:
    mask = np.array([[False, True, True, False, True], [True, False, False, True, False]])
    assert answer_positions(mask).tolist() == [[-1, 0, 1, -1, 2], [0, -1, -1, 1, -1]]


def test_bins_pool_the_counts_of_their_positions() -> None:
    profile = PositionAccuracy(right=np.array([4, 4, 2, 0]), scored=np.array([4, 4, 4, 4]))
    assert profile.bins(2) == [(1, 2, 1.0), (3, 4, 0.25)]
    assert profile.bins(10) == [(1, 1, 1.0), (2, 2, 1.0), (3, 3, 0.5), (4, 4, 0.0)]


@pytest.mark.parametrize("k", [0, 5, 12])
def test_errors_show_from_the_position_they_start_at(k: int) -> None:
    task = get_task("copy")
    profile = accuracy_by_position(RightUpTo(k, task.vocab.size), task, 12, n_samples=10, batch_tokens=64,
                                   device=torch.device("cpu"))
    answer = int(task.sample(1, 12, seed=0, split="eval").loss_mask.sum())
    assert profile.scored.tolist() == [10] * answer
    assert profile.right.tolist() == [10 if i < k else 0 for i in range(answer)]


def test_command_reports_ranges_and_marks_those_beyond_training(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    torch.set_num_threads(1)
    frame = execute(tiny_config(), tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    result = runner.invoke(app, ["positions", str(run_dir), "--factor", "2", "--samples", "6", "--bins", "4"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"{run_dir.name} at 2x (length 12, 6 test samples)")
    ranges = [line.split()[0] for line in lines[2:]]
    assert len(ranges) == 4 and ranges[0].startswith("1-") and ranges[-1].endswith(f"-{12}")
    trained = int(lines[0].rsplit("-", 1)[1])
    for line in lines[2:]:
        first = int(line.split()[0].split("-")[0])
        assert ("beyond training" in line) == (first > trained)


@pytest.mark.parametrize("args, expected", [
    (["--bins", "0"], "--bins must be at least 1"),
    (["--factor", "0"], "factor and samples must be at least 1"),
    ([], "is not a run folder (it has no config.json)"),  # the empty folder itself
])
def test_bad_arguments_and_a_folder_without_a_run_are_one_line(
    tmp_path: Path, args: list[str], expected: str, one_line_error: Callable[..., None]
) -> None:
    one_line_error(runner.invoke(app, ["positions", str(tmp_path), *args]), expected)
