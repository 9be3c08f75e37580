"""Rendering every output in memory, and writing them: README.md, leaderboard.csv, leaderboard.html, plots/.

The outputs are a pure function of the rows and the arguments: the date shown is the newest run's
``created_at`` (not the clock), and the commit is given (``--commit``) or read from git as the last
commit that touched the data, which regenerating the page does not change. So regenerating the
same data at the same commit gives byte-identical files.
"""

from __future__ import annotations

import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from lengthgen.files import publish
from lengthgen.harness.recorded.verify import read_report
from lengthgen.leaderboard import page as html_page
from lengthgen.leaderboard.ablations import Ablation, ablation_table
from lengthgen.leaderboard.budget_page import StudySource, answer_lines, render_section
from lengthgen.leaderboard.commits import commit_label, commits_table, provenance_lines
from lengthgen.leaderboard.headline import HEADLINE_CAPTION, headline_html, headline_markdown, verdicts
from lengthgen.leaderboard.latex import latex_effective_table, latex_table
from lengthgen.leaderboard.long_table import CSV_COLUMNS, summarize
from lengthgen.leaderboard.paper import (
    PAPER_LABEL,
    PAPER_SELECTION_LEVEL,
    PAPER_TRAIN_LENGTHS,
    PROTOCOL_LABEL,
    PROTOCOL_SELECTION_LEVEL,
)
from lengthgen.leaderboard.plots import (
    DISPERSION_CAPTION,
    OVERVIEW_CAPTION,
    plot_dispersion,
    plot_exact_match,
    plot_overview,
)
from lengthgen.leaderboard.reasons import (
    CellReason,
    ablation_anchor,
    check_reasons,
    reason_html,
    reason_markdown,
    unlearned_cells,
)
from lengthgen.leaderboard.reproduce import (
    eval_commands,
    export_line,
    leaderboard_command,
    pin_text,
    plan_leaderboard_command,
    plan_sweep_command,
    sweep_commands,
)
from lengthgen.leaderboard.safe import slug
from lengthgen.leaderboard.selection import PREDATES, TIE_BREAK, ScreeningProgress
from lengthgen.leaderboard.sources import Source, conflict_lines, source_column, sources_table
from lengthgen.leaderboard.stats import EFFECTIVE_THRESHOLD, LEARNED_THRESHOLD
from lengthgen.leaderboard.tables import csv_bytes, markdown, md_prose, md_text
from lengthgen.leaderboard.verified import verification_clauses
from lengthgen.leaderboard.views import (
    comparison_table,
    effective_table,
    ours,
    protocol_table,
    task_settings_table,
    task_table,
)
from lengthgen.provenance import UNKNOWN_COMMIT, data_commit

DEFAULT_TITLE = "lengthgen leaderboard"
RESUME = "Re-running a sweep command resumes it (finished runs are skipped)."
RESUME_PLAN = (RESUME + " The data files do not carry the trained models (`model.pt`): the step-by-step "
               "`lengthgen eval` lines need them on disk, while the plan command trains a run whose model "
               "is gone again, and extends it only if it reproduces the run's recorded rows.")

INTERVAL = "mean [lo, hi]"
INTERVAL_TITLE = ("mean over seeds with its 95% interval: Student t over the per-seed exact match with ≥ 2 "
                  "seeds (zero width when every seed scores the same); with one seed, the run's own Wilson "
                  "interval over its test samples")

EXACT_CAPTION = (
    "Thick line: mean over seeds of the setting the table shows; one colour per backend, one line style per "
    "position scheme. Thin lines: one seed each (solid: learned, dotted: did not). Dash-dot with crosses: "
    f"the paper's reported numbers (trained at {PAPER_TRAIN_LENGTHS}, so its factors are multiples of 64)."
)


