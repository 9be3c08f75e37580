"""Result folders from several sources on one board, each row labelled with where it came from.

The first folder is the board's own; every other one is a submission, and a submission is input
to check, never to trust:

- it describes itself in ``source.toml`` (``name``, ``who``, ``what``, ``contact``, ``commit``: one
  line of text each, of bounded length) or ``SOURCE.md`` (its ``# name`` line, then free text),
  otherwise its folder name is its label; neither file is read through a symbolic link;
- its rows are read through the same validated reader as the board's own, and its backends carry
  its label (``softmax @ alice``), so a submitted run never merges with, or hides, one of ours,
  and never appears in a row labelled as ours (the paper-protocol rows are ours alone);
- a run it shares with an earlier folder (the same run id: the same config and seed) must hold
  the same rows: an identical copy merges silently, a copy that disagrees in any column of
  :data:`COMPARED` is flagged (a warning naming both folders and the first differing column, and
  a mark on the page) and kept apart under its label;
- a folder that cannot be used (a refused ``source.toml``, a label another folder has, no usable
  rows) is skipped with one warning, and the board is built from the rest;
- its own ``verify.json`` is never read: only the board's report says what was re-derived.
"""

from __future__ import annotations

import dataclasses
import unicodedata
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen import limits
from lengthgen.config import parse_toml
from lengthgen.errors import UserError, UserNotice
from lengthgen.files import read_text
from lengthgen.harness.recorded.verify import IDENTITY, METRICS, comparable, read_report
from lengthgen.harness.storage.results import load_results
from lengthgen.leaderboard.tables import Cell, Header, Row, Table
from lengthgen.leaderboard.verified import verification_line

#: What a source.toml may say about its folder, each a line of text of at most this many characters.
FIELDS: dict[str, int] = {"name": 64, "who": 200, "what": 2000, "contact": 200, "commit": 64}
#: The columns two copies of one run must agree on (what ``lengthgen verify`` compares): a
#: submission cannot change one of them in a run the board already holds without being flagged.
COMPARED: tuple[str, ...] = (*IDENTITY, *METRICS)
#: How the sources table marks the board's own folder (a submission's label may not say it).
PRIMARY_MARK = "this board"
#: The columns that name one row of a run.
ROW_KEY: tuple[str, ...] = ("factor", "eval_variant", "status")


@dataclass(frozen=True)
class Conflict:
    """A run two folders both hold, whose copies differ."""

    run_id: str
    first: str  # the label of the folder whose copy the board shows as the run
    where: str  # "exact_match at 1×"
    values: tuple[Any, Any]  # (first folder's, this folder's)

    def line(self, label: str) -> str:
        return (f"run {self.run_id}: {self.first} and {label} disagree on {self.where} ({self.values[0]!r} "
                f"vs {self.values[1]!r}); `lengthgen verify` re-derives it to settle which is right")


@dataclass(frozen=True)
class Source:
    label: str
    path: str
    who: str = ""
    what: str = ""
    contact: str = ""
    commit: str = ""
    primary: bool = False
    conflicts: tuple[Conflict, ...] = field(default=())
    merged: int = 0  # runs whose copy here was identical to an earlier folder's, shown once


def _field(name: str, value: Any, where: Path) -> str:
    """One field of a source description: text, one line, within its length."""
    if not isinstance(value, str):
        raise UserError(f"{where}: {name} must be text, got {type(value).__name__}")
    longest = FIELDS[name]
    if not limits.is_line(value, longest) or value != value.strip():
        raise UserError(f"{where}: {name} must be one line of at most {longest} characters, without "
                        f"control characters or surrounding spaces (got {len(value):,} characters)")
    return value


