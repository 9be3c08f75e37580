"""Result folders from several sources on one board, each row labelled with where it came from.

The first folder is the board's own; every other one is a submission. A folder describes itself in
``source.toml`` (``name``, ``who``, ``what``, ``contact``, ``commit``) or ``SOURCE.md`` (its
``# name`` line, then free text); otherwise its folder name is its label. Rows of a submission are
read through the same validated reader as the board's own (a row whose config does not hash to its
run, for one, is refused with a warning), and their backends carry the source's label
(``softmax @ alice``), so a submitted run never merges with, or hides, one of ours.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lengthgen.errors import UserError
from lengthgen.harness.results import load_results
from lengthgen.harness.verify import read_report
from lengthgen.leaderboard.tables import Cell, Header, Row, Table
from lengthgen.leaderboard.verified import verification_line

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

#: What a source.toml may say about its folder.
FIELDS: tuple[str, ...] = ("name", "who", "what", "contact", "commit")


@dataclass(frozen=True)
class Source:
    label: str
    path: str
    who: str = ""
    what: str = ""
    contact: str = ""
    commit: str = ""
    primary: bool = False


def describe_folder(path: str, primary: bool = False) -> Source:
    """A folder's ``source.toml`` or ``SOURCE.md``, else its name."""
    folder = Path(path)
    folder = folder if folder.is_dir() else folder.parent
    toml_file, markdown = folder / "source.toml", folder / "SOURCE.md"
    fields: dict[str, str] = {}
    if toml_file.is_file():
        try:
            data = tomllib.loads(toml_file.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"{toml_file}: not a valid TOML file ({exc})") from None
        unknown = sorted(set(data) - set(FIELDS))
        if unknown:
            raise UserError(f"{toml_file}: unknown field {unknown[0]!r}; fields: {', '.join(FIELDS)}")
        fields = {k: str(v) for k, v in data.items()}
    elif markdown.is_file():
        lines = markdown.read_text(encoding="utf-8", errors="replace").splitlines()
        title = next((line[2:].strip() for line in lines if line.startswith("# ")), "")
        text = " ".join(line.strip() for line in lines if line.strip() and not line.startswith("# "))
        fields = {"name": title, "what": text}
    label = fields.get("name") or folder.resolve().name
    return Source(label=label, path=str(path), who=fields.get("who", ""), what=fields.get("what", ""),
                  contact=fields.get("contact", ""), commit=fields.get("commit", ""), primary=primary)


def load_sources(paths: Sequence[str]) -> tuple[pd.DataFrame, list[Source]]:
    """The rows of every folder with a ``source`` column (empty for the first, the board's own)."""
    sources = [describe_folder(p, primary=i == 0) for i, p in enumerate(paths)]
    labels = [s.label for s in sources]
    if len(set(labels)) != len(labels):
        twice = sorted({x for x in labels if labels.count(x) > 1})[0]
        raise UserError(f"two result folders are both labelled {twice!r}: give each a name in its "
                        "source.toml")
    frames = []
    for source in sources:
        rows = load_results(source.path)
        if not rows.empty:
            frames.append(rows.assign(source="" if source.primary else source.label))
    if not frames:
        return pd.DataFrame(), sources
    return pd.concat(frames, ignore_index=True), sources


def source_column(rows: pd.DataFrame) -> pd.Series:
    """Each row's source label ("" for the board's own rows)."""
    return rows["source"].fillna("").astype(str) if "source" in rows else pd.Series("", index=rows.index)


def sources_table(rows: pd.DataFrame, sources: Sequence[Source]) -> Table:
    """One line per result folder: its label, who sent it, what and from which commit, its runs,
    and how many of them were re-derived (its own ``verify.json``)."""
    headers = (Header("source"), Header("folder"), Header("who"), Header("what"), Header("contact"),
               Header("commit", "the submitter's commit, as its source.toml states it"),
               Header("runs", numeric=True),
               Header("re-derived", "what lengthgen verify's report beside the data says"))
    body = []
    column = source_column(rows)
    for source in sources:
        mine = rows[column == ("" if source.primary else source.label)]
        run_ids = mine["run_id"].dropna().astype(str)
        line = verification_line(read_report(source.path), run_ids) or "not verified"
        body.append(Row((Cell(source.label + (" (this board)" if source.primary else "")), Cell(source.path),
                         Cell(source.who), Cell(source.what), Cell(source.contact), Cell(source.commit),
                         Cell(str(run_ids.nunique()), float(run_ids.nunique())), Cell(line))))
    return Table(headers, tuple(body), label="result folders on this board")