def _intro() -> list[str]:
    """How to read the tables; ``{interval}`` marks the notation the page explains on hover."""
    return [
        "**Cells**: exact match (%) at each evaluation length, as a multiple of the training length: "
        "{interval} over seeds. With ≥ 2 seeds the interval is a Student-t interval over the per-seed exact "
        "match; with 1 seed it is the run's Wilson interval over its test samples. `(n=k)` marks cells with "
        "fewer seeds than the row (runs that failed at that length, or not yet evaluated there). Hover a "
        "cell for each seed's value.",
        "**learned**: k/n seeds whose in-distribution (1×) test exact match is ≥ "
        f"{LEARNED_THRESHOLD * 100:.0f}%. "
        "A mean like 33 [0, 100] with 1/3 learned is one seed that learned and two that did not.",
        "**setting**, **runner-up**: runs that differ only by seed form a setting. Per backend and position "
        "scheme the table shows the setting with the best mean in-distribution validation exact match over "
        "the seeds every setting ran (`val`, %), never chosen on test data, and names the second best; "
        f"exact ties go to {TIE_BREAK} (the gentler optimizer), and the cell says so. Runs "
        "that failed before any evaluation count as 0. Runs made before validation scores were recorded "
        "cannot be ranked: with one setting there is nothing to choose; with several, each gets its own row "
        f"({PREDATES}).",
        f"**{PROTOCOL_LABEL}** (pinned rows): per backend, the single best run over seeds × settings × "
        "position schemes, selected on 8× validation exact match, as the paper selected its numbers "
        f"({PROTOCOL_SELECTION_LEVEL}; {PAPER_SELECTION_LEVEL}); it sits "
        f"directly above **{PAPER_LABEL}**, the paper's Table 1 (not measured here; blank where it reports "
        f"nothing; its factors are multiples of 64). Pinned rows never move when a table is sorted.",
        "**eff. length**: the largest factor whose mean exact match stays ≥ "
        f"{EFFECTIVE_THRESHOLD * 100:.0f}% at every evaluated factor up to it, counting only factors every "
        "seed of the cell reached (`≥` when even the longest such length passes; — when 1× does not). "
        "Each seed's own effective length follows (`seeds ≥ 1024 / ≥ 1024 / 32`): a mean can stay above "
        "the line while one seed falls, so tables sort by the worst seed's, the length every seed holds, "
        "and the first screen's sentences and matrix colours rank by it too. "
        "When not every seed learned, the cell also gives it "
        "over the seeds that learned (`— · 32× over 1/3 learned`), so \"did not learn\" reads apart from "
        "\"did not extrapolate\"; the effective-length table's column names each task's preset and seeds.",
    ]


def _bold(text: str) -> str:
    import re

    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", text)


def data_date(rows: pd.DataFrame) -> str:
    """The newest run's creation time (UTC), the date the page shows: from the data, not the clock."""
    stamps = sorted(str(v) for v in rows["created_at"].dropna()) if "created_at" in rows else []
    if not stamps:
        return "unknown"
    return pd.Timestamp(stamps[-1]).tz_convert("UTC").strftime("%Y-%m-%d %H:%M UTC")


@dataclass(frozen=True)
class Rendered:
    """All outputs of a leaderboard in memory (file name → bytes), so writing is one step."""

    files: dict[str, bytes]


ABLATIONS_INTRO = ("Controlled experiments, each a sweep of its own: one thing varies, everything else is "
                   "held fixed. The text states the question and what the data show; every number in the "
                   "tables comes from the committed rows, and the commands under each table reproduce them.")


def _ablation_commands(ablation: Ablation) -> list[str]:
    return [*sweep_commands(ablation.rows, ablation.source), *eval_commands(ablation.rows, ablation.source)]


def _ablation_markdown(ablation: Ablation) -> list[str]:
    return [f"### {md_text(ablation.title, brackets=True)}", "",
            *[line for p in ablation.paragraphs for line in (md_prose(p), "")],
            markdown(ablation_table(ablation.rows)), "", "```sh", *_ablation_commands(ablation), "```", ""]