def describe_folder(path: str, primary: bool = False) -> Source:
    """A folder's ``source.toml`` or ``SOURCE.md``, else its name; a one-line UserError when the
    description cannot be used (its file a link, not TOML, a field of another type or too long)."""
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent
    toml_file, markdown = folder / "source.toml", folder / "SOURCE.md"
    fields: dict[str, str] = {}
    if toml_file.is_file() or toml_file.is_symlink():
        data = parse_toml(read_text(toml_file, links=False, limit=limits.MAX_TEXT_BYTES), str(toml_file))
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise UserError(f"{toml_file}: unknown field {unknown[0][:40]!r}; fields: {', '.join(FIELDS)}")
        fields = {k: _field(k, v, toml_file) for k, v in data.items()}
    elif markdown.is_file() or markdown.is_symlink():
        lines = read_text(markdown, links=False, limit=limits.MAX_TEXT_BYTES).splitlines()
        title = next((line[2:].strip() for line in lines if line.startswith("# ")), "")
        text = " ".join(line.strip() for line in lines if line.strip() and not line.startswith("# "))
        fields = {k: _field(k, v, markdown) for k, v in (("name", title), ("what", text)) if v}
    label = fields.get("name") or _folder_label(folder)
    return Source(label=label, path=str(path), who=fields.get("who", ""), what=fields.get("what", ""),
                  contact=fields.get("contact", ""), commit=fields.get("commit", ""), primary=primary)


def _folder_label(folder: Path) -> str:
    """A folder's name as its label: shortened and without control characters when need be."""
    name = limits.CONTROL.sub("?", folder.resolve().name)
    return name if len(name) <= FIELDS["name"] else name[:FIELDS["name"] - 1] + "…"


def _same_label(label: str) -> str:
    """Labels that read alike are one label (``base`` and ``Base``, ``ｂａｓｅ``)."""
    return " ".join(unicodedata.normalize("NFKC", label).casefold().split())


def _skip(path: str, reason: str) -> None:
    warnings.warn(f"skipped submission {path}: {reason}", UserNotice, stacklevel=3)


def load_sources(paths: Sequence[str]) -> tuple[pd.DataFrame, list[Source]]:
    """The rows of every usable folder with a ``source`` column (empty for the first, the board's
    own), and the folders' descriptions; a submission that cannot be used is skipped with one
    warning (the caller decides what an empty result means)."""
    sources: list[Source] = []
    frames: list[pd.DataFrame] = []
    held: dict[str, tuple[str, pd.DataFrame]] = {}  # run id → (label, rows) of the copy shown as the run
    for index, path in enumerate(paths):
        primary = index == 0
        try:
            source = describe_folder(path, primary)
        except UserError as exc:
            if not primary:
                _skip(path, str(exc))
                continue
            warnings.warn(f"{exc}; the board's own folder is labelled by its name", UserNotice, stacklevel=2)
            source = Source(_folder_label(Path(path)), str(path), primary=True)
        if not primary and PRIMARY_MARK in _same_label(source.label):
            _skip(path, f"its label {source.label!r} says it is this board's own folder, which only the "
                        "first folder is")
            continue
        taken = next((s.label for s in sources if _same_label(s.label) == _same_label(source.label)), None)
        if taken is not None:
            _skip(path, f"its label {source.label!r} is already that of another folder ({taken!r}, compared "
                        "ignoring case and spaces); give each folder its own name in its source.toml")
            continue
        try:
            rows = load_results(source.path)
        except UserError as exc:
            if primary:
                raise
            _skip(path, str(exc))
            continue
        if rows.empty:
            if not primary:
                _skip(path, "no usable results")
                continue
            sources.append(source)
            continue
        rows, conflicts, merged = _against_earlier(rows, source.label, held)
        sources.append(dataclasses.replace(source, conflicts=tuple(conflicts), merged=merged))
        for conflict in conflicts:
            warnings.warn(conflict.line(source.label), UserNotice, stacklevel=2)
        if not rows.empty:
            frames.append(rows.assign(source="" if primary else source.label))
    if not frames:
        return pd.DataFrame(), sources
    return pd.concat(frames, ignore_index=True), sources


