"""The training-budget study's copy part: copy at 16× with twice the board's training steps.

Its runs repeat the board's copy recipe of a backend (the learning rate and warm-up the board chose,
the paper-tasks copy model) with more steps, the cosine decay stretched over them; the board's own
runs of that recipe are the first budget. A board run belongs to the study's recipe when its config
equals a study run's in everything but the seed, the number of steps and the evaluation settings
(which lengths are tested does not change the trained model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from lengthgen.leaderboard.budget import Point, count_label, exact_cell, points, sequences_label
from lengthgen.leaderboard.paper import PAPER_REPORTED, paper_training
from lengthgen.leaderboard.rows import config_dict
from lengthgen.leaderboard.stats import seed_interval
from lengthgen.leaderboard.tables import Cell, Header, Row, Table, pct

TASK = "copy"
#: The lengths the copy part reports; the question is 16×, the paper's copy reaches 32×.
COPY_FACTORS = (8, 16, 32)
HEADLINE_FACTOR = 16
#: The paper's copy training: steps and sequences per step.
PAPER_COPY_STEPS, PAPER_COPY_BATCH = paper_training(TASK)
PAPER_COPY_SEQUENCES = PAPER_COPY_STEPS * PAPER_COPY_BATCH


def recipe(config_json: str) -> str:
    """A run's training recipe: its config without the seed, the step count and the evaluation."""
    config = config_dict(config_json)
    config.pop("seed", None)
    config.pop("eval", None)
    config["train"] = {k: v for k, v in config.get("train", {}).items() if k != "steps"}
    return json.dumps(config, sort_keys=True)


@dataclass(frozen=True)
class CopyStudy:
    """The copy part's points, and which of them are the board's own runs."""

    points: tuple[Point, ...]
    from_board: frozenset[tuple[str, int, int]]  # (backend, steps, width)

    def is_board(self, point: Point) -> bool:
        return (point.attn, point.steps, point.width) in self.from_board


def copy_study(study_rows: pd.DataFrame, board_rows: pd.DataFrame | None,
               recipes: frozenset[str]) -> CopyStudy:
    """The copy runs of ``recipes`` (the study plan's copy recipes) in the study's rows and in the
    board's, by backend, width and steps: the board's runs are the first budget from the start."""
    def of_recipes(rows: pd.DataFrame | None) -> pd.DataFrame:
        if rows is None or rows.empty:
            return pd.DataFrame()
        mine = rows[rows["task"] == TASK]
        runs = mine.drop_duplicates("run_id")[["run_id", "config_json"]]
        kept = {run for run, config in runs.itertuples(index=False) if recipe(config) in recipes}
        return mine[mine["run_id"].isin(kept)]

    study, board = of_recipes(study_rows), of_recipes(board_rows)
    combined = pd.concat([f for f in (study, board) if not f.empty] or [pd.DataFrame()], ignore_index=True)
    from_board = points(board, task=TASK)
    return CopyStudy(tuple(points(combined, task=TASK)),
                     frozenset((p.attn, p.steps, p.width) for p in from_board))


def copy_table(copy: CopyStudy) -> Table:
    """A line per backend × budget: sequences, seeds, whose runs, exact match at 8×, 16× and 32×
    (mean [interval], each seed); the paper's copy rows pinned below."""
    headers = (Header("backend"), Header("steps", numeric=True),
               Header("sequences", "training sequences: steps × batch", numeric=True),
               Header("seeds", numeric=True), Header("runs", "the board's own runs, or the study's"),
               *[Header(f"{f}×", f"exact match (%) at {f}×: mean over seeds [95% Student-t interval], each "
                                 "seed", numeric=True) for f in COPY_FACTORS])
    body = [Row((Cell(p.attn), Cell(f"{p.steps:,}", float(p.steps)),
                 Cell(sequences_label(p.sequences), float(p.sequences)),
                 Cell(str(len(p.seeds)), len(p.seeds)),
                 Cell("board" if copy.is_board(p) else "study"),
                 *[exact_cell(p, f) for f in COPY_FACTORS])) for p in copy.points]
    pinned = [Row((Cell(f"paper: {attn}"), Cell(f"{PAPER_COPY_STEPS:,}"),
                   Cell(sequences_label(PAPER_COPY_SEQUENCES)),
                   Cell("best of 3"), Cell("paper"), *[Cell(pct(scores[f] / 100)) for f in COPY_FACTORS]),
                  kind="paper")
              for attn, scores in PAPER_REPORTED[TASK].items() if any(p.attn == attn for p in copy.points)]
    return Table(headers, tuple(body), tuple(pinned), label="copy at long lengths by training budget")


def change_lines(copy: CopyStudy, factor: int = HEADLINE_FACTOR) -> list[str]:
    """Per backend, exact match at ``factor`` from its smallest to its largest budget tested there:
    the means over seeds and the seeds behind each."""
    lines = []
    for attn in sorted({p.attn for p in copy.points}):
        mine = sorted((p for p in copy.points if p.attn == attn and p.values(factor)), key=lambda p: p.steps)
        if not mine:
            continue
        steps = " → ".join(f"{pct(seed_interval(p.values(factor)).mean)}% at {p.steps:,} steps "
                           f"({count_label(len(p.values(factor)), 'seed')})" for p in mine)
        lines.append(f"{attn}: {steps}")
    return lines


def copy_status(copy: CopyStudy, planned_runs: int) -> str:
    """How complete the copy part is: the study's runs recorded of those its plan makes."""
    made = sum(len(p.seeds) for p in copy.points if not copy.is_board(p))
    return f"{made} of {planned_runs} planned runs recorded"
