"""Leaderboard: tables, CSV, a standalone HTML page and figures, made from result rows.

They are functions of the rows and the arguments, except where four modules ask this
installation's registries about names the rows hold (never importing code a row names):
``settings`` rebuilds a run's preset config, ``reproduce`` a backend's default options, ``views``
a task's training range and ``long_table`` the distribution of a backend older rows do not name; a
name the installation does not know gives a placeholder.

Modules, one job each: ``rows`` (reading results, the per-run view), ``stats`` (intervals, learned
seeds, effective length), ``settings`` (naming settings), ``selection`` (which setting a row shows,
the paper-protocol run, the tie-break), ``paper`` (the paper's numbers and protocol), ``long_table``
(the long table of numbers), ``tables`` (table model, Markdown, CSV), ``views`` (what each table
shows), ``headline`` (the first screen: a sentence per task and the task × backend matrix),
``commits`` (which code made the rows), ``budget`` (the training-budget study's numbers: points,
the per-near-miss error, the trend), ``copy_budget`` (its copy part, which starts from the board's
copy runs) and ``budget_page`` (its section of the board), ``reasons``
(why a cell's seeds did not learn), ``ablations`` (the ablation folders), ``sources`` (our folder
and submitted ones), ``verified`` (what the verification report covers), ``page`` (HTML, CSS,
JavaScript), ``plots`` (figures, and ``lengthgen plot``'s), ``latex`` (tables for papers),
``reproduce`` (commands), ``safe`` (slugs for ids and file names, CSV cells that are never
formulas) and ``write`` (rendering and publishing the files).
"""

from lengthgen.leaderboard.long_table import CSV_COLUMNS, summarize
from lengthgen.leaderboard.paper import PAPER_LABEL, PAPER_REPORTED, PROTOCOL_LABEL
from lengthgen.leaderboard.plots import plot_dispersion, plot_exact_match, plot_task
from lengthgen.leaderboard.rows import load_rows
from lengthgen.leaderboard.selection import paper_protocol, select_settings
from lengthgen.leaderboard.stats import (
    EFFECTIVE_THRESHOLD,
    LEARNED_THRESHOLD,
    Interval,
    effective_length,
    seed_interval,
    t_quantile,
)
from lengthgen.leaderboard.tables import effective_label, factor_label, markdown, pct
from lengthgen.leaderboard.views import effective_table, task_settings_table, task_table
from lengthgen.leaderboard.write import DEFAULT_TITLE, Rendered, data_commit, render, write_leaderboard

__all__ = [
    "CSV_COLUMNS", "DEFAULT_TITLE", "EFFECTIVE_THRESHOLD", "LEARNED_THRESHOLD", "PAPER_LABEL",
    "PAPER_REPORTED", "PROTOCOL_LABEL", "Interval", "Rendered", "data_commit", "effective_label",
    "effective_length",
    "effective_table", "factor_label", "load_rows", "markdown", "paper_protocol", "pct", "plot_dispersion",
    "plot_exact_match", "plot_task", "render", "seed_interval", "select_settings", "summarize", "t_quantile",
    "task_settings_table", "task_table",
    "write_leaderboard",
]
