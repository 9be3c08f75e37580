"""The lines a sweep prints when it ends (also after Ctrl-C or SIGTERM)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from lengthgen.sweeps.dataset import data_dir
from lengthgen.sweeps.driver import SweepReport

__all__ = ["summarize"]


def summarize(report: SweepReport, out: str | os.PathLike[str]) -> Iterable[str]:
    """Lines for the end of a sweep."""
    yield (f"sweep: {len(report.ok)} ok, {len(report.failed)} failed this time; "
           f"{report.skipped_ok + report.skipped_failed} already recorded "
           f"({report.skipped_failed} failed, skipped: use --retry-failed to redo); "
           f"{report.total} in the grid")
    for key, error in report.failed:
        yield f"  failed: {key}: {error}"
    if report.interrupted:
        yield (f"interrupted: {report.remaining} runs not recorded; run the same command again to resume")
    yield f"results: {data_dir(out)}"
