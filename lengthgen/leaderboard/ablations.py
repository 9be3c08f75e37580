"""Ablations: controlled experiments that say what moves a result, published with the leaderboard.

An ablation is a sweep folder of its own (``data/`` as any sweep writes it) with an ``ABOUT.md``
beside it: a ``# title`` line, then paragraphs that state the question and what the data show.
The leaderboard renders every ablation under ``--ablations DIR`` (one sub-folder each, in name
order) as its text, a table of *every* setting it ran (unlike the main tables, which show the
chosen one) and the commands that reproduce it. The text is the author's; every number in the
table comes from the rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lengthgen import limits
from lengthgen.errors import UserError
from lengthgen.files import read_text
from lengthgen.leaderboard.long_table import summarize
from lengthgen.leaderboard.rows import load_rows
from lengthgen.leaderboard.stats import EFFECTIVE_THRESHOLD, LEARNED_THRESHOLD, is_missing
from lengthgen.leaderboard.tables import (
    Cell,
    Header,
    Row,
    Table,
    effective_label,
    effective_sort,
    learned_cell,
    pct,
)

ABOUT = "ABOUT.md"


@dataclass(frozen=True)
class Ablation:
    name: str  # the folder's name: a stable anchor
    title: str
    paragraphs: tuple[str, ...]
    rows: pd.DataFrame
    source: str  # the sweep folder, as the reproduce commands name it


def _about(path: Path) -> tuple[str, tuple[str, ...]]:
    text = read_text(path, links=False, limit=limits.MAX_TEXT_BYTES).strip()
    head, _, body = text.partition("\n")
    if not head.startswith("# "):
        raise UserError(f"{path} must start with a '# title' line")
    paragraphs = tuple(" ".join(p.split()) for p in body.split("\n\n") if p.strip())
    return head[2:].strip(), paragraphs


def load_ablations(folder: str | os.PathLike[str]) -> list[Ablation]:
    """Every sub-folder of ``folder`` holding an ``ABOUT.md`` and results, in name order."""
    root = Path(folder)
    if not root.is_dir():
        raise UserError(f"--ablations {str(folder)!r} is not a folder")
    found = []
    for sub in sorted(p for p in root.iterdir() if (p / ABOUT).is_file()):
        if sub.is_symlink():  # the board publishes what lies in the folder, not what a link leads to
            raise UserError(f"ablation {str(sub)!r} is a symbolic link: move the folder there instead")
        title, paragraphs = _about(sub / ABOUT)
        rows = load_rows(sub)
        if rows.empty:
            raise UserError(f"ablation {str(sub)!r} has no results (expected {sub / 'data'}/*.parquet)")
        found.append(Ablation(sub.name, title, paragraphs, rows, str(sub)))
    if not found:
        raise UserError(f"no ablations under {str(folder)!r} (expected sub-folders with {ABOUT} and data/)")
    return found


def ablation_table(rows: pd.DataFrame) -> Table:
    """One line per (task, backend, scheme, setting) the ablation ran, every setting shown; the task
    and the position scheme get a column only when they vary (the title names them otherwise)."""
    summary = summarize(rows)
    part = summary[summary["source"] == "measured"]
    factors = sorted(int(f) for f in part["factor"].dropna().unique())
    tasks, schemes = part["task"].nunique() > 1, part["pos"].nunique() > 1
    headers = (
        *([Header("task")] if tasks else []),
        Header("backend", "attention backend (and the evaluation variant, if any)"
               + ("" if tasks else f"; task {part['task'].iloc[0]}" if len(part) else "")
               + ("" if schemes else f"; position scheme {part['pos'].iloc[0]}" if len(part) else "")),
        *([Header("pos", "position scheme")] if schemes else []),
        Header("setting", "how this setting differs from the others (or from its preset); val = mean "
                          "in-distribution validation exact match over its seeds (%)"),
        Header("seeds", numeric=True),
        Header("learned", f"seeds whose 1× test exact match is ≥ {LEARNED_THRESHOLD * 100:.0f}%",
               numeric=True),
        *[Header("ID (1×)" if f == 1 else f"{f}×", f"exact match (%) at {f}× the training length: mean "
                 "over seeds [95% interval]", numeric=True) for f in factors],
        Header("eff. length", f"largest factor whose mean stays ≥ {EFFECTIVE_THRESHOLD * 100:.0f}% at "
                              "every factor up to it", numeric=True),
    )
    body = []
    keys = part[["task", "method", "pos", "recipe"]].drop_duplicates()
    for task, method, pos, recipe in keys.itertuples(index=False):
        group = part[(part["task"] == task) & (part["method"] == method) & (part["pos"] == pos)
                     & (part["recipe"] == recipe)]
        first = group.iloc[0]
        runs = int(first["runs"])
        val = "" if is_missing(first["val_exact_id"]) else f" · val {pct(first['val_exact_id'])}"
        by_factor = {int(r.factor): r for r in group.itertuples() if not is_missing(r.factor)}
        cells = [*([Cell(str(task))] if tasks else []), Cell(str(method)),
                 *([Cell(str(pos))] if schemes else []),
                 Cell(f"{first['setting']}{val}", None, str(first["setting_detail"] or "")),
                 Cell(str(runs), float(runs)),
                 learned_cell(int(first["learned_seeds"]), runs, by_factor.keys())]
        for f in factors:
            r = by_factor.get(f)
            if r is None:
                cells.append(Cell("—", -1.0, "not evaluated"))
                continue
            detail = f"[{pct(r.ci_lo)}, {pct(r.ci_hi)}]" if r.ci_method in ("t", "wilson") else ""
            cells.append(Cell(pct(r.exact_match), float(r.exact_match), "", detail=detail))
        cells.append(Cell(effective_label(first["effective_length"], first["effective_length_capped"]),
                          effective_sort(first["effective_length"], first["effective_length_capped"])))
        body.append(Row(tuple(cells)))
    return Table(headers, tuple(body), label="settings of the ablation")

