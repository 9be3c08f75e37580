"""Strings from result rows are data: never a path, an element id, or a spreadsheet formula.

Task and backend names come from result folders that someone else may have written, so a name
like ``../../x`` or ``x"><script>`` must not become a file name or an HTML id as it is.
:func:`slug` gives the safe form (the name itself for ordinary names, so existing outputs keep
their names), :func:`neutralise` keeps a CSV cell from being read as a formula by a spreadsheet.
"""

from __future__ import annotations

import hashlib
import re

import pandas as pd

#: Names used as they are: letters, digits, ``_`` and ``-``, not too long. A slug made from any
#: other name carries a ``.`` before its hash, which these never contain, so slugs never collide.
_PLAIN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
#: First characters that make spreadsheets read a cell as a formula (tab and carriage return too).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def slug(name: str) -> str:
    """A file-name and element-id part for ``name``: the name itself when it is plain, else its
    plain characters (at most 40) then ``.`` and a hash of the whole name."""
    if _PLAIN.fullmatch(name):
        return name
    plain = re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_-")[:40] or "x"
    return f"{plain}.{hashlib.sha256(name.encode('utf-8', 'surrogatepass')).hexdigest()[:12]}"


def neutralise(cell: object) -> object:
    """A text cell that starts like a formula and is not a number, prefixed with ``'`` so that a
    spreadsheet shows it as text; anything else unchanged."""
    if isinstance(cell, str) and cell.startswith(FORMULA_STARTS) and not _NUMBER.fullmatch(cell):
        return "'" + cell
    return cell


def neutralise_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """Every text column of ``frame`` through :func:`neutralise`."""
    out = frame.copy()
    for column in out.columns:
        if not pd.api.types.is_numeric_dtype(out[column]) and not pd.api.types.is_bool_dtype(out[column]):
            out[column] = out[column].map(neutralise, na_action="ignore")
    return out
