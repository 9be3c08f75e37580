"""The one user-error type, and the one warning type meant for users.

Anything the user can fix (an unknown name, a bad value, an impossible combination, a folder that
cannot be written) raises :class:`UserError` or a subclass, with a one-line message that names the
valid choices. The command line turns every one of them into ``error: <message>`` and exit code 2
in a single place (``lengthgen.output.OneLineErrors``, the command line's command group); Python
callers catch ``UserError``.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input or an unusable path, explained in one line; never a bug in lengthgen."""


class UserNotice(UserWarning):
    """A warning for users, not developers (a skipped plugin, an unreadable results file):
    the command line prints it as one ``warning: ...`` line without a source location."""


def exception_line(exc: BaseException) -> str:
    """``Type: first line of the message``: how a caught exception is reported in one line (the
    error of a failed run's row, a broken plugin in a listing, a skipped file)."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
