"""The training-budget study's section of the board: its status, table, trend and figures, from
the study's rows (``budget``) and its plan's count of runs."""

from __future__ import annotations

import io
from dataclasses import dataclass

import pandas as pd

from lengthgen.leaderboard import page as html_page
from lengthgen.leaderboard.budget import (
    MIN_BUDGETS,
    MIN_SEEDS,
    PAPER_POINT,
    PAPER_SEQUENCES,
    PAPER_STEPS,
    PLANTED,
    budget_table,
    missing_note,
    points,
    trend,
)
from lengthgen.leaderboard.plots import BUDGET_CAPTION, NEAR_MISS_CAPTION, plot_budget, plot_near_miss_error
from lengthgen.leaderboard.stats import seed_interval
from lengthgen.leaderboard.tables import markdown, md_prose, pct

TITLE = "What the training budget changes"


@dataclass(frozen=True)
class StudySource:
    """The study as the board reads it: its rows, how many runs its plan makes, and the commands."""

    rows: pd.DataFrame
    planned_runs: int
    plan: str  # the study's plan file, as the commands name it
    data: str  # its output folder, as the commands name it


def _intro(source: StudySource) -> str:
    return (f"MQMTAR at the paper's task protocol trained longer: each backend at 3,000, 12,000 and 48,000 "
            "steps of 64 sequences (the board's recipe, learning rate 5e-4 with 1,500 warm-up steps, the "
            "cosine decay stretched over each budget), and ASEntmax and softmax at width 256 for 12,000 "
            "steps, three seeds each, tested to 1024× on at least 64 samples per length, and at 8× with "
            f"{PLANTED} near misses planted per query (the error per near miss, and from it the share of "
            "the 1024× failures that near misses account for). "
            f"`{source.plan}` makes every run "
            f"(`lengthgen sweep --plan {source.plan} --out {source.data}`); the table shows what is "
            "recorded so far.")


def _tested(tested: tuple[tuple[int, int], ...]) -> str:
    """``seeds 3 / 1 at 3,000 / 12,000 steps``: what a trend line stands on."""
    return (f"seeds {' / '.join(str(n) for _, n in tested)} at "
            f"{' / '.join(f'{steps:,}' for steps, _ in tested)} steps")


def answer_line(source: StudySource, factor: int = 1024) -> str | None:
    """The study in one line for the board's answer: per backend at the preset width, the mean over
    seeds at ``factor`` at each budget tested so far, with the seeds behind each mean, beside the
    paper's point (None before any run is tested at ``factor``)."""
    recorded = points(source.rows) if not source.rows.empty else []
    study = [p for p in recorded if p.values(factor)]
    if not study:
        return None
    width = min(p.width for p in study)
    parts, shown = [], set()
    for attn in sorted({p.attn for p in study}):
        mine = sorted((p for p in study if p.attn == attn and p.width == width), key=lambda p: p.steps)
        if not mine:  # tested only at another width so far
            continue
        means = " → ".join(f"{pct(seed_interval(p.values(factor)).mean)}%" for p in mine)
        parts.append(f"{attn} {means} ({_tested(tuple((p.steps, len(p.values(factor))) for p in mine))})")
        shown.add(attn)
    paper = ", ".join(f"{attn} {pct(scores[factor])}%" for attn, scores in PAPER_POINT.items()
                      if attn in shown)
    status = missing_note(recorded, source.planned_runs)
    return (f"mqmtar trained longer (the training-budget study, {status}): exact match at {factor}× "
            f"(width {width}, mean over seeds): {'; '.join(parts)}; the paper, after {PAPER_STEPS:,} steps "
            f"of {PAPER_SEQUENCES // PAPER_STEPS} sequences: {paper}.")


def render_section(source: StudySource) -> tuple[list[str], list[str], dict[str, bytes]]:
    """The section's Markdown lines, HTML blocks and figure files (``plots/budget*.svg``)."""
    study = points(source.rows) if not source.rows.empty else []
    status = missing_note(study, source.planned_runs)
    trends = [trend(study, attn, min(p.width for p in study))
              for attn in sorted({p.attn for p in study})] if study else []
    trend_lines = [f"{t.attn} ({_tested(t.tested)}): {t.verdict}" for t in trends]
    md = [f"## {TITLE}", "", md_prose(_intro(source)), "", f"*Status: {status}.*", ""]
    html = [f'<h2 id="budget">{TITLE}</h2>', f"<p>{html_page.code_spans(_intro(source))}</p>",
            f'<p class="meta">Status: {html_page.html.escape(status)}.</p>']
    files: dict[str, bytes] = {}
    if not study:
        return md, html, files
    table = budget_table(study)
    files["plots/budget.svg"] = plot_budget(study, io.BytesIO(), fmt="svg").getvalue()
    files["plots/budget_near_misses.svg"] = plot_near_miss_error(study, io.BytesIO(), fmt="svg").getvalue()
    fit_text = ("The trend of exact match at 1024× against the budget, logit-linear in log training "
                f"sequences, fitted over every seed of the budgets with at least {MIN_SEEDS} seeds (range: "
                f"the seeds of each budget resampled); it predicts a budget only from {MIN_BUDGETS} budgets "
                "on:")
    budget_alt = "exact match against training budget"
    error_alt = "error per near miss against training budget"
    md += [markdown(table), "", fit_text, "", *[f"- {md_prose(line)}" for line in trend_lines], "",
           f"![{budget_alt}](plots/budget.svg)", "", f"*{BUDGET_CAPTION}*", "",
           f"![{error_alt}](plots/budget_near_misses.svg)", "", f"*{NEAR_MISS_CAPTION}*", ""]
    items = "".join(f"<li>{html_page.html.escape(line)}</li>" for line in trend_lines)
    html += [html_page.html_table(table), f"<p>{fit_text}</p>", f"<ul>{items}</ul>",
             html_page.figure(files["plots/budget.svg"], budget_alt, BUDGET_CAPTION),
             html_page.figure(files["plots/budget_near_misses.svg"], error_alt, NEAR_MISS_CAPTION)]
    return md, html, files
