"""Paths the user gives (``--out``, ``-o``, a results folder), checked before any work starts.

The command line and the Python API share these checks, so ``lengthgen.run(out="")`` is refused
with the same one-line :class:`~lengthgen.errors.UserError` as ``lengthgen run --out ""``. A path
must be text (its bytes valid UTF-8: it is printed, and written into pages and commands), and an
output folder must be creatable where it is: not under a file, a dangling symbolic link or a
link loop, and in a writable folder. Nothing is created here: a refused command leaves nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from lengthgen.errors import UserError


def _text(path: Any, flag: str) -> str:
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if not isinstance(path, str):
        raise UserError(f"{flag} must be a path (text), got {path!r}")
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise UserError(f"{flag} {shown}: the path is not valid UTF-8; rename it or choose another") from None
    return path


def input_path(path: Any, flag: str) -> Path:
    """A path to read from, as text (it need not exist: the reader says so)."""
    return Path(_text(path, flag))


def folder_for_writing(path: Any, flag: str) -> Path:
    """``path`` as an output folder, checked before any work starts (it is created later, when
    the first file is written, so a refused command leaves nothing behind)."""
    text = _text(path, flag)
    if not text.strip():
        example = f"{flag} runs" if flag.startswith("-") else f"{flag}='runs'"
        raise UserError(f"{flag} is empty: give a folder (e.g. {example})")
    folder = Path(text)
    probe = folder
    while not probe.exists() and probe != probe.parent:
        if probe.is_symlink():
            raise UserError(f"{flag} {text}: {probe} is a symbolic link that leads nowhere (a loop or a "
                            "missing target)")
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{flag} {text}: {probe} is a file, not a folder")
    if not os.access(probe, os.R_OK | os.W_OK | os.X_OK):
        raise UserError(f"{flag} {text}: {probe} is not writable (permission denied or read-only)")
    return folder


def file_for_writing(path: Any, flag: str) -> Path:
    """``path`` as an output file: not a folder, in a folder that can be written."""
    text = _text(path, flag)
    if not text.strip():
        raise UserError(f"{flag} is empty: give a file name")
    target = Path(text)
    if target.is_dir():
        raise UserError(f"{flag} {text} is a folder: give a file name (e.g. {target / 'plot.png'})")
    if target.is_symlink() and not target.exists():
        raise UserError(f"{flag} {text} is a symbolic link that leads nowhere (a loop or a missing target)")
    folder_for_writing(str(target.parent), flag)
    return target


def shown(path: Any) -> str:
    """A path as the commands print it, one style everywhere: relative to the working folder when it
    lies inside it (as the user typed it), else absolute."""
    resolved = Path(path).resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(resolved)