def _ablation_html(ablation: Ablation) -> list[str]:
    """An ablation folded under its title (the page's ablations run to thousands of lines)."""
    commands = _ablation_commands(ablation)
    anchor, heading = ablation_anchor(ablation.name), html_page.html.escape(ablation.title)
    return [html_page.folded(f"<h3>{heading}</h3>", [
        *[f"<p>{_bold(html_page.code_spans(p))}</p>" for p in ablation.paragraphs],
        html_page.html_table(ablation_table(ablation.rows)),
        "<pre>" + "\n".join(html_page.html.escape(c) for c in commands) + "</pre>"], anchor)]


def render(rows: pd.DataFrame, *, title: str = DEFAULT_TITLE, source: str = "DIR", out_name: str = "OUT",
           hardware: str | None = None, commit: str = UNKNOWN_COMMIT, data_link: str = "data/",
           ablations: Sequence[Ablation] = (), ablations_source: str | None = None,
           plan: str | None = None, plan_rule: str | None = None, verified: Sequence[str] | None = None,
           latex: bool = False, sources: Sequence[Source] = (), reasons: Sequence[CellReason] | None = None,
           numerics: Mapping[str, str] | None = None,
           screening: ScreeningProgress | None = None, budget: StudySource | None = None) -> Rendered:
    """README.md, leaderboard.csv, leaderboard.html and plots/*.svg for the rows (and the ablations).

    With ``plan`` (the plan file's path) the Reproduce section starts with the two commands that
    rebuild the board from it, and ``plan_rule`` (how its grids became rows) joins "How to read";
    with ``reasons`` (the plan's), every chosen setting where not every seed learned is listed under
    the effective lengths, with its reason or without one; ``numerics`` (the plan's pin) is listed
    under hardware and exported before the step-by-step commands; ``screening`` (the plan's grids
    screened in part) marks those rows provisional."""
    if reasons is not None:
        check_reasons(reasons, ablations)
    rows = rows.sort_values(["task", "attn", "pos", "seed", "run_id", "factor"], kind="mergesort",
                            na_position="last").reset_index(drop=True)
    summary = summarize(rows, screening)
    tasks = sorted(rows["task"].dropna().unique())
    files: dict[str, bytes] = {}
    conflicts = conflict_lines(sources)
    held = (f"Data as of {data_date(rows)} (newest run), data commit {commit}; {len(rows)} result rows, "
            f"{rows['run_id'].nunique()} runs")
    flagged = (f"; ⚠ {len(conflicts)} run{'s' if len(conflicts) > 1 else ''} held by two folders with "
               "different rows (see Sources)" if conflicts else "")
    meta = held + "".join(f"; {clause}" for clause in verified or ()) + flagged
    literal = f"**Settings from the plan** (`{plan}`): {plan_rule}" if plan and plan_rule else None
    intro = _intro() + ([literal] if literal else [])  # "{interval}" in a line marks the notation
    effective = effective_table(summary)
    answers = verdicts(summary)
    if budget is not None:
        answers += answer_lines(budget)
    files["plots/overview.svg"] = plot_overview(rows, io.BytesIO(), summary=summary, fmt="svg").getvalue()
    md = [f"# {md_text(title, brackets=True)}", "",
          f"{md_prose(meta)}. Generated by `lengthgen leaderboard`: a pure function of the rows, so "
          "regenerating from the same data at the same commit reproduces these files byte for byte. "
          "[leaderboard.csv](leaderboard.csv) has every number, per-seed values included; "
          "[leaderboard.html](leaderboard.html) is this page with sortable tables.", "",
          "## The answer", "", *[f"- {md_prose(line)}" for line in answers], "",
          headline_markdown(summary), "",
          f"*{HEADLINE_CAPTION}*", "", "![every task at a glance](plots/overview.svg)", "",
          f"*{OVERVIEW_CAPTION}*", "",
          "## How to read", "", *[f"- {md_prose(p).replace('{interval}', INTERVAL)}" for p in intro], "",
          "## Effective length per task and backend", "", markdown(effective), ""]
    unlearned = unlearned_cells(summary, reasons) if reasons is not None else []
    md += reason_markdown(unlearned, ablations)
    sections = []
    if latex:
        files["latex/effective_length.tex"] = latex_effective_table(summary).encode()
    for task in tasks:
        exact = plot_exact_match(rows, task, io.BytesIO(), summary=summary, fmt="svg").getvalue()
        disp = plot_dispersion(rows, task, io.BytesIO(), summary=summary, fmt="svg").getvalue()
        name = slug(task)  # a task name is data: never a path
        files[f"plots/{name}_exact_match.svg"] = exact
        files[f"plots/{name}_dispersion.svg"] = disp
        if latex:  # for papers: a booktabs table and the figures as PDF
            files[f"latex/{name}.tex"] = latex_table(summary, task, {**ours(rows, task), "preset": _values(
                rows.loc[rows["task"] == task, "preset"])}).encode()
            for kind, plot in (("exact_match", plot_exact_match), ("dispersion", plot_dispersion)):
                files[f"plots/{name}_{kind}.pdf"] = plot(rows, task, io.BytesIO(), summary=summary,
                                                         fmt="pdf").getvalue()
        table, chosen = task_table(summary, task), task_settings_table(summary, task)
        compare = comparison_table(rows, task)
        md += [f"## {md_text(task, brackets=True)}", "", markdown(table), "",
               "The settings behind these rows:", "", markdown(chosen), ""]
        blocks = [html_page.html_table(table), "<h3>The settings behind these rows</h3>",
                  html_page.html_table(chosen)]
        if compare is not None:
            md += ["The paper's protocol and ours:", "", markdown(compare), ""]
            blocks += ["<h3>The paper's protocol and ours</h3>", html_page.html_table(compare)]
        exact_alt = f"{task}: exact match vs length"
        disp_alt = f"{task}: attention entropy and support vs length"
        exact_md, disp_md = md_text(exact_alt, brackets=True), md_text(disp_alt, brackets=True)
        md += [f"![{exact_md}](plots/{name}_exact_match.svg)", "", f"*{EXACT_CAPTION}*", "",
               f"![{disp_md}](plots/{name}_dispersion.svg)", "", f"*{DISPERSION_CAPTION}*", ""]
        blocks += [html_page.figure(exact, exact_alt, EXACT_CAPTION),
                   html_page.figure(disp, disp_alt, DISPERSION_CAPTION)]
        sections.append(html_page.Section(f"task-{name}", task, tuple(blocks)))
    protocol = protocol_table(rows)
    pin = pin_text(numerics or {})
    env = [f"device: {_values(rows['device'])}" + (f"; hardware: {hardware}" if hardware else "")
           + (f"; numerics pinned by the plan: {pin} (`sweep --plan` sets them; other commands need them "
              "set, as in Reproduce)" if pin else ""),
           f"lengthgen {_values(rows['lengthgen_version'])}, torch {_values(rows['torch_version'])}; "
           + _code_line(rows),
           "evaluation: a fixed test set per (task, length), independent of the training seed (paired); "
           "checkpoint selection as in the table (`id` = in-distribution validation, `8x` = at 8×)."]
    own = rows[source_column(rows) == ""]
    steps = [*sweep_commands(own, source), *eval_commands(own, source)]
    for other in (s for s in sources if not s.primary):
        theirs = rows[source_column(rows) == other.label]
        steps += [f"# {other.label}", *sweep_commands(theirs, other.path), *eval_commands(theirs, other.path)]
    resume = RESUME_PLAN if plan else RESUME
    if plan:
        commands = [plan_sweep_command(plan, source), plan_leaderboard_command(source, out_name, plan),
                    "", "# the same runs step by step (the points the plan chose)"
                    + (", with the plan's numerics:" if numerics else ":"),
                    *([export_line(numerics)] if numerics else []), *steps]
    else:
        commands = [*steps, leaderboard_command(source, out_name, hardware, title, DEFAULT_TITLE,
                                                ablations_source)]
    budget_html: list[str] = []
    if budget is not None:  # the training-budget study, before the ablations that motivated it
        budget_md, budget_html, budget_files = render_section(budget)
        md += budget_md
        files.update(budget_files)
    ablation_html: list[str] = []
    if ablations:
        md += ["## What changes the result", "", ABLATIONS_INTRO, ""]
        for ablation in ablations:
            md += _ablation_markdown(ablation)
            ablation_html += _ablation_html(ablation)
        ablation_html = ['<h2 id="ablations">What changes the result</h2>', f"<p>{ABLATIONS_INTRO}</p>",
                         *ablation_html]
    submitted = sources_table(rows, sources) if len(sources) > 1 else None
    if submitted is not None:
        md += ["## Sources", "", SOURCES_INTRO, "", *[f"- ⚠ {md_prose(line)}" for line in conflicts],
               *([""] if conflicts else []), markdown(submitted), ""]
    commits, provenance = commits_table(rows), provenance_lines(rows)
    md += ["## Protocol and hardware", "", markdown(protocol), "", *[f"- {md_prose(line)}" for line in env],
           "", "Which code made the rows:", "", markdown(commits), "",
           *[f"- {md_prose(line)}" for line in provenance], "",
           "## Reproduce", "", resume, "", "```sh", *commands, "```", ""]
    files["README.md"] = "\n".join(md).encode()
    files["leaderboard.csv"] = csv_bytes(summary, CSV_COLUMNS)
    interval_html = f'<abbr title="{html_page.html.escape(INTERVAL_TITLE)}">{INTERVAL}</abbr>'
    items = [_bold(html_page.code_spans(p)).replace("{interval}", interval_html) for p in intro]
    intro_html = [html_page.folded("How to read the tables",
                                   ["<ul>" + "".join(f"<li>{item}</li>" for item in items) + "</ul>"], "how")]
    verdict_items = "".join(f"<li>{html_page.html.escape(line)}</li>" for line in answers)
    lead = ['<h2 id="answer">The answer</h2>', f'<ul class="verdicts">{verdict_items}</ul>',
            headline_html(summary), f'<p class="meta">{html_page.code_spans(HEADLINE_CAPTION)}</p>',
            html_page.figure(files["plots/overview.svg"], "every task at a glance: exact match vs length",
                             OVERVIEW_CAPTION)]
    conflicts_html = ["<ul>" + "".join(f"<li>⚠ {html_page.code_spans(line)}</li>" for line in conflicts)
                      + "</ul>"] if conflicts else []
    sources_html = ([f"<h2>Sources</h2>\n<p>{html_page.code_spans(SOURCES_INTRO)}</p>", *conflicts_html,
                     html_page.html_table(submitted)] if submitted is not None else [])
    tail = [*budget_html, *ablation_html, *sources_html, "<h2>Protocol and hardware</h2>",
            html_page.html_table(protocol),
            "<ul>" + "".join(f"<li>{html_page.code_spans(line)}</li>" for line in env) + "</ul>",
            "<h3>Which code made the rows</h3>", html_page.html_table(commits),
            "<ul>" + "".join(f"<li>{html_page.code_spans(line)}</li>" for line in provenance) + "</ul>",
            "<h2>Reproduce</h2>", f"<p>{html_page.code_spans(resume)}</p>",
            "<pre>" + "\n".join(html_page.html.escape(c) for c in commands) + "</pre>"]
    files["leaderboard.html"] = html_page.page(
        title=title, meta=held + flagged, meta_folded=verified or (), intro=intro_html, sections=sections,
        tail=tail, lead=lead,
        links=[("CSV", "leaderboard.csv"), ("README", "README.md"), ("data", data_link)],
        summary="<h2>Effective length per task and backend</h2>\n" + html_page.html_table(effective)
        + reason_html(unlearned, ablations),
    ).encode()
    return Rendered(files)


