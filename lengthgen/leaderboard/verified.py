"""The page's line on re-derived runs: what ``lengthgen verify`` left beside the data says."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def verification_line(report: dict[str, Any] | None, run_ids: Iterable[str]) -> str | None:
    """"k of n runs re-derived from their configs on DATE at COMMIT" for the runs on the page, with
    any that did not match; None when no run of the page was verified."""
    ids = sorted(set(run_ids))
    if not report:
        return None
    checked = {r: v for r, v in report.get("runs", {}).items() if r in ids and isinstance(v, dict)}
    if not checked:
        return None
    dates = sorted({str(v.get("date", "?")) for v in checked.values()})
    commits = sorted({str(v.get("commit", "?")) for v in checked.values()})
    matched = [r for r, v in checked.items() if v.get("ok") is True]
    line = (f"{len(matched)} of {len(ids)} runs re-derived from their recorded configs with identical rows "
            f"(`lengthgen verify`) on {', '.join(dates)} at commit {', '.join(commits)}")
    bad = sorted(set(checked) - set(matched))
    if bad:
        details = "; ".join(f"{r} ({checked[r].get('detail', '')})" for r in bad)
        line += f"; {len(bad)} did not match: {details}"
    warned = [r for r in matched if checked[r].get("warning")]
    if warned:
        line += f"; {len(warned)} within the tolerance for other library versions or processors"
    return line
