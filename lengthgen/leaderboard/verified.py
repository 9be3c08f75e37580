"""The page's line on re-derived runs: what the board's ``verify.json`` says of the rows shown now.

A report (``lengthgen verify``) records, per run it checked, the rows it re-derived: their count,
factors and digest (``harness.recorded.verify.rows_digest``), and the data it read. A run counts as
re-derived only while its current rows are exactly those rows, so a row edited after the check, or
a report from someone else's folder, never reads as verified; a run whose verified rows are kept
but which has more rows now is named as extended since, its new rows not covered. Rows of
evaluation variants are never re-derived, and the line says so. A report that predates the digests
(format 1) covers nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from lengthgen.harness.recorded.verify import evaluated_rows, rows_digest

#: Runs named in a line before it says "and k more".
NAMED = 3


@dataclass
class Coverage:
    """What a report covers of the rows on a page."""

    runs: int  # runs on the page
    rows: int  # evaluated rows of their training tasks
    rederived: list[str] = field(default_factory=list)  # ok, and the current rows are the checked ones
    covered_rows: int = 0
    extended: list[tuple[str, int, int]] = field(default_factory=list)  # (run, rows checked, rows now)
    changed: list[str] = field(default_factory=list)  # ok once, but its rows are not the checked ones
    failed: list[tuple[str, str]] = field(default_factory=list)  # (run, the first difference)
    unnamed: list[str] = field(default_factory=list)  # checked by a report without row digests
    dates: set[str] = field(default_factory=set)
    commits: set[str] = field(default_factory=set)
    warned: int = 0
    added: int = 0  # runs the verified data did not hold
    grown: int = 0  # runs with more evaluated rows now than the verified data held
    held: int = 0  # runs the verified data held
    data_commit: str = ""

    @property
    def checked(self) -> int:
        return len(self.rederived) + len(self.extended) + len(self.changed) + len(self.failed) \
            + len(self.unnamed)


def _text(value: Any, longest: int = 40) -> str:
    """A value from the report (a file someone may have edited) as short plain text."""
    text = " ".join(str(value).split())
    return text if len(text) <= longest else text[:longest - 1] + "…"


def coverage(report: dict[str, Any] | None, rows: pd.DataFrame) -> Coverage | None:
    """What ``report`` covers of ``rows`` (the rows a page shows); None without a report."""
    if not report or rows.empty:
        return None
    current = evaluated_rows(rows)
    out = Coverage(runs=rows["run_id"].nunique(), rows=sum(len(r) for r in current.values()))
    entries = report.get("runs", {})
    for run_id, now in sorted(current.items()):
        entry = entries.get(run_id)
        if not isinstance(entry, dict):
            continue
        out.dates.add(_text(entry.get("date", "?"), 10))
        out.commits.add(_text(entry.get("commit", "?"), 12))
        digest, factors = entry.get("digest"), entry.get("factors")
        if not isinstance(digest, str) or not digest:
            out.unnamed.append(run_id)
        elif entry.get("ok") is not True:
            out.failed.append((run_id, _text(entry.get("detail", ""), 200)))
        elif digest == rows_digest(now):
            out.rederived.append(run_id)
            out.covered_rows += len(now)
            out.warned += bool(entry.get("warning"))
        elif (kept := _checked_rows(now, factors)) is not None and rows_digest(kept) == digest:
            out.extended.append((run_id, len(kept), len(now)))
            out.covered_rows += len(kept)
        else:
            out.changed.append(run_id)
    data = report.get("data")
    if isinstance(data, dict) and isinstance(data.get("runs"), dict):
        held = data["runs"]
        out.data_commit, out.held = _text(data.get("commit", "?")), len(held)
        out.added = sum(run not in held for run in current)
        out.grown = sum(run in held and isinstance(held[run], int) and len(now) > held[run]
                        for run, now in current.items())
    return out if out.checked else None


def _checked_rows(now: pd.DataFrame, factors: Any) -> pd.DataFrame | None:
    """The current rows at the factors a check covered (None when one of them is gone)."""
    if not isinstance(factors, list):
        return None
    kept = now[now["factor"].isin(factors)]
    return kept if len(kept) == len(factors) else None


def _named(runs: list[str]) -> str:
    more = f" and {len(runs) - NAMED} more" if len(runs) > NAMED else ""
    return ", ".join(runs[:NAMED]) + more


def _runs(count: int) -> str:
    return f"{count} run{'' if count == 1 else 's'}"


def verification_clauses(report: dict[str, Any] | None, rows: pd.DataFrame) -> list[str] | None:
    """"k of n runs re-derived from their recorded configs with identical rows (m of r rows) on DATE
    at COMMIT", then one clause for each thing the verification no longer covers (runs checked on
    rows that have changed or grown since) and for what the data gained since it was verified; None
    when the report covers no run of ``rows``. The page shows the first clause and folds the others."""
    found = coverage(report, rows)
    if found is None:
        return None
    clauses = [f"{len(found.rederived)} of {found.runs} runs re-derived from their recorded configs with "
               f"identical rows (`lengthgen verify`, on {', '.join(sorted(found.dates))} at commit "
               f"{', '.join(sorted(found.commits))})",
               f"{found.covered_rows} of the {found.rows} evaluated rows here are rows it checked"]
    if found.extended:
        grown = [f"{run}, {before} → {now} rows" for run, before, now in found.extended]
        clauses.append(f"{_runs(len(found.extended))} extended since ({_named(grown)}): its checked rows are "
                       "unchanged, the newer ones not re-derived")
    if found.changed:
        clauses.append(f"{_runs(len(found.changed))} whose rows changed after the check, so no longer "
                       f"covered: {_named(found.changed)}")
    if found.failed:
        clauses.append(f"{len(found.failed)} did not match: " + ", ".join(
            f"{run} ({detail})" for run, detail in found.failed[:NAMED]))
    if found.unnamed:
        clauses.append(f"{_runs(len(found.unnamed))} checked by a report that does not name the rows it "
                       "checked, so not counted")
    if found.warned:
        clauses.append(f"{found.warned} within the tolerance for other library versions or processors")
    if found.added or found.grown:
        clauses.append(f"since the verified data (data commit {found.data_commit}, {_runs(found.held)}), "
                       f"{_runs(found.added)} added and {_runs(found.grown)} evaluated at more lengths")
    variant = rows["eval_variant"].fillna("").astype(str) != "" if "eval_variant" in rows else None
    if variant is not None and variant.any():
        clauses.append(f"rows of evaluation variants ({int(variant.sum())}) are not re-derived")
    return clauses


def verification_line(report: dict[str, Any] | None, rows: pd.DataFrame) -> str | None:
    """The clauses of :func:`verification_clauses` as one line (the README's and a table cell's)."""
    clauses = verification_clauses(report, rows)
    return None if clauses is None else "; ".join(clauses)
