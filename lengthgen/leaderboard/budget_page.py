"""The training-budget study's section of the board: its status, table, trend and figures, from
the study's rows (``budget``) and its plan's count of runs; then its copy part (``copy_budget``),
whose first budget is the board's own copy runs."""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import pandas as pd

from lengthgen.leaderboard import page as html_page
from lengthgen.leaderboard.budget import (
    MIN_BUDGETS,
    MIN_SEEDS,
    PAPER_BATCH,
    PAPER_POINT,
    PAPER_STEPS,
    PLANTED,
    Point,
    budget_table,
    missing_note,
    points,
    trend,
)
from lengthgen.leaderboard.copy_budget import (
    HEADLINE_FACTOR,
    PAPER_COPY_BATCH,
    PAPER_COPY_STEPS,
    change_lines,
    copy_status,
    copy_study,
    copy_table,
)
from lengthgen.leaderboard.copy_budget import TASK as COPY_TASK
from lengthgen.leaderboard.paper import PAPER_REPORTED
from lengthgen.leaderboard.plots import (
    BUDGET_CAPTION,
    COPY_BUDGET_CAPTION,
    NEAR_MISS_CAPTION,
    plot_budget,
    plot_copy_budget,
    plot_near_miss_error,
)
from lengthgen.leaderboard.stats import seed_interval
from lengthgen.leaderboard.tables import markdown, md_prose, pct

TITLE = "What the training budget changes"


@dataclass(frozen=True)
class StudySource:
    """The study as the board reads it: its rows, how many runs its plan makes of each task, the
    commands, and for its copy part the plan's copy recipes and the board's rows."""

    rows: pd.DataFrame
    planned: dict[str, int]  # task -> runs the study's plan makes
    plan: str  # the study's plan file, as the commands name it
    data: str  # its output folder, as the commands name it
    copy_recipes: frozenset[str] = frozenset()  # copy_budget.recipe of each planned copy run
    board_rows: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def planned_runs(self) -> int:
        """The MQMTAR runs the plan makes (the main part)."""
        return self.planned.get("mqmtar", 0)


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


def _budget_means(attn: str, mine: list[Point], factor: int) -> str:
    """``asentmax 2.1% → 63.5% (seeds 3 / 3 at 3,000 / 12,000 steps)``: one backend's means over
    seeds at ``factor``, budget by budget (``mine`` in budget order), with the seeds behind each."""
    means = " → ".join(f"{pct(seed_interval(p.values(factor)).mean)}%" for p in mine)
    return f"{attn} {means} ({_tested(tuple((p.steps, len(p.values(factor))) for p in mine))})"


def answer_line(source: StudySource, factor: int = 1024) -> str | None:
    """The study in one line for the board's answer: per backend at the preset width, the mean over
    seeds at ``factor`` at each budget tested so far, with the seeds behind each mean, beside the
    paper's point (None before any run is tested at ``factor``)."""
    recorded = points(source.rows)
    study = [p for p in recorded if p.values(factor)]
    if not study:
        return None
    width = min(p.width for p in study)
    parts, shown = [], set()
    for attn in sorted({p.attn for p in study}):
        mine = sorted((p for p in study if p.attn == attn and p.width == width), key=lambda p: p.steps)
        if not mine:  # tested only at another width so far
            continue
        parts.append(_budget_means(attn, mine, factor))
        shown.add(attn)
    paper = ", ".join(f"{attn} {pct(scores[factor])}%" for attn, scores in PAPER_POINT.items()
                      if attn in shown)
    status = missing_note(recorded, source.planned_runs)
    return (f"mqmtar trained longer (the training-budget study, {status}): exact match at {factor}× "
            f"(width {width}, mean over seeds): {'; '.join(parts)}; the paper, after {PAPER_STEPS:,} steps "
            f"of {PAPER_BATCH} sequences: {paper}.")