SOURCES_INTRO = ("The first folder is this board's own; every other one was submitted. A submitted run's "
                 "backend carries its source's label (`softmax @ alice`), so it is never merged with one of "
                 "ours, and the paper-protocol rows (ours) are chosen from this board's runs alone; a row "
                 "whose config does not hash to its run, or whose mean lies outside its interval, is refused "
                 "when the folders are read. A run that two folders hold (the same config and seed) shows "
                 "once when the copies agree; when they differ it is flagged here (⚠), each copy kept under "
                 "its folder's label: `lengthgen verify` re-derives it. Re-derived counts come from this "
                 "board's verify.json alone, never from a report a submitted folder brings.")


def _code_line(rows: pd.DataFrame) -> str:
    """Which code made the rows: every commit of every row (with local changes or not), the runs
    that record none, and the numerics versions; the commits table has the details."""
    commits = sorted({commit_label(c, d) for c, d in zip(rows["git_commit"], rows["git_dirty"], strict=True)
                      if isinstance(c, str)})
    unrecorded = rows.loc[rows["git_commit"].isna(), "run_id"].nunique()
    versions = _values(rows["numerics_version"].dropna().astype(int))
    parts = [f"code: {len(commits)} commit{'s' if len(commits) != 1 else ''}, {', '.join(commits)} (the "
             "commits table)" if commits else "code: commit not recorded"]
    if commits and unrecorded:
        parts.append(f"not recorded for {unrecorded} runs")
    return "; ".join(parts) + f"; numerics version {versions}"


