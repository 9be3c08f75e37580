"""Tables as data (headers, cells with sort values and hover text, pinned rows), as Markdown, and the CSV.

Every table of the leaderboard is a :class:`Table`, so the README and the HTML page render the
same cells, and the page sorts every table the same way.
"""

from __future__ import annotations

import re
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
#: What a code host would read as markup in text from data: HTML (``<``, an entity), emphasis and
#: strikethrough, code spans, math (``$``), a table's pipe, an inline link or image (``](``), and
#: an ``_`` that can open or close emphasis (not one inside a word: ``max_retrieval`` stays as it is).
_MARKUP = re.compile(r"[\\`*~$|<]|&(?=#?\w+;)|\](?=\()|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_ENTITIES = {"<": "&lt;", "&": "&amp;"}
#: Control characters and line breaks: a line break in a table cell ends the row, one in a list item
#: can start a heading.
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def md_text(text: str, *, brackets: bool = False) -> str:
    """Text shown literally in Markdown (a table cell, a heading), as the page shows it: one line,
    markup escaped; ``brackets`` also escapes ``[`` and ``]`` (a heading, an image's alt text)."""
    flat = _BREAKS.sub(" ", text)
    out = _MARKUP.sub(lambda m: _ENTITIES.get(m.group(0)[0], "\\" + m.group(0)), flat)
    return re.sub(r"[\[\]]", lambda m: "\\" + m.group(0), out) if brackets else out


def md_prose(text: str) -> str:
    """Prose in Markdown as the page renders it (``page.code_spans`` and bold): `code` spans and
    **bold** kept, everything else literal (:func:`md_text`)."""
    parts = re.split(r"(`[^`\n]+`)", _BREAKS.sub(" ", text))
    out = []
    for i, part in enumerate(parts):
        if i % 2:  # a code span: literal in Markdown already
            out.append(part)
            continue
        pieces = re.split(r"\*\*([^*]+)\*\*", part)
        out.append("".join(f"**{md_text(p)}**" if j % 2 else md_text(p) for j, p in enumerate(pieces)))
    return "".join(out)


def markdown(table: Table) -> str:
    """A GitHub-flavoured Markdown table; pinned rows in italics after the others. Every cell is
    text (:func:`md_text`): names from data never become markup or break a row."""
    header = [md_text(h.text) for h in table.headers]
    align = ["---:" if h.numeric else "---" for h in table.headers]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for row in (*table.rows, *table.pinned):
        texts: list[str] = []
        for cell in row.cells:
            texts.append(md_text(cell.plain))
            texts.extend([""] * (cell.span - 1))
        if row.kind != "measured":
            texts = [f"*{t}*" if t and i == 0 else t for i, t in enumerate(texts)]
        lines.append("| " + " | ".join(texts) + " |")
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