def copy_answer_line(source: StudySource, factor: int = HEADLINE_FACTOR) -> str | None:
    """The copy part in one line for the board's answer, once the study has recorded a copy run:
    per backend, the mean over seeds at ``factor`` at each budget, beside the paper's."""
    copy = copy_study(source.rows, source.board_rows, source.copy_recipes)
    if not any(not copy.is_board(p) for p in copy.points):
        return None
    parts = []
    for attn in sorted({p.attn for p in copy.points}):
        mine = sorted((p for p in copy.points if p.attn == attn and p.values(factor)), key=lambda p: p.steps)
        if not mine:  # not tested at ``factor`` yet
            continue
        parts.append(_budget_means(attn, mine, factor))
    paper = ", ".join(f"{attn} {scores[factor]:.1f}%" for attn, scores in PAPER_REPORTED[COPY_TASK].items()
                      if any(p.attn == attn for p in copy.points))
    status = copy_status(copy, source.planned.get(COPY_TASK, 0))
    return (f"copy trained longer (the training-budget study's copy part, {status}): exact match at "
            f"{factor}× (mean over seeds): {'; '.join(parts)}; the paper, after {PAPER_COPY_STEPS:,} steps "
            f"of {PAPER_COPY_BATCH} sequences: {paper}.")


def answer_lines(source: StudySource) -> list[str]:
    """The study's lines for the board's answer: MQMTAR's, then the copy part's (each when it has
    something to say)."""
    return [line for line in (answer_line(source), copy_answer_line(source)) if line]


def render_section(source: StudySource) -> tuple[list[str], list[str], dict[str, bytes]]:
    """The section's Markdown lines, HTML blocks and figure files (``plots/budget*.svg``): the
    MQMTAR part, then the copy part when the study's plan has one."""
    md, html, files = _mqmtar_part(source)
    if source.planned.get(COPY_TASK):
        copy_md, copy_html, copy_files = _copy_part(source)
        md, html = md + copy_md, html + copy_html
        files.update(copy_files)
    return md, html, files


def _mqmtar_part(source: StudySource) -> tuple[list[str], list[str], dict[str, bytes]]:
    study = points(source.rows)
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
                "on, and when the rise slows with budget it fits the last two budgets alone and calls the "
                "budget it predicts a lower bound:")
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


COPY_TITLE = f"Copy at {HEADLINE_FACTOR}× trained longer"


def _copy_intro(source: StudySource) -> str:
    return ("The board's copy recipe of ASEntmax and softmax (the learning rate and warm-up the board "
            "chose, the paper-tasks copy model: width 256, 16 heads) trained for twice the board's 4,000 "
            "steps, the cosine decay stretched to match, three seeds each; the board's own runs of the same "
            "recipe are the first budget (the same config but for the step count, made on the board's "
            "machine). Ablation copy-checkpoint-selection saw one seed of ASEntmax go from 61.7% to 76.2% "
            "at 16× with twice the steps; this part asks it of three seeds and of softmax. "
            f"`{source.plan}` makes these runs after the MQMTAR ones.")


def _copy_part(source: StudySource) -> tuple[list[str], list[str], dict[str, bytes]]:
    copy = copy_study(source.rows, source.board_rows, source.copy_recipes)
    status = copy_status(copy, source.planned[COPY_TASK])
    md = [f"### {COPY_TITLE}", "", md_prose(_copy_intro(source)), "", f"*Status: {status}.*", ""]
    html = [f'<h3 id="budget-copy">{COPY_TITLE}</h3>', f"<p>{html_page.code_spans(_copy_intro(source))}</p>",
            f'<p class="meta">Status: {html_page.html.escape(status)}.</p>']
    if not copy.points:
        return md, html, {}
    table = copy_table(copy)
    lines = change_lines(copy)
    lead = f"Exact match at {HEADLINE_FACTOR}× by budget, mean over seeds:"
    figure = plot_copy_budget(list(copy.points), io.BytesIO(), fmt="svg").getvalue()
    alt = "copy exact match against training budget"
    md += [markdown(table), "", lead, "", *[f"- {md_prose(line)}" for line in lines], "",
           f"![{alt}](plots/budget_copy.svg)", "", f"*{COPY_BUDGET_CAPTION}*", ""]
    items = "".join(f"<li>{html_page.html.escape(line)}</li>" for line in lines)
    html += [html_page.html_table(table), f"<p>{lead}</p>", f"<ul>{items}</ul>",
             html_page.figure(figure, alt, COPY_BUDGET_CAPTION)]
    return md, html, {"plots/budget_copy.svg": figure}
