"""What a sweep reports: its counts, kept up to date while it runs (so that they survive a Ctrl-C),
and the lines it prints when it ends (also after Ctrl-C or SIGTERM)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field

from lengthgen.sweeps.dataset import data_dir

__all__ = ["SweepReport", "summarize"]


@dataclass
class SweepReport:
    """A sweep's runs: in the grid, already recorded (ok, failed), done this time, and whether a
    Ctrl-C or SIGTERM stopped it."""

    total: int
    skipped_ok: int
    skipped_failed: int
    ok: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def remaining(self) -> int:
        return self.total - self.skipped_ok - self.skipped_failed - len(self.ok) - len(self.failed)


def summarize(report: SweepReport, out: str | os.PathLike[str], interrupted: bool = False) -> Iterable[str]:
    """Lines for the end of a sweep (``interrupted``: stopped by Ctrl-C or SIGTERM, whatever the
    report says)."""
    yield (f"sweep: {len(report.ok)} ok, {len(report.failed)} failed this time; "
           f"{report.skipped_ok + report.skipped_failed} already recorded "
           f"({report.skipped_failed} failed, skipped: use --retry-failed to redo); "
           f"{report.total} in the grid")
    for key, error in report.failed:
        yield f"  failed: {key}: {error}"
    if interrupted or report.interrupted:
        yield (f"interrupted: {report.remaining} runs not recorded; run the same command again to resume")
    yield f"results: {data_dir(out)}"
