"""Progress that reads well where it lands: a live bar in a terminal, a few lines in a log.

tqdm redraws its bar with carriage returns, which a terminal overwrites but a log file keeps: one
1,500-step run wrote thousands of updates into a ``nohup`` log. So without a terminal on stderr,
a long loop reports a line every tenth of the way or every 30 seconds, whichever comes first, with
its position, rate and the figures it was given (loss, accuracy); loops meant only for a live
display (one evaluation length) stay silent there and say one line when done (:func:`log_line`).
A run inside a sweep shows ``"log"`` progress: nothing in a terminal, whose one bar is the
sweep's, and a line every tenth of its training and one per evaluated length in a log, so a log
of hour-long runs says where each stands without growing by a line every 30 s.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Literal, Protocol, TextIO

#: A log line at least every 1/this of the loop (counted in whole steps, so exactly every tenth) …
PARTS = 10
#: … or every this many seconds, whichever comes first.
EVERY_SECONDS = 30.0

#: How a loop shows its progress: True (a bar in a terminal, lines in a log), False (nothing), or
#: "log" (lines at each tenth in a log only: a run inside a sweep).
Shown = bool | Literal["log"]


class Progress(Protocol):
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **values: Any) -> None: ...
    def write(self, line: str) -> None: ...
    def close(self) -> None: ...


class Silent:
    """No display at all (``--quiet``, or a live-only bar in a log)."""

    def __init__(self, file: TextIO | None = None) -> None:
        self.file = file

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix(self, **values: Any) -> None:
        pass

    def write(self, line: str) -> None:
        print(line, file=self.file or sys.stderr, flush=True)

    def close(self) -> None:
        pass


class LogLines:
    """A line now and then, never a carriage return: ``train copy/softmax: 300/1500 steps (20%),
    11.8 steps/s, loss=0.123``."""

    def __init__(self, total: int, desc: str, unit: str, file: TextIO | None = None,
                 every_seconds: float | None = EVERY_SECONDS) -> None:
        self.total, self.desc, self.unit, self.every_seconds = total, desc, unit, every_seconds
        self.file = file or sys.stderr
        self.done = self.start_done = 0
        self.postfix: dict[str, Any] = {}
        self.start = self.last_time = time.perf_counter()
        self.last_done = 0

    def update(self, n: int = 1) -> None:
        self.done += n
        now = time.perf_counter()
        due = (self.done - self.last_done) * PARTS >= self.total or (
            self.every_seconds is not None and now - self.last_time >= self.every_seconds)
        if due or self.done >= self.total:
            self.last_done, self.last_time = self.done, now
            self.write(self._line(now))

    def _line(self, now: float) -> str:
        elapsed = max(now - self.start, 1e-9)
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        figures = "".join(f", {k}={v}" for k, v in self.postfix.items())
        rate = (self.done - self.start_done) / elapsed
        return f"{self.desc}: {self.done}/{self.total} {self.unit}{share}, {rate:.2g} {self.unit}/s{figures}"

    def set_postfix(self, **values: Any) -> None:
        self.postfix = {k: v for k, v in values.items() if k != "refresh"}

    def write(self, line: str) -> None:
        print(line, file=self.file, flush=True)

    def close(self) -> None:
        pass


def in_terminal(file: TextIO | None = None) -> bool:
    stream = file or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def format_seconds(seconds: float | None) -> str:
    """A duration as a log or a plan listing shows it: ``45 s``, ``29 min``, ``2.2 h``."""
    if seconds is None:
        return "unknown"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def log_line(line: str, enabled: Shown = True, file: TextIO | None = None) -> None:
    """``line`` in a log only: a terminal already shows the live bar, and a long evaluation length
    that is silent in a log (``live_only``) would otherwise say nothing for an hour."""
    if enabled and not in_terminal(file):
        print(line, file=file or sys.stderr, flush=True)


def display(total: int, desc: str, *, enabled: Shown = True, unit: str = "it", live_only: bool = False,
            leave: bool = True, initial: int = 0) -> Progress:
    """A tqdm bar in a terminal; in a log, :class:`LogLines` (or nothing for ``live_only`` loops);
    ``enabled="log"``: nothing in a terminal, a line every tenth of the way in a log."""
    if not enabled:
        return Silent()
    if in_terminal():
        if enabled == "log":
            return Silent()
        from tqdm.auto import tqdm

        return tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, leave=leave, smoothing=0.1,
                    initial=initial)
    if live_only:
        return Silent()
    lines = LogLines(total, desc, unit, every_seconds=None if enabled == "log" else EVERY_SECONDS)
    lines.done = lines.start_done = initial
    return lines
