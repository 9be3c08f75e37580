"""A board built from its plan: which recorded runs it shows, and everything else the plan says of
the page (title, hardware, ablations, the rule of its grids, the reasons of unlearned cells, the
numerics pin, the grids screened in part, and the training-budget study it links).

The ``leaderboard`` command only parses its flags and calls :func:`plan_board`; the board's recipe
lives in the plan, so this is where the plan is read for a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from lengthgen.errors import UserError
from lengthgen.leaderboard.budget_page import StudySource
from lengthgen.leaderboard.reasons import CellReason
from lengthgen.plans.plan import (
    ablations_dir,
    blocks,
    board_run_ids,
    budget_paths,
    load_plan,
    rule_text,
    screening_progress,
    survey,
)


@dataclass(frozen=True)
class PlanBoard:
    rows: pd.DataFrame  # the plan's recorded runs, and nothing else
    title: str
    hardware: str | None
    ablations: str | None
    rule: str
    reasons: list[CellReason]
    numerics: dict[str, str]
    screening: dict[tuple[str, str, str], tuple[int, int]]
    budget: StudySource | None


def plan_board(plan_file: str, results: str, rows: pd.DataFrame) -> PlanBoard:
    """What the plan makes of the rows under ``results``; a ``UserError`` when none of its runs is
    recorded."""
    plan = load_plan(plan_file)
    states = survey(plan, results)
    mine = rows[rows["run_id"].isin(board_run_ids(states))]
    if mine.empty:
        raise UserError(f"none of the runs of plan {plan_file} is recorded under {results!r}; "
                        f"run: lengthgen sweep --plan {plan_file} --out {results}")
    folder = ablations_dir(plan, plan_file, results)
    reasons = [CellReason(*cell) for cell in plan.cell_reasons()]
    return PlanBoard(mine, plan.title, plan.hardware, None if folder is None else str(folder),
                     rule_text(plan), reasons, dict(plan.numerics), screening_progress(states),
                     budget_study(plan, plan_file))


def budget_study(plan: Any, plan_file: str) -> StudySource | None:
    """The training-budget study the plan links: its recorded rows (none yet is fine) and the number
    of runs its own plan makes."""
    from lengthgen.harness.results import load_results

    paths = budget_paths(plan, plan_file)
    if paths is None:
        return None
    study_file, folder = paths
    study = load_plan(study_file)
    planned = sum(len(block.screening) for block in blocks(study))
    data = folder / "data"
    rows = load_results(data) if data.is_dir() and any(data.glob("*.parquet")) else pd.DataFrame()
    return StudySource(rows, planned, str(study_file), str(folder))
