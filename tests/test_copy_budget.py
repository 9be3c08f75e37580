"""The training-budget study's copy part: which runs make its budgets (the board's runs of the
study's recipes, then the study's own), its table, and its place on the board."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from lengthgen.harness.storage.results import load_results
from lengthgen.leaderboard import render
from lengthgen.leaderboard.budget_page import StudySource, copy_answer_line
from lengthgen.leaderboard.copy_budget import change_lines, copy_study, copy_table
from lengthgen.plans.board import budget_study
from lengthgen.plans.plan import load_plan
from tests.leaderboard_rows import ROWS, copy_study_rows, make_rows, planned_recipe

REPO = Path(__file__).resolve().parents[1]


BOARD = {("asentmax", 4000, s): {8: 0.9, 16: 0.4 + 0.1 * s, 32: 0.05} for s in range(3)}


def test_the_board_runs_of_the_recipe_are_the_first_budget() -> None:
    """A board run joins when its config equals the study's but for seed, steps and evaluation: the
    screened-only learning rate and another task stay out."""
    board = pd.concat([copy_study_rows(BOARD, max_factor=8),  # screened to 8x, then extended
                       copy_study_rows({("asentmax", 4000, 0): {16: 0.99}}, lr=1e-3),
                       make_rows(ROWS, task="sort")], ignore_index=True)
    study_rows = copy_study_rows({("asentmax", 8000, s): {8: 0.95, 16: 0.7, 32: 0.2} for s in (0, 1)})
    copy = copy_study(study_rows, board, frozenset({planned_recipe("asentmax", 2e-3)}))
    assert [(p.attn, p.steps, p.width, len(p.seeds), copy.is_board(p)) for p in copy.points] == [
        ("asentmax", 4000, 256, 3, True), ("asentmax", 8000, 256, 2, False)]
    assert copy.points[0].values(16) == pytest.approx([0.4, 0.5, 0.6])
    assert change_lines(copy) == ["asentmax: 50.0% at 4,000 steps (3 seeds) → 70.0% at 8,000 steps (2 seeds)"]
    # before the study records a run, the plan's recipes already pick the board's runs
    early = copy_study(pd.DataFrame(), board, frozenset({planned_recipe("asentmax", 2e-3)}))
    assert [(p.steps, copy.is_board(p)) for p in early.points] == [(4000, True)]
    assert copy_study(study_rows, board, frozenset()).points == ()


def test_the_table_shows_whose_runs_each_budget_is_and_the_paper() -> None:
    study_rows = copy_study_rows({("asentmax", 8000, 0): {8: 0.95, 16: 0.7, 32: 0.2}})
    copy = copy_study(study_rows, copy_study_rows(BOARD), frozenset({planned_recipe("asentmax", 2e-3)}))
    table = copy_table(copy)
    first, second = ([c.plain for c in row.cells] for row in table.rows)
    assert first[:5] == ["asentmax", "4,000", "256 K", "3", "board"]
    assert first[6].startswith("50.0 [") and first[6].endswith("seeds 40.0 / 50.0 / 60.0")
    assert second[:5] == ["asentmax", "8,000", "512 K", "1", "study"] and second[6] == "70.0 seed 0: 70.0"
    assert [c.plain for c in table.pinned[0].cells] == ["paper: asentmax", "156,250", "20.0 M", "best of 3",
                                                        "paper", "99.7", "99.4", "96.3"]


def test_the_board_shows_the_copy_part_with_its_status_and_figure() -> None:
    study_rows = copy_study_rows({("asentmax", 8000, s): {8: 0.95, 16: 0.7, 32: 0.2} for s in (0, 1)})
    recipes = frozenset({planned_recipe("asentmax", 2e-3)})
    source = StudySource(study_rows, {"mqmtar": 33, "copy": 6}, "leaderboard/budget.toml",
                         "leaderboard/budget", recipes, copy_study_rows(BOARD))
    files = render(make_rows(ROWS), budget=source).files
    readme = files["README.md"].decode()
    assert "### Copy at 16× trained longer" in readme and "*Status: 2 of 6 planned runs recorded.*" in readme
    assert "| asentmax | 8,000 | 512 K | 2 | study |" in readme
    assert "plots/budget_copy.svg" in files and 'id="budget-copy"' in files["leaderboard.html"].decode()
    answer = readme.split("## The answer", 1)[1].split("\n\n")[1].splitlines()[-1]
    assert answer == ("- copy trained longer (the training-budget study's copy part, 2 of 6 planned runs "
                      "recorded): exact match at 16× (mean over seeds): asentmax 50.0% → 70.0% (seeds 3 / 2 "
                      "at 4,000 / 8,000 steps); the paper, after 156,250 steps of 128 sequences: "
                      "asentmax 99.4%.")
    early = StudySource(pd.DataFrame(), {"mqmtar": 33, "copy": 6}, "p", "d", recipes, copy_study_rows(BOARD))
    assert copy_answer_line(early) is None  # the board's own runs are on the board already
    without = render(make_rows(ROWS), budget=StudySource(study_rows, {"mqmtar": 33}, "p", "d")).files
    assert "Copy at 16×" not in without["README.md"].decode()


def test_the_study_plan_repeats_the_recipes_the_board_chose() -> None:
    """leaderboard/budget.toml's copy runs are the board's chosen copy runs with twice the steps: their
    recipes pick exactly the board's three seeds of each backend (seeds 1 and 2 run only at the
    chosen setting), at 4,000 steps."""
    plan_file = str(REPO / "leaderboard" / "plan.toml")
    board = load_results(REPO / "leaderboard" / "data")
    source = budget_study(load_plan(plan_file), plan_file, board)
    assert source is not None and source.planned["copy"] == 6 and len(source.copy_recipes) == 2
    copy = copy_study(pd.DataFrame(), board, source.copy_recipes)
    assert [(p.attn, p.steps, [s.seed for s in p.seeds]) for p in copy.points] == [
        ("asentmax", 4000, [0, 1, 2]), ("softmax", 4000, [0, 1, 2])]
