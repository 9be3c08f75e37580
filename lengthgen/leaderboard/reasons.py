"""Why a cell of the board did not learn on every seed.

A mean over seeds that did not all learn says little by itself: a reader must know whether the
task is out of the backend's reach, the budget too small, or the method broken somewhere (the
adaptive temperature's sharpening). The plan names, per task × backend, the ablation that shows the
reason; the page lists every cell of the chosen settings where not every seed learned, with its
reason, or says that none is recorded yet, so a missing explanation is visible, not silent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

import pandas as pd

from lengthgen.errors import UserError
from lengthgen.leaderboard.ablations import Ablation
from lengthgen.leaderboard.page import code_spans
from lengthgen.leaderboard.safe import slug
from lengthgen.leaderboard.stats import LEARNED_THRESHOLD
from lengthgen.leaderboard.tables import md_prose, md_text

HEADING = "Cells where not every seed learned"
INTRO = (f"A seed learned when its 1× test exact match is ≥ {LEARNED_THRESHOLD * 100:.0f}%. For each chosen "
         "setting where not every seed did, the reason the plan records and the ablation that shows it.")
NO_REASON = "no reason recorded in the plan yet."


@dataclass(frozen=True)
class CellReason:
    """The plan's reason for one task × backend (any position scheme)."""

    task: str
    attn: str
    ablation: str  # the ablation folder's name
    text: str


@dataclass(frozen=True)
class UnlearnedCell:
    task: str
    method: str
    pos: str
    learned: int
    runs: int
    reason: CellReason | None


def check_reasons(reasons: Sequence[CellReason], ablations: Sequence[Ablation]) -> None:
    """Every reason names an ablation the board publishes (one-line ``UserError`` if not)."""
    names = sorted(a.name for a in ablations)
    for reason in reasons:
        if reason.ablation not in names:
            raise UserError(f"the plan's reason for {reason.task} · {reason.attn} names ablation "
                            f"{reason.ablation!r}, not one of the board's: {', '.join(names) or 'none'}")


def unlearned_cells(summary: pd.DataFrame, reasons: Sequence[CellReason]) -> list[UnlearnedCell]:
    """The measured chosen settings with fewer learned seeds than runs, in task and backend order."""
    shown = summary[(summary["source"] == "measured") & summary["chosen"].astype(bool)]
    by_cell = {(r.task, r.attn): r for r in reasons}
    cells = []
    for (task, method, pos), part in shown.groupby(["task", "method", "pos"], sort=True):
        first = part.iloc[0]
        learned, runs = int(first["learned_seeds"]), int(first["runs"])
        if learned < runs:
            cells.append(UnlearnedCell(str(task), str(method), str(pos), learned, runs,
                                       by_cell.get((str(task), str(method)))))
    return cells


def _ablation_title(name: str, ablations: Sequence[Ablation]) -> str:
    return next(a.title for a in ablations if a.name == name)


def reason_markdown(cells: Sequence[UnlearnedCell], ablations: Sequence[Ablation]) -> list[str]:
    """The section's Markdown lines (none when every seed learned everywhere)."""
    if not cells:
        return []
    lines = [f"### {HEADING}", "", INTRO, ""]
    for cell in cells:
        name = md_text(f"{cell.task} · {cell.method} · {cell.pos}")
        head = f"- **{name}**: {cell.learned}/{cell.runs} learned; "
        if cell.reason is None:
            lines.append(head + NO_REASON)
        else:
            title = md_text(_ablation_title(cell.reason.ablation, ablations))
            lines.append(head + f"{md_prose(cell.reason.text)} (ablation: *{title}*, below)")
    return [*lines, ""]


def ablation_anchor(name: str) -> str:
    """The id of an ablation's heading on the HTML page."""
    return f"ablation-{slug(name)}"


def reason_html(cells: Sequence[UnlearnedCell], ablations: Sequence[Ablation]) -> str:
    """The section as HTML, each reason linking to its ablation ("" when every seed learned)."""
    if not cells:
        return ""
    items = []
    for cell in cells:
        head = (f"<strong>{escape(f'{cell.task} · {cell.method} · {cell.pos}')}</strong>: "
                f"{cell.learned}/{cell.runs} learned; ")
        if cell.reason is None:
            items.append(f"<li>{head}{escape(NO_REASON)}</li>")
        else:
            title = escape(_ablation_title(cell.reason.ablation, ablations))
            items.append(f"<li>{head}{code_spans(cell.reason.text)} (ablation: "
                         f'<a href="#{ablation_anchor(cell.reason.ablation)}">{title}</a>)</li>')
    return f"<h3>{HEADING}</h3>\n<p>{escape(INTRO)}</p>\n<ul>{''.join(items)}</ul>"