def _values(series: pd.Series) -> str:
    items = sorted({str(v) for v in series.dropna()})
    return ", ".join(items) if items else "—"


def write_leaderboard(rows: pd.DataFrame, out: str | os.PathLike[str], *, title: str = DEFAULT_TITLE,
                      source: str = "DIR", hardware: str | None = None, commit: str | None = None,
                      ablations: str | os.PathLike[str] | None = None, plan: str | None = None,
                      plan_rule: str | None = None, latex: bool = False,
                      sources: Sequence[Source] = (),
                      reasons: Sequence[CellReason] | None = None,
                      numerics: Mapping[str, str] | None = None,
                      screening: ScreeningProgress | None = None,
                      budget: StudySource | None = None) -> list[Path]:
    """Render every output, then publish them under ``out`` together (``files.publish``: built in a
    temporary folder, then moved into place); returns the paths.

    ``commit`` defaults to the last git commit of the data under ``source``; ``ablations`` is a
    folder of ablation sweeps (``lengthgen.leaderboard.ablations``)."""
    from lengthgen.leaderboard.ablations import load_ablations

    data = Path(source) / "data" if (Path(source) / "data").is_dir() else Path(source)
    link = os.path.relpath(data, out).replace(os.sep, "/") + ("/" if data.is_dir() else "")
    found = load_ablations(ablations) if ablations is not None else []
    own = rows[source_column(rows) == ""]
    report = read_report(source)  # this board's own record; a submission's report is never read
    verified = verification_clauses(report, own)
    rendered = render(rows, title=title, source=source, out_name=str(out), hardware=hardware,
                      commit=commit if commit is not None else data_commit(data), data_link=link,
                      ablations=found, ablations_source=None if ablations is None else str(ablations),
                      plan=plan, plan_rule=plan_rule, verified=verified, latex=latex, sources=sources,
                      reasons=reasons, numerics=numerics, screening=screening, budget=budget)
    return publish(out, rendered.files)
