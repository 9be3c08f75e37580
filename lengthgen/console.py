"""The terminal: output that always encodes, and every warning as one line, shown once.

Help texts, tables and messages use ×, ≥, ·, ▲ and Greek letters. A terminal whose encoding cannot
carry them (``PYTHONIOENCODING=ascii``, a Latin-1 console) gets ASCII spellings (``x``, ``>=``,
``*``, ``^``, ``alpha``) instead of a ``UnicodeEncodeError``; a file name with bytes that are not
UTF-8 is written back as those bytes, as ``ls`` does. Warnings from lengthgen and from the
libraries under it (matplotlib's ``warnings`` and its log messages alike) print as one
``warning: ...`` line each, and a line already shown is not repeated.
"""

from __future__ import annotations

import codecs
import logging
import sys
import unicodedata
import warnings
from typing import Any, TextIO

ERRORS = "lengthgen.ascii"

#: ASCII spellings of the symbols lengthgen prints (anything else: its NFKD letters, or ``?``).
ASCII: dict[str, str] = {
    "×": "x", "≥": ">=", "≤": "<=", "▲": "^", "▼": "v", "·": "*", "⋅": "*", "→": "->", "←": "<-",
    "—": "--", "–": "-", "−": "-", "…": "...", "∞": "inf", "√": "sqrt", "α": "alpha", "β": "beta",
    "γ": "gamma", "δ": "delta", "θ": "theta", "π": "pi", "σ": "sigma", "τ": "tau", "±": "+/-", "≈": "~",
    "⁻": "-", "¹": "1", "²": "2", "⁴": "4", "₊": "+", "‖": "||", "∈": "in", "⌊": "floor(", "⌋": ")",
}


def _spell(char: str) -> bytes:
    if "\udc80" <= char <= "\udcff":  # a byte that was not UTF-8 (a file name): write it back as is
        return bytes([ord(char) - 0xDC00])
    text = ASCII.get(char)
    if text is None:
        text = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode() or "?"
    return text.encode("ascii")


def _fallback(exc: UnicodeError) -> tuple[bytes, int]:
    """Codec error handler: the characters the stream cannot encode, spelt in ASCII."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return b"".join(_spell(c) for c in exc.object[exc.start:exc.end]), exc.end


codecs.register_error(ERRORS, _fallback)

#: ASCII under another name: click replaces a stream whose encoding is called ASCII by a UTF-8 one,
#: which would write bytes an ASCII terminal cannot show; under this name it writes ASCII.
ASCII_CODEC = "lengthgen_ascii"


def _search(name: str) -> codecs.CodecInfo | None:
    if name != ASCII_CODEC:
        return None
    ascii_info = codecs.lookup("ascii")
    return codecs.CodecInfo(ascii_info.encode, ascii_info.decode, ascii_info.streamreader,
                            ascii_info.streamwriter, ascii_info.incrementalencoder,
                            ascii_info.incrementaldecoder, name=ASCII_CODEC)


codecs.register(_search)


def safe_streams(*streams: TextIO) -> None:
    """Make ``streams`` (default: stdout and stderr) spell what they cannot encode."""
    for stream in streams or (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is None:
            continue
        try:
            ascii_only = codecs.lookup(stream.encoding or "ascii").name == "ascii"
            reconfigure(errors=ERRORS, **({"encoding": ASCII_CODEC} if ascii_only else {}))
        except (ValueError, OSError, LookupError):  # a closed or detached stream: leave it
            pass


def one_line(text: str) -> str:
    return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


_shown: set[str] = set()


def warn_line(text: str) -> None:
    """Print ``warning: <text>`` on stderr as one line, unless that line was shown already."""
    line = f"warning: {one_line(text)}"
    if line not in _shown:
        _shown.add(line)
        print(line, file=sys.stderr, flush=True)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    warn_line(str(message))


class _OneLineHandler(logging.Handler):
    """Library log records of level WARNING and up, as warning lines."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            warn_line(record.getMessage())
        except Exception:  # a logging handler must never raise
            self.handleError(record)


def capture_warnings() -> None:
    """Every Python warning and every library log warning prints as one line, once."""
    warnings.showwarning = _show_warning
    root = logging.getLogger()
    if not any(isinstance(h, _OneLineHandler) for h in root.handlers):
        handler = _OneLineHandler(logging.WARNING)
        root.addHandler(handler)
