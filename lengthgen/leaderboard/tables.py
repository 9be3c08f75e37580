"""Tables as data (headers, cells with sort values and hover text, pinned rows), as Markdown, and the CSV.

Every table of the leaderboard is a :class:`Table`, so the README and the HTML page render the
same cells, and the page sorts every table the same way.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from lengthgen.leaderboard.safe import neutralise_frame
from lengthgen.leaderboard.stats import is_missing


@dataclass(frozen=True)
class Header:
    text: str
    title: str = ""  # hover text: what the column means
    numeric: bool = False


@dataclass(frozen=True)
class Cell:
    text: str
    sort: float | None = None  # numeric sort value; None sorts by text
    title: str = ""
    span: int = 1  # columns this cell covers (a row that says "n/a" across its numbers)
    detail: str = ""  # a second, smaller line on the page (the interval); after the text in Markdown
    wrap: bool = False  # the second line may wrap (a list of values), where an interval never does

    @property
    def plain(self) -> str:
        return f"{self.text} {self.detail}" if self.detail else self.text


@dataclass(frozen=True)
class Row:
    cells: tuple[Cell, ...]
    kind: str = "measured"  # "measured" (sortable), or pinned: "protocol", "paper"


@dataclass(frozen=True)
class Table:
    headers: tuple[Header, ...]
    rows: tuple[Row, ...]  # sortable
    pinned: tuple[Row, ...] = ()  # kept below the sortable rows, in this order
    label: str = ""  # accessible name of the table


# -- formatting -----------------------------------------------------------------------------------
def pct(value: Any, digits: int = 1) -> str:
    """Fraction → percent with fixed digits; never '-0.0'; '' for missing."""
    if is_missing(value):
        return ""
    text = f"{100 * float(value):.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def factor_label(factor: int) -> str:
    return "ID (1×)" if factor == 1 else f"{factor}×"


def effective_label(factor: Any, capped: Any) -> str:
    if is_missing(factor) or int(factor) == 0:
        return "—"
    return f"≥ {int(factor)}×" if bool(capped) else f"{int(factor)}×"


def learned_cell(learned: int, runs: int, tested: Collection[int], title: str = "") -> Cell:
    """'k/n' seeds that learned; '—' for a setting tested at some factors (``tested``) but not at
    1× (an evaluation variant from a longer length on): its seeds learned or not in the rows
    without the variant. Runs that failed before any test did not learn."""
    if tested and 1 not in tested:
        return Cell("—", -1.0, "not tested at 1×: see the row without the evaluation variant")
    return Cell(f"{learned}/{runs}", learned / runs if runs else -1.0, title)


def effective_sort(factor: Any, capped: Any) -> float:
    """'≥ 64×' sorts above '64×', '—' below everything."""
    if is_missing(factor):
        return -1.0
    return float(factor) + (0.5 if bool(capped) else 0.0)


# -- Markdown -------------------------------------------------------------------------------------
def _md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(table: Table) -> str:
    """A GitHub-flavoured Markdown table; pinned rows in italics after the others."""
    header = [h.text for h in table.headers]
    align = ["---:" if h.numeric else "---" for h in table.headers]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in (*table.rows, *table.pinned):
        texts: list[str] = []
        for cell in row.cells:
            texts.append(cell.plain)
            texts.extend([""] * (cell.span - 1))
        if row.kind != "measured":
            texts = [f"*{t}*" if t and i == 0 else t for i, t in enumerate(texts)]
        lines.append("| " + " | ".join(_md_escape(t) for t in texts) + " |")
    return "\n".join(lines)


# -- CSV ------------------------------------------------------------------------------------------
INTEGER_COLUMNS = ("factor", "eval_length", "n_seeds", "n_samples", "effective_length", "runs", "runs_failed",
                   "learned_seeds", "effective_length_learned")
BOOLEAN_COLUMNS = ("chosen", "effective_length_capped", "effective_length_learned_capped")


def csv_bytes(summary: pd.DataFrame, columns: Sequence[str]) -> bytes:
    """The long table with integer columns as integers and floats with six decimals; text cells
    that a spreadsheet would run as a formula are neutralised (``safe.neutralise``)."""
    table = neutralise_frame(summary[list(columns)])
    for column in INTEGER_COLUMNS:
        table[column] = table[column].astype("Int64")
    for column in BOOLEAN_COLUMNS:
        table[column] = table[column].astype("boolean")
    return table.to_csv(index=False, float_format="%.6f", lineterminator="\n").encode()
