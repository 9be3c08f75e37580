"""The board's first screen: one sentence per task and a compact task × backend matrix, so that a
reader gets the answer before any table.

Both read the summary only (``long_table.summarize``), and both rank by the worst seed's effective
length, the length every seed holds, so a mean carried by some seeds never reads as a result all
seeds share. The sentences say which backends hold longest on every seed, which reach that length
on some seeds only, which falls first, and which did not learn the task on every seed.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass

import pandas as pd

from lengthgen.leaderboard.paper import backend_rank
from lengthgen.leaderboard.stats import EFFECTIVE_THRESHOLD, is_missing
from lengthgen.leaderboard.tables import effective_label, md_text, pct
from lengthgen.leaderboard.views import seed_lengths

__all__ = ["HEADLINE_CAPTION", "Standing", "headline_html", "headline_markdown", "standings", "verdicts"]

HEADLINE_CAPTION = (
    "Each cell: the effective length of the mean over seeds (the largest factor whose exact match stays "
    f"≥ {EFFECTIVE_THRESHOLD * 100:.0f}% at every length up to it; ≥ when even the longest tested passes), "
    "each seed's own below it, and the paper's where it reports one; · where no run is recorded yet; "
    "colour: the worst seed's, from red "
    "(not even 1×) to green (the longest tested length on every seed). The sentences above rank by the "
    "worst seed too."
)


@dataclass(frozen=True)
class Standing:
    """One backend on one task: its chosen setting's effective lengths and scores."""

    task: str
    method: str
    mean_length: int  # effective length of the mean over seeds (0: even 1× fails)
    mean_capped: bool
    seeds: tuple[tuple[int, int, bool], ...]  # (seed, effective length, capped)
    learned: int
    runs: int
    longest: int  # the longest factor every seed was tested at
    at_longest: float  # mean exact match there
    paper: str  # the paper's effective length ('' when it reports nothing)

    @property
    def worst(self) -> tuple[int, bool]:
        return min(((length, capped) for _, length, capped in self.seeds), default=(0, False))

    def holding(self, length: int) -> list[int]:
        """The seeds whose own effective length reaches ``length``."""
        return [seed for seed, own, _ in self.seeds if own >= length]


def _seeds(text: object) -> tuple[tuple[int, int, bool], ...]:
    if not isinstance(text, str) or not text:
        return ()
    out = []
    for item in text.split(";"):
        seed, _, value = item.partition("=")
        out.append((int(seed.removeprefix("s")), int(value.removeprefix(">=")), value.startswith(">=")))
    return tuple(out)


def standings(summary: pd.DataFrame) -> dict[str, list[Standing]]:
    """Per task, a standing per backend (its chosen measured setting), in the paper's order."""
    measured = summary[(summary["source"] == "measured") & summary["chosen"].astype(bool)]
    paper = summary[summary["source"] == "paper"]
    out: dict[str, list[Standing]] = {}
    for (task, method), part in measured.groupby(["task", "method"], sort=True):
        part = part.dropna(subset=["factor"])
        if part.empty:
            continue
        first = part.iloc[0]
        runs = int(first["runs"])
        full = part[part["n_seeds"] == runs]
        longest = full.loc[full["factor"].idxmax()] if not full.empty else part.loc[part["factor"].idxmin()]
        reported = paper[(paper["task"] == task) & (paper["method"] == method)]
        paper_label = (effective_label(reported["effective_length"].iloc[0],
                                       reported["effective_length_capped"].iloc[0]) if len(reported) else "")
        out.setdefault(str(task), []).append(Standing(
            task=str(task), method=str(method),
            mean_length=0 if is_missing(first["effective_length"]) else int(first["effective_length"]),
            mean_capped=bool(first["effective_length_capped"]) if not is_missing(
                first["effective_length_capped"]) else False,
            seeds=_seeds(first["effective_length_seeds"]), learned=int(first["learned_seeds"]), runs=runs,
            longest=int(longest["factor"]), at_longest=float(longest["exact_match"]), paper=paper_label))
    for task in out:
        out[task].sort(key=lambda s: backend_rank(s.method))
    return out


