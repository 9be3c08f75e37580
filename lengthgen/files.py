"""The one way lengthgen writes a file: atomically, with the user's permissions.

Every file the tool produces (results, configs, checkpoints, plots, leaderboard pages, error
reports) goes through :func:`atomic_write`: the bytes go to a dot-prefixed temporary file in the
target's folder, are flushed to disk, and the file is renamed over the target. A reader therefore
sees the old file or the new one, never half of one; a failure (a full disk, Ctrl-C) removes the
temporary file and leaves the target as it was. Readers skip dot-prefixed files, so even the
temporary file of a hard kill (SIGKILL, power loss) is never mistaken for a result.

The file is created the way ``open()`` creates one, with mode 0o666 less the umask, so results
are as readable to colleagues as any other file of the user (``tempfile.mkstemp`` would make
them private, 0o600).
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

#: What can be written: bytes, text (UTF-8), or a function that writes into a binary file handle
#: (``lambda f: torch.save(obj, f)``, ``frame.to_parquet``, ``lambda f: fig.savefig(f, format="png")``).
Payload = bytes | str | Callable[[BinaryIO], object]


def atomic_write(path: str | os.PathLike[str], data: Payload) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename); returns the path.

    Missing parent folders are created. Raises ``OSError`` (no space, no permission, the target is
    a folder) after removing the temporary file.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        with os.fdopen(fd, "wb") as handle:
            if isinstance(data, bytes):
                handle.write(data)
            elif isinstance(data, str):
                handle.write(data.encode("utf-8"))
            else:
                data(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        if exc.filename in (None, str(tmp)):  # name the file the user asked for, not the temporary
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _sync_folder(target.parent)
    return target


def _sync_folder(folder: Path) -> None:
    """Make the rename itself durable (POSIX); harmless where folders cannot be opened."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def new_folder(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Create ``path`` (with its parents) for the block; if the block fails, remove again the
    folders this created that are still empty, so a failed command leaves no empty folder."""
    folder = Path(path)
    missing: list[Path] = []
    probe = folder
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    folder.mkdir(parents=True, exist_ok=True)
    try:
        yield folder
    except BaseException:
        for created in missing:  # deepest first
            try:
                created.rmdir()
            except OSError:  # not empty (or gone): leave it and its parents
                break
        raise
