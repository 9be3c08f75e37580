"""A board built from its plan: which recorded runs it shows, and everything else the plan says of
the page (title, hardware, ablations, the rule of its grids, the reasons of unlearned cells, the
numerics pin, the grids screened in part, and the training-budget study it links).

The ``leaderboard`` command only parses its flags and calls :func:`write_board`, which reads the
folders and, given a plan, :func:`plan_board`: the board's recipe lives in the plan, so this is
where the plan is read for a page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen.errors import UserError
from lengthgen.harness.storage.results import load_results, usable
from lengthgen.leaderboard import DEFAULT_TITLE, write_leaderboard
from lengthgen.leaderboard.ablations import load_ablations
from lengthgen.leaderboard.budget_page import StudySource
from lengthgen.leaderboard.copy_budget import TASK as COPY_TASK
from lengthgen.leaderboard.copy_budget import recipe
from lengthgen.leaderboard.reasons import CellReason, check_reasons
from lengthgen.leaderboard.sources import load_sources
from lengthgen.paths import folder_for_writing, input_path
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


def write_board(folders: Sequence[str], out: str, *, title: str | None = None, hardware: str | None = None,
                commit: str | None = None, ablations: str | None = None, plan_file: str | None = None,
                latex: bool = False) -> list[Path]:
    """``lengthgen leaderboard``: the board of the first folder's rows (with submissions from the
    others), or of exactly the plan's runs with the title, hardware and ablations the plan names;
    everything is checked before anything is written. Returns the files written."""
    out_dir = folder_for_writing(out, "--out")
    results = folders[0]
    if len(folders) > 1 and plan_file is not None:
        raise UserError("--plan builds one board from its own folder; merge submissions without --plan")
    for folder in folders:
        input_path(folder, "RESULTS")
    rows, sources = load_sources(folders)
    usable(rows, ", ".join(map(repr, folders)))
    board = None
    if plan_file is not None:
        given = [flag for flag, value in (("--title", title), ("--hardware", hardware),
                                          ("--ablations", ablations)) if value is not None]
        if given:
            raise UserError(f"--plan sets {', '.join(given)} itself; drop it (edit the plan file instead)")
        board = plan_board(plan_file, results, rows)
        rows, title, hardware, ablations = board.rows, board.title, board.hardware, board.ablations
    if ablations is not None:  # checked before anything is written
        check_reasons(board.reasons if board else [], load_ablations(input_path(ablations, "--ablations")))
    return write_leaderboard(
        rows, out_dir, title=title or DEFAULT_TITLE, source=results, hardware=hardware, commit=commit,
        ablations=ablations, plan=plan_file, latex=latex, sources=sources,
        plan_rule=board.rule if board else None, reasons=board.reasons if board else None,
        numerics=board.numerics if board else None, screening=board.screening if board else None,
        budget=board.budget if board else None)


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
                     budget_study(plan, plan_file, mine))


def budget_study(plan: Any, plan_file: str, board_rows: pd.DataFrame) -> StudySource | None:
    """The training-budget study the plan links: its recorded rows (none yet is fine), the number of
    runs its own plan makes of each task, its copy recipes, and the board's rows (``board_rows``)
    that hold the copy part's first budget."""
    paths = budget_paths(plan, plan_file)
    if paths is None:
        return None
    study_file, folder = paths
    planned: dict[str, int] = {}
    copy_recipes = set()
    for block in blocks(load_plan(study_file)):
        planned[block.task] = planned.get(block.task, 0) + len(block.screening)
        if block.task == COPY_TASK:
            copy_recipes |= {recipe(config.canonical_json()) for config in block.screening}
    data = folder / "data"
    rows = load_results(data) if data.is_dir() and any(data.glob("*.parquet")) else pd.DataFrame()
    return StudySource(rows, planned, str(study_file), str(folder), frozenset(copy_recipes), board_rows)
