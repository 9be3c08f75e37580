"""Which code made the board's rows: every commit, with the runs and rows it made, the runs whose
rows come from several commits, and how many rows say which processor and instruction sets made
them. A page that names only some commits would let a reader believe one code made every row.
"""

from __future__ import annotations

import pandas as pd

from lengthgen.leaderboard.stats import is_missing
from lengthgen.leaderboard.tables import Cell, Header, Row, Table

#: Shown for rows that record no commit (made from an installed copy, or before the column).
UNRECORDED = "not recorded"


def commit_label(commit: object, dirty: object) -> str:
    if not isinstance(commit, str) or not commit:
        return UNRECORDED
    return commit[:10] + (" + local changes" if not is_missing(dirty) and bool(dirty) else "")


def _labels(rows: pd.DataFrame) -> pd.Series:
    return pd.Series([commit_label(c, d) for c, d in zip(rows["git_commit"], rows["git_dirty"], strict=True)],
                     index=rows.index)


def mixed_runs(rows: pd.DataFrame) -> list[str]:
    """Runs whose rows were made by more than one commit (a run extended later by ``lengthgen
    eval``, or a failed run recorded again), sorted."""
    labels = _labels(rows)
    return sorted(str(r) for r, n in labels.groupby(rows["run_id"]).nunique().items() if n > 1)


def _joined(values: pd.Series) -> str:
    items = sorted({str(int(v)) for v in values.dropna()})
    return ", ".join(items) if items else "—"


def commits_table(rows: pd.DataFrame) -> Table:
    """A line per commit that made rows: its runs (and how many of them also hold rows of another
    commit), rows, numerics versions, thread counts and dates."""
    labels = _labels(rows)
    mixed = set(mixed_runs(rows))
    body = []
    for label, part in sorted(rows.groupby(labels), key=lambda kv: str(kv[1]["created_at"].min())):
        runs = set(part["run_id"].astype(str))
        dates = sorted(str(v)[:10] for v in part["created_at"].dropna())
        span = (dates[0] if dates[0] == dates[-1] else f"{dates[0]} … {dates[-1]}") if dates else "—"
        shared = len(runs & mixed)
        body.append(Row((
            Cell(str(label)), Cell(str(len(runs)), float(len(runs))),
            Cell(str(shared), float(shared), "runs that also hold rows made by another commit"),
            Cell(str(len(part)), float(len(part))), Cell(_joined(part["numerics_version"])),
            Cell(_joined(part["torch_threads"])), Cell(span))))
    headers = (Header("commit", "the checkout's git commit when the rows were made"),
               Header("runs", "runs with at least one row from this commit", numeric=True),
               Header("shared", "of those, runs that also hold rows of another commit", numeric=True),
               Header("rows", numeric=True),
               Header("numerics", "numerics version: bumped whenever a change of code changes any result"),
               Header("threads", "torch threads of the process that made the rows"),
               Header("made", "dates of the rows (UTC)"))
    return Table(headers, tuple(body), label="the commits that made the rows")


def provenance_lines(rows: pd.DataFrame) -> list[str]:
    """What the commits table implies, in words: mixed runs and why they are sound, and how many
    rows record the processor and its instruction sets."""
    runs = rows["run_id"].nunique()
    mixed = mixed_runs(rows)
    lines = []
    if mixed:
        part = rows[rows["run_id"].isin(mixed)]
        versions = _joined(part["numerics_version"])
        labels = _labels(part)
        disjoint = all(
            not set.intersection(*[set(g["factor"].dropna()) for _, g in run.groupby(labels[run.index])])
            for _, run in part.groupby("run_id"))
        how = ("no length of a run was recorded by two commits: a later commit only added lengths "
               if disjoint else "some lengths were recorded by two commits ")
        lines.append(
            f"{len(mixed)} of {runs} runs hold rows from more than one commit, the training of each recorded "
            f"once: {how}(`lengthgen eval` scores the saved model at new lengths; `--restore` retrains a run "
            "whose model is gone only when it reproduces the run's recorded rows). Their rows carry numerics "
            f"version {versions}: no commit between them changed a result.")
    for column, what in (("cpu", "the processor"), ("cpu_isa", "its instruction sets (torch and numba)")):
        has = int(rows[column].notna().sum()) if column in rows else 0
        share = 100 * has / max(1, len(rows))
        lines.append(f"{has} of {len(rows)} rows ({share:.0f}%) record {what}; every row made since the "
                     "column existed does.")
    return lines
