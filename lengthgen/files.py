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

A set of files that belong together (a leaderboard: pages and the figures they show) goes through
:func:`publish`: every path is checked first, the set is built in a temporary folder, then moved
into place, so an interrupted or failed command leaves the previous set, or nothing.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import signal
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from lengthgen.errors import UserError

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
    tmp = target.parent / temporary_name(target.name)
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


#: The longest file name (in bytes) common file systems take.
NAME_MAX = 255


def temporary_name(name: str) -> str:
    """``.<name>.<random>.tmp``, the name shortened so that the temporary name is legal whenever
    ``name`` is (a long legal name plus the prefix and suffix could pass the limit)."""
    suffix = f".{secrets.token_hex(4)}.tmp".encode()
    raw = os.fsencode(name)[: NAME_MAX - 1 - len(suffix)]
    return os.fsdecode(b"." + raw + suffix)


def read_text(path: str | os.PathLike[str], *, links: bool = True, limit: int | None = None) -> str:
    """A text file lengthgen did not necessarily write (``config.json``, ``ABOUT.md``): UTF-8, or a
    one-line :class:`UserError` that names the file and the first byte that is not.

    Only a regular file is read (a FIFO would block forever, a device never end), of at most
    ``limit`` bytes; with ``links=False`` a symbolic link is refused, not followed: a file in a
    folder someone else wrote must not lead outside it (``SOURCE.md`` → a secret shown on a page).
    A missing file raises ``FileNotFoundError`` as ``open`` does."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | (0 if links else getattr(os, "O_NOFOLLOW", 0))
    if not links and os.path.islink(path):  # also where the system has no O_NOFOLLOW
        raise UserError(f"{path} is a symbolic link: lengthgen does not read files through links in a "
                        "folder it did not write")
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and not links:
            raise UserError(f"{path} is a symbolic link: lengthgen does not read files through links in "
                            "a folder it did not write") from None
        raise
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{path} is not a regular file")
        if limit is not None and info.st_size > limit:
            raise UserError(f"{path} is {info.st_size:,} bytes, over the limit of {limit:,} for a text file")
        data = handle.read() if limit is None else handle.read(limit + 1)
    if limit is not None and len(data) > limit:  # grew while being read
        raise UserError(f"{path} is over the limit of {limit:,} bytes for a text file")
    try:
        return data.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")  # as text mode reads
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at position "
                        f"{exc.start}); save it as UTF-8") from None


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
            except FileNotFoundError:  # removed already
                continue
            except OSError:  # not empty: leave it and its parents
                break
        raise


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block is done (main thread only), then take effect:
    for the few renames that publish a set of files together."""
    received: list[int] = []

    def handler(signum: int, frame: object) -> None:
        received.append(signum)

    try:
        previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: signals cannot be handled here anyway
        yield
        return
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)
        if received:
            signal.raise_signal(received[0])


def check_outputs(root: Path, names: Iterable[str]) -> list[Path]:
    """The paths of ``names`` under ``root``, checked before anything is written: each stays
    inside ``root`` and every folder on its way is a writable folder (or does not exist yet)."""
    paths = []
    for name in names:
        relative = PurePosixPath(name)
        if not name or relative.is_absolute() or any(p in ("", ".", "..") for p in relative.parts) \
                or "\\" in name or "\x00" in name:
            raise ValueError(f"output name {name!r} would leave {root}")
        path = root.joinpath(*relative.parts)
        for folder in [root, *(root.joinpath(*relative.parts[:i]) for i in range(1, len(relative.parts)))]:
            if os.path.lexists(folder) and not folder.is_dir():
                raise UserError(f"cannot write {path}: {folder} is a file, not a folder")
            if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
                raise UserError(f"cannot write {path}: {folder} is not writable")
        if path.is_dir():
            raise UserError(f"cannot write {path}: it is a folder")
        paths.append(path)
    return paths


def publish(root: str | os.PathLike[str], files: Mapping[str, bytes]) -> list[Path]:
    """Write ``files`` (relative name → bytes) under ``root`` so that readers see the old set or
    the new one, never a half-written set; returns the paths, in name order.

    Everything is checked (:func:`check_outputs`), then written into a temporary folder: beside
    ``root`` when ``root`` does not exist yet (one rename then creates it whole), else inside it
    (the files then replace the old ones in a few renames that Ctrl-C and SIGTERM do not
    interrupt; files in sub-folders first, so a page never names a figure that is not there). On
    any failure the temporary folder is removed and ``root`` is left as it was.
    """
    target = Path(root)
    names = sorted(files)
    paths = check_outputs(target, names)
    fresh = not os.path.lexists(target)
    stage_parent = target.parent if fresh else target
    stage = stage_parent / temporary_name(target.name if fresh else "publish")
    with new_folder(stage_parent):
        try:
            for name in names:
                atomic_write(stage.joinpath(*PurePosixPath(name).parts), files[name])
            with signals_deferred():
                if fresh:
                    os.rename(stage, target)
                else:
                    for name in sorted(names, key=lambda n: (-n.count("/"), n)):
                        destination = target.joinpath(*PurePosixPath(name).parts)
                        destination.parent.mkdir(parents=True, exist_ok=True)
                        os.replace(stage.joinpath(*PurePosixPath(name).parts), destination)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
    for folder in sorted({p.parent for p in paths}):
        _sync_folder(folder)
    _sync_folder(target.parent)
    return paths