def _against_earlier(rows: pd.DataFrame, label: str, held: dict[str, tuple[str, pd.DataFrame]]
                     ) -> tuple[pd.DataFrame, list[Conflict], int]:
    """This folder's rows without the runs an earlier folder holds identically (merged), its
    conflicts with earlier copies, and how many runs merged; records its other runs in ``held``."""
    keep = pd.Series(True, index=rows.index)
    conflicts, merged = [], 0
    for run_id, mine in rows.groupby("run_id", sort=True):
        run = str(run_id)
        if run not in held:
            held[run] = (label, mine)
            continue
        first, theirs = held[run]
        difference = copies_differ(theirs, mine)
        if difference is not None:
            conflicts.append(Conflict(run, first, *difference))
        elif _keys(mine) <= _keys(theirs):
            keep[mine.index] = False
            merged += 1
    return rows[keep], conflicts, merged


def _keys(rows: pd.DataFrame) -> set[tuple[Any, ...]]:
    return {tuple(comparable(v) for v in key) for key in rows[list(ROW_KEY)].itertuples(index=False)}


def copies_differ(first: pd.DataFrame, other: pd.DataFrame) -> tuple[str, tuple[Any, Any]] | None:
    """Where two copies of a run first differ, over the rows both hold, in :data:`COMPARED`:
    ("exact_match at 1×", (first's value, other's value)); None when they agree."""
    index = {tuple(comparable(v) for v in key): i
             for i, key in zip(first.index, first[list(ROW_KEY)].itertuples(index=False), strict=True)}
    for i, key in zip(other.index, other[list(ROW_KEY)].itertuples(index=False), strict=True):
        match = index.get(tuple(comparable(v) for v in key))
        if match is None:
            continue
        for column in COMPARED:
            a, b = comparable(first.at[match, column]), comparable(other.at[i, column])
            if a != b:
                factor, variant, _ = key
                at = f" at {comparable(factor)}×" if comparable(factor) is not None else ""
                return f"{column}{at}{f' [{variant}]' if variant else ''}", (a, b)
    return None


def source_column(rows: pd.DataFrame) -> pd.Series:
    """Each row's source label ("" for the board's own rows)."""
    return rows["source"].fillna("").astype(str) if "source" in rows else pd.Series("", index=rows.index)


def conflict_lines(sources: Sequence[Source]) -> list[str]:
    """One line per run two folders hold with different rows (the page lists them under Sources)."""
    return [c.line(s.label) for s in sources for c in s.conflicts]


def sources_table(rows: pd.DataFrame, sources: Sequence[Source]) -> Table:
    """One line per result folder: its label, who sent it, what and from which commit, its runs,
    how many of them this board's ``verify.json`` re-derived (a folder's own report is never read),
    and the runs whose copies disagree with an earlier folder's."""
    headers = (Header("source"), Header("folder"), Header("who"), Header("what"), Header("contact"),
               Header("commit", "the submitter's commit, as its source.toml states it"),
               Header("runs", numeric=True),
               Header("re-derived", "what this board's verify.json says of these rows (a submitted "
                                    "folder's own report is not taken)"),
               Header("conflicts", "runs an earlier folder also holds, with different rows: `lengthgen "
                                   "verify` settles which copy is right"))
    primary = next((s for s in sources if s.primary), None)
    report = read_report(primary.path) if primary is not None else None
    body = []
    column = source_column(rows)
    for source in sources:
        mine = rows[column == ("" if source.primary else source.label)]
        run_ids = mine["run_id"].dropna().astype(str)
        line = verification_line(report, mine) or "not verified"
        clash = "; ".join(f"⚠ {c.run_id}: {c.where} differs from the copy in {c.first}"
                          for c in source.conflicts)
        if source.merged:
            clash = "; ".join(filter(None, [clash, f"{source.merged} runs identical to an earlier folder's, "
                                                   "shown once"]))
        label = source.label + (f" ({PRIMARY_MARK})" if source.primary else "")
        body.append(Row((Cell(label), Cell(source.path), Cell(source.who), Cell(source.what),
                         Cell(source.contact), Cell(source.commit),
                         Cell(str(run_ids.nunique()), float(run_ids.nunique())), Cell(line),
                         Cell(clash or "none"))))
    return Table(headers, tuple(body), label="result folders on this board")