def _names(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _length(length: int, capped: bool) -> str:
    return f"{length}× (the longest tested)" if capped else f"{length}×"


def verdict(task: str, rows: list[Standing]) -> str:
    """One sentence: who holds longest on every seed, who only on some, who falls first, who did
    not learn the task on every seed."""
    line = f"{EFFECTIVE_THRESHOLD * 100:.0f}%"
    best = max((s.worst for s in rows), default=(0, False))
    learned = [s for s in rows if s.learned == s.runs]
    fallers = [s for s in learned if s.worst[0] < best[0]]
    low = min((s.worst[0] for s in fallers), default=0)
    first = [s for s in fallers if s.worst[0] == low]
    parts = []
    if best[0] == 0:
        parts.append(f"no backend holds {line} on every seed, even at 1×")
    else:
        leaders = [s for s in rows if s.worst[0] == best[0]]
        runs = {s.runs for s in leaders}
        count = f"{leaders[0].runs}/{leaders[0].runs}" if len(runs) == 1 else "all"
        verb = "keeps" if len(leaders) == 1 else "keep"
        parts.append(f"{_names([s.method for s in leaders])} {verb} ≥ {line} to {_length(*best)} on {count} "
                     "seeds")
        for s in rows:
            reach = s.holding(best[0])
            if s not in leaders and s not in first and reach:
                others = [f"seed {seed} to {own}×" for seed, own, _ in s.seeds if own < best[0]]
                parts.append(f"{s.method} on {len(reach)}/{s.runs} ({', '.join(others)})")
    if first:
        after = f"after {low}×" if low else "at 1×"
        scores = " and ".join(f"{pct(s.at_longest)}%" for s in first)
        longest = sorted({s.longest for s in first})
        verb = "falls" if len(first) == 1 else "fall"
        at = "/".join(map(str, longest))
        parts.append(f"{_names([s.method for s in first])} {verb} first, a seed below {line} {after} "
                     f"({scores} at {at}×, mean of {first[0].runs} seeds)")
    unlearned: dict[str, list[str]] = {}
    for s in rows:
        if s.learned < s.runs:
            unlearned.setdefault(f"{s.learned}/{s.runs}", []).append(s.method)
    if unlearned:
        counts = sorted(unlearned.items(), reverse=True)
        parts.append("learned in distribution by " + "; ".join(
            f"{count} seeds of {_names(methods)}" for count, methods in counts))
    return f"{task}: " + "; ".join(parts) + "."


def verdicts(summary: pd.DataFrame) -> list[str]:
    return [verdict(task, rows) for task, rows in sorted(standings(summary).items())]


def _colour(length: int, capped: bool, longest: int) -> str:
    """Green for the longest tested length held on every seed, through yellow, to red for none."""
    if length <= 0:
        return "#f6d5d1"
    share = min(1.0, math.log2(length) / max(1.0, math.log2(max(2, longest)))) if length > 1 else 0.05
    if capped:
        share = 1.0
    hue = 8 + 112 * share  # 8 (red) … 120 (green)
    return f"hsl({hue:.0f}, 60%, 86%)"


def _cell_text(s: Standing) -> tuple[str, str, str]:
    seeds = seed_lengths(";".join(f"s{seed}={'>=' if c else ''}{n}" for seed, n, c in s.seeds))
    learned = "" if s.learned == s.runs else f" · {s.learned}/{s.runs} learned"
    return effective_label(s.mean_length, s.mean_capped), f"seeds {seeds}{learned}", (
        f"paper {s.paper}" if s.paper else "")


def _matrix(summary: pd.DataFrame) -> tuple[list[str], list[str], dict[tuple[str, str], Standing]]:
    table = standings(summary)
    tasks = sorted(table)
    methods = sorted({s.method for rows in table.values() for s in rows}, key=backend_rank)
    cells = {(s.task, s.method): s for rows in table.values() for s in rows}
    return tasks, methods, cells


def headline_html(summary: pd.DataFrame) -> str:
    """The matrix as a compact HTML table: a row per backend, a column per task; each cell the
    effective length of the mean, each seed's own, the paper's, coloured by the worst seed."""
    tasks, methods, cells = _matrix(summary)
    e = html.escape
    longest = {t: max((c.longest for (task, _), c in cells.items() if task == t), default=1) for t in tasks}
    head = "".join(f'<th scope="col">{e(t)}</th>' for t in tasks)
    body = []
    for method in methods:
        tds = []
        for task in tasks:
            s = cells.get((task, method))
            if s is None:
                tds.append('<td class="hm-none" title="not run">·</td>')
                continue
            main, seeds, paper = _cell_text(s)
            worst = s.worst
            title = (f"{task}, {method}: effective length of the mean over {s.runs} seeds {main}; each "
                     f"seed's own {seeds.removeprefix('seeds ')}; worst seed {effective_label(*worst)}"
                     + (f"; the paper reports {s.paper}" if s.paper else ""))
            extra = f'<span class="hm-paper">{e(paper)}</span>' if paper else ""
            colour = _colour(*worst, longest[task])
            tds.append(f'<td style="background:{colour}" title="{e(title, quote=True)}">'
                       f'<span class="hm-main">{e(main)}</span><span class="hm-seeds">{e(seeds)}</span>'
                       f"{extra}</td>")
        body.append(f'<tr><th scope="row">{e(method)}</th>{"".join(tds)}</tr>')
    label = "effective length per task and backend"
    return (f'<div class="hm-wrap" role="region" tabindex="0" aria-label="{label}">'
            f'<table class="headline"><thead><tr><th scope="col">backend</th>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def headline_markdown(summary: pd.DataFrame) -> str:
    """The matrix for the README: the same cells, with the seeds and the paper in one line."""
    tasks, methods, cells = _matrix(summary)
    lines = ["| backend | " + " | ".join(md_text(t) for t in tasks) + " |", "|---|" + "---|" * len(tasks)]
    for method in methods:
        row = []
        for task in tasks:
            s = cells.get((task, method))
            if s is None:
                row.append("·")
                continue
            main, seeds, paper = _cell_text(s)
            extra = f"; {md_text(paper)}" if paper else ""
            row.append(f"**{md_text(main)}** ({md_text(seeds)}{extra})")
        lines.append(f"| {md_text(method)} | " + " | ".join(row) + " |")
    return "\n".join(lines)
