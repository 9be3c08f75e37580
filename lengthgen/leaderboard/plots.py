"""The leaderboard's figures: exact match, and attention entropy and support, against length.

Each (backend, scheme) gets its own colour (by backend) and line style (by scheme), the same in
every figure. A thick line is the mean over seeds; under it a thin line per seed, solid when the
seed learned the task (1× exact match ≥ 90%) and dotted when it did not, so a mean dragged down
by seeds that never learned reads as such. Legends sit outside the axes. Figures are SVG (or PNG
at 200 dpi, or PDF with embedded fonts for papers) without dates or software tags, so the same rows
give the same bytes.
"""

from __future__ import annotations

import io
import itertools
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from lengthgen.errors import UserError  # noqa: E402
from lengthgen.files import atomic_write  # noqa: E402
from lengthgen.harness.plots import plain_text  # noqa: E402
from lengthgen.harness.storage.results import load_results, usable  # noqa: E402
from lengthgen.leaderboard.long_table import summarize  # noqa: E402
from lengthgen.leaderboard.paper import PAPER_REPORTED, PAPER_TRAIN_LENGTHS, backend_rank  # noqa: E402
from lengthgen.leaderboard.rows import ok_rows, prepared  # noqa: E402
from lengthgen.leaderboard.stats import EFFECTIVE_THRESHOLD as EFFECTIVE_LINE  # noqa: E402
from lengthgen.leaderboard.stats import LEARNED_THRESHOLD, learned, stable_mean  # noqa: E402

Target = str | os.PathLike[str] | io.BytesIO

DISPERSION_CAPTION = (
    "Normalized entropy H(p)/log(visible keys) (0: all weight on one key, 1: uniform over the keys a "
    "row can see) and support (number of keys with nonzero weight), each averaged over heads, layers "
    "and the diagnosed query rows (every computed row; an evenly spaced subset at long lengths) of the "
    "evaluated test samples. Thick: mean over seeds; thin: one seed (solid: learned, dotted: did not)."
)

_SCHEME_STYLES = {"nape": "-", "alibi": (0, (6, 2)), "rope": (0, (4, 1.5, 1, 1.5)), "nope": (0, (2, 1))}
_EXTRA_STYLES = [(0, (8, 2, 2, 2)), (0, (3, 3)), (0, (1, 2))]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "<", ">"]
_LEARNED_STYLE, _UNLEARNED_STYLE = "-", (0, (1, 1.5))
_PAPER_STYLE = (0, (5, 1.5, 1, 1.5))
#: SVG text as paths; PDF fonts embedded as TrueType (Type 42), which journals accept, not Type 3.
_SAVE = {"svg.hashsalt": "lengthgen", "svg.fonttype": "path", "pdf.fonttype": 42}


def _format(path: Target, fmt: str | None) -> str:
    if fmt:
        return fmt
    suffix = Path(str(path)).suffix.lower().lstrip(".") if not isinstance(path, io.BytesIO) else ""
    return suffix if suffix in ("png", "svg", "pdf") else "svg" if isinstance(path, io.BytesIO) else "png"


#: No dates or software tags in the files, so the same rows give the same bytes.
_METADATA: dict[str, dict[str, None]] = {"svg": {"Date": None, "Creator": None},
                                         "pdf": {"CreationDate": None, "Creator": None, "Producer": None}}


def _finish(fig: Any, path: Target, fmt: str | None) -> Any:
    """Save without dates or software tags, so identical figures give identical bytes; a file
    through the one atomic writer."""
    kind = _format(path, fmt)
    metadata = _METADATA.get(kind, {"Software": None})

    def save(handle: Any) -> None:
        with plt.rc_context(_SAVE):
            fig.savefig(handle, format=kind, dpi=200, metadata=metadata)

    try:
        if isinstance(path, io.BytesIO):
            save(path)
            return path
        return atomic_write(path, save)
    finally:
        plt.close(fig)


class Styles:
    """Colour and marker per backend, line style per position scheme, over every task of the rows."""

    def __init__(self, backends: Iterable[str], schemes: Iterable[str]) -> None:
        cmap = plt.get_cmap("tab10")
        names = sorted(set(backends) | {m for t in PAPER_REPORTED.values() for m in t}, key=backend_rank)
        self.color = {b: cmap(i % 10) for i, b in enumerate(names)}
        self.marker = {b: _MARKERS[i % len(_MARKERS)] for i, b in enumerate(names)}
        extra = itertools.cycle(_EXTRA_STYLES)
        ordered = sorted(set(schemes), key=lambda s: (s != "nape", s))
        self.dash = {s: _SCHEME_STYLES[s] if s in _SCHEME_STYLES else next(extra) for s in ordered}
        self.first_scheme = ordered[0] if ordered else "nape"

    @classmethod
    def of(cls, frame: pd.DataFrame) -> Styles:
        return cls(frame["attn"].dropna().unique(), frame["pos"].dropna().unique())


def _factor_axis(ax: Any, factors: Iterable[float]) -> None:
    """log2 x axis with ticks at the evaluated factors, labelled 1×, 2×, …"""
    ticks = sorted({float(f) for f in factors})
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{int(f)}×" for f in ticks], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("evaluation length / training length")


#: The longest legend entry: a longer name (a submission's, a plugin's) is cut with an ellipsis, so a
#: legend never squeezes the axes to nothing; the tables carry the whole name.
LEGEND_CHARS = 48


def legend_label(text: str) -> str:
    return text if len(text) <= LEGEND_CHARS else text[: LEGEND_CHARS - 1] + "…"


def _shown(frame: pd.DataFrame, summary: pd.DataFrame, task: str) -> list[tuple[str, str, str, str]]:
    """(backend, scheme, setting id, legend label) of every measured row the task's table shows."""
    part = summary[(summary["task"] == task) & (summary["source"] == "measured")
                   & summary["chosen"].astype(bool)]
    keys = part[["method", "pos", "recipe", "setting", "selection"]]
    keys = keys.drop_duplicates(["method", "pos", "recipe"])
    out = []
    for method, pos, recipe, setting, selection in keys.itertuples(index=False):
        several = str(selection).startswith("n/a")
        label = f"{method} ({pos})" + (f" [{setting}]" if several else "")
        out.append((method, pos, recipe, legend_label(plain_text(label))))  # names from data: never math
    return out


def _seed_lines(ax: Any, runs: pd.DataFrame, column: str, scale: float, color: Any) -> None:
    """A thin line per seed: solid when it learned, dotted when it did not."""
    for _, run in runs.groupby("run_id", sort=True):
        run = run.sort_values("factor")
        one_x = run.loc[run["factor"] == 1, "exact_match"]
        style = _LEARNED_STYLE if not one_x.empty and learned(one_x.iloc[0]) else _UNLEARNED_STYLE
        values = run[column].astype(float) * scale
        ax.plot(run["factor"].astype(float), values, color=color, linestyle=style, linewidth=0.8, alpha=0.55,
                zorder=2)


def _mean_line(ax: Any, runs: pd.DataFrame, column: str, scale: float, styles: Styles, attn: str, pos: str,
               label: str | None) -> None:
    means = [(float(f), stable_mean(cell[column]) * scale) for f, cell in runs.groupby("factor", sort=True)]
    if means:
        x, y = zip(*means, strict=True)
        hollow = pos != styles.first_scheme  # schemes after the first: hollow markers as well as dashes
        color = styles.color[attn]
        ax.plot(x, y, color=color, linestyle=styles.dash[pos], marker=styles.marker[attn], ms=4.5,
                markerfacecolor="white" if hollow else color, linewidth=2.2, label=label, zorder=3)


def _seed_key() -> list[Line2D]:
    return [Line2D([], [], color="0.35", linewidth=0.8, linestyle=_LEARNED_STYLE,
                   label=f"one seed that learned (1× ≥ {LEARNED_THRESHOLD * 100:.0f}%)"),
            Line2D([], [], color="0.35", linewidth=0.8, linestyle=_UNLEARNED_STYLE,
                   label="one seed that did not")]


def plot_exact_match(rows: pd.DataFrame, task: str, path: Target, summary: pd.DataFrame | None = None,
                     fmt: str | None = None) -> Any:
    """Exact match (%) vs length factor: per (backend, scheme) the mean over seeds of the setting
    the table shows, its seeds under it, and the paper's reported numbers (dash-dot, crosses)."""
    frame = prepared(rows)
    table = summary if summary is not None else summarize(rows)
    styles = Styles.of(frame)
    ok = ok_rows(frame, task)
    fig, ax = plt.subplots(figsize=(9.0, 4.4), layout="constrained")
    for attn, pos, setting, label in _shown(frame, table, task):
        runs = ok[(ok["attn"] == attn) & (ok["pos"] == pos) & (ok["setting"] == setting)]
        _seed_lines(ax, runs, "exact_match", 100.0, styles.color[attn])
        _mean_line(ax, runs, "exact_match", 100.0, styles, attn, pos, label)
    paper = PAPER_REPORTED.get(task, {})
    for method in sorted(paper, key=backend_rank):
        points = sorted(paper[method].items())
        ax.plot([float(f) for f, _ in points], [v for _, v in points], color=styles.color[method],
                linestyle=_PAPER_STYLE, marker="x", ms=5, linewidth=1.3,
                label=legend_label(f"paper: {method} (trained at {PAPER_TRAIN_LENGTHS})"), zorder=3)
    factors = list(ok["factor"]) + [f for m in paper.values() for f in m]
    _factor_axis(ax, factors)
    ax.set_ylabel("exact match (%)")
    ax.set_ylim(-2, 102)
    ax.grid(True, alpha=0.3)
    ax.set_title(plain_text(f"{task}: exact match vs length"))
    handles, _ = ax.get_legend_handles_labels()
    fig.legend(handles=[*handles, *_seed_key()], loc="outside right upper", fontsize=8, frameon=False)
    return _finish(fig, path, fmt)


def plot_dispersion(rows: pd.DataFrame, task: str, path: Target, summary: pd.DataFrame | None = None,
                    fmt: str | None = None) -> Any:
    """Normalized attention entropy and support size vs length factor, drawn like the exact-match
    figure (mean over seeds, a thin line per seed); ``DISPERSION_CAPTION`` says what they average."""
    frame = prepared(rows)
    table = summary if summary is not None else summarize(rows)
    styles = Styles.of(frame)
    ok = ok_rows(frame, task)
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(12.0, 4.8), layout="constrained")
    for attn, pos, setting, label in _shown(frame, table, task):
        runs = ok[(ok["attn"] == attn) & (ok["pos"] == pos) & (ok["setting"] == setting)]
        for ax, column in ((ax_e, "attn_entropy"), (ax_s, "attn_support")):
            present = runs.dropna(subset=[column])
            _seed_lines(ax, present, column, 1.0, styles.color[attn])
            _mean_line(ax, present, column, 1.0, styles, attn, pos, label if ax is ax_e else None)
    for ax in (ax_e, ax_s):
        _factor_axis(ax, ok["factor"])
        ax.grid(True, alpha=0.3)
    ax_e.set_ylabel("normalized entropy H(p) / log(visible keys)")
    ax_e.set_ylim(-0.02, 1.02)
    ax_s.set_ylabel("support size (keys with weight > 0)")
    ax_s.set_yscale("log", base=2)
    ax_e.set_title(plain_text(f"{task}: attention entropy"))
    ax_s.set_title(plain_text(f"{task}: attention support"))
    handles, _ = ax_e.get_legend_handles_labels()
    fig.legend(handles=[*handles, *_seed_key()], loc="outside right upper", fontsize=8, frameon=False)
    return _finish(fig, path, fmt)


OVERVIEW_CAPTION = (
    "Every task at a glance: exact match (%) against length, one panel per task, the mean over seeds of "
    "each backend's chosen setting (the per-task figures below add every seed and the paper's numbers). "
    "The dotted line is the 90% of the effective length."
)


def plot_task(results: Path, where: str, task: str, target: Path, kind: str) -> Any:
    """``lengthgen plot``: one figure of one task from the rows under ``results`` (``where`` as the
    user named it), as on the leaderboard: ``exact`` match or ``dispersion`` against length; a
    one-line ``UserError`` for a file name that is no SVG or PNG, or a task without ok rows."""
    if target.suffix.lower() not in (".svg", ".png"):
        raise UserError(f"bad -o {str(target)!r}: the file name must end in .svg or .png")
    rows = usable(load_results(results), repr(where))
    tasks = sorted(rows.loc[rows["status"] == "ok", "task"].dropna().unique())
    if task not in tasks:
        raise UserError(f"no ok results for task {task!r} under {where!r}; "
                        f"tasks with results: {', '.join(tasks) or '(none)'}")
    return (plot_exact_match if kind == "exact" else plot_dispersion)(rows, task, target)


def plot_overview(rows: pd.DataFrame, path: Target, summary: pd.DataFrame | None = None,
                  fmt: str | None = None) -> Any:
    """Small multiples: one panel per task, exact match against length, every backend's mean; the
    first screen's figure (one shared legend, panels in a row of up to three)."""
    frame = prepared(rows)
    table = summary if summary is not None else summarize(rows)
    styles = Styles.of(frame)
    tasks = sorted(frame["task"].dropna().unique())
    columns = min(3, max(1, len(tasks)))
    lines = -(-len(tasks) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(3.4 * columns + 1.8, 2.6 * lines), squeeze=False,
                             layout="constrained")
    for ax in axes.flat[len(tasks):]:
        ax.set_visible(False)
    labels: dict[str, Any] = {}
    for ax, task in zip(axes.flat, tasks, strict=False):
        ok = ok_rows(frame, task)
        for attn, pos, setting, label in _shown(frame, table, task):
            runs = ok[(ok["attn"] == attn) & (ok["pos"] == pos) & (ok["setting"] == setting)]
            _mean_line(ax, runs, "exact_match", 100.0, styles, attn, pos, label)
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            labels.setdefault(label, handle)
        ax.axhline(100 * EFFECTIVE_LINE, color="0.5", linewidth=0.8, linestyle=(0, (1, 2)))
        _factor_axis(ax, ok["factor"])
        ax.set_xlabel("× training length", fontsize=8)
        ax.tick_params(axis="x", labelsize=6, labelrotation=60)
        ax.set_ylim(-2, 102)
        ax.grid(True, alpha=0.3)
        ax.set_title(plain_text(task), fontsize=10)
    axes[0][0].set_ylabel("exact match (%)")
    ordered = sorted(labels.items(), key=lambda kv: backend_rank(kv[0].split(" ")[0]))
    fig.legend(handles=[h for _, h in ordered], loc="outside right upper", fontsize=8, frameon=False)
    return _finish(fig, path, fmt)


BUDGET_CAPTION = (
    "MQMTAR exact match at 256× (left) and 1024× (right) against training sequences (log scale): the mean "
    "over seeds of each backend at the preset width (thick), each seed (dots, joined across budgets by a "
    "thin line), the wider model (hollow "
    "markers, dashed), the paper's reported points at its budget (crosses) and, at 1024×, the fitted "
    "trend of the preset width, from the first budget it is fitted on to the paper's budget, or only over "
    "its own budgets where its range is too wide to extrapolate (thin dashes; see the list below the "
    "table for its range)."
)
COPY_BUDGET_CAPTION = (
    "Copy exact match at 16× (left) and 32× (right) against training sequences (log scale): the mean over "
    "seeds of each backend (thick), each seed (dots, joined across budgets by a thin line) and the paper's "
    "reported points at its budget (crosses; its two backends report 99.4% at 16× and 96.1–96.3% at 32×, "
    "so theirs overlap). The first budget is the board's own runs."
)
NEAR_MISS_CAPTION = (
    "The chance that one near miss makes its query wrong (8 planted per query at 8×), against training "
    "sequences: the mean over seeds (thick) and each seed (dots, joined across budgets by a thin line); the "
    "dotted line is what 95% at 1024× allows (34 near misses per query at 1024×, 4 queries)."
)


def _per_seed(ax: Any, mine: list[Any], value: Callable[[Any], float | None], color: str,
              dashed: bool) -> None:
    """Each seed of a backend's budgets: a dot per budget and, for a seed run at several budgets, a
    thin line through them (the same seed number: its data and initialisation streams)."""
    by_seed: dict[int, list[tuple[float, float]]] = {}
    for p in mine:
        for s in p.seeds:
            v = value(s)
            if v is not None:
                by_seed.setdefault(s.seed, []).append((float(p.sequences), 100 * v))
    for pairs in by_seed.values():
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        ax.scatter(xs, ys, color=color, s=10, alpha=0.5, zorder=2)
        if len(pairs) > 1:
            ax.plot(xs, ys, color=color, linewidth=0.7, alpha=0.45, zorder=1,
                    linestyle=(0, (4, 2)) if dashed else "-")


#: A line to draw: its x and y values.
Curve = tuple[list[float], list[float]]
#: (backend, width, factor, the smallest budget) -> the fitted trend's line on that panel, or None.
TrendLine = Callable[[str, int, int, float], "Curve | None"]


def plot_budget(study: list[Any], path: Target, fmt: str | None = None) -> Any:
    """MQMTAR's exact match at 256× and 1024× against training sequences, a line per backend and
    width, with the paper's points and, at 1024×, the fitted trend."""
    from lengthgen.leaderboard.budget import LONG_FACTORS, PAPER_POINT, PAPER_SEQUENCES, trend

    def trend_line(attn: str, width: int, factor: int, x_low: float) -> Curve | None:
        if factor != LONG_FACTORS[-1]:
            return None
        return trend_curve(trend(study, attn, width, factor), x_low)

    return _plot_study(study, path, fmt, LONG_FACTORS, PAPER_POINT, PAPER_SEQUENCES, trend_line)


def trend_curve(fitted: Any, x_low: float) -> Curve | None:
    """The fitted trend as drawn (exact match in %): from its first budget (or ``x_low``) to the
    paper's budget where the fit supports an extrapolation, else over its own budgets only, so
    that a line too uncertain to read beyond its data does not point at the paper's."""
    from lengthgen.leaderboard.budget import PAPER_SEQUENCES, TARGET

    if not fitted.predicted or not fitted.slope:
        return None
    end = float(PAPER_SEQUENCES) if fitted.extrapolates else fitted.end or x_low
    xs, at = [max(x_low, fitted.start or x_low), end], math.log10(fitted.predicted)
    target_logit = math.log(TARGET / (1 - TARGET))
    return xs, [100 / (1 + math.exp(-(target_logit + fitted.slope * (math.log10(x) - at)))) for x in xs]


def plot_copy_budget(study: list[Any], path: Target, fmt: str | None = None) -> Any:
    """Copy's exact match at 16× and 32× against training sequences, a line per backend."""
    from lengthgen.leaderboard.copy_budget import PAPER_COPY_SEQUENCES

    paper = {attn: {f: v / 100 for f, v in scores.items()} for attn, scores in PAPER_REPORTED["copy"].items()}
    return _plot_study(study, path, fmt, (16, 32), paper, PAPER_COPY_SEQUENCES, None)


def _sequences_axis(ax: Any, sequences: Iterable[float]) -> None:
    """log x axis of training sequences, ticked and labelled (``768 K``) at the budgets shown only:
    over about a decade matplotlib would label its minor ticks too, and they collide."""
    from lengthgen.leaderboard.budget import sequences_label

    ticks = sorted({float(s) for s in sequences})
    ax.set_xscale("log")
    ax.set_xticks(ticks)
    ax.set_xticklabels([sequences_label(s) for s in ticks], fontsize=8)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("training sequences")


def _plot_study(study: list[Any], path: Target, fmt: str | None, factors: tuple[int, ...],
                paper: dict[str, dict[int, float]], paper_sequences: float,
                trend_line: TrendLine | None) -> Any:
    """A panel per factor: exact match against training sequences (log x), each backend's mean over
    seeds (thick; dashed and hollow for a wider model), each seed (thin), the paper's points, and a
    trend line where ``trend_line`` gives one."""
    styles = Styles([p.attn for p in study], ["nape"])
    widths = sorted({p.width for p in study})
    fig, axes = plt.subplots(1, len(factors), figsize=(11.0, 4.0), layout="constrained", squeeze=False)
    for ax, factor in zip(axes[0], factors, strict=True):
        for attn in sorted({p.attn for p in study}, key=backend_rank):
            for width in widths:
                mine = [p for p in study if p.attn == attn and p.width == width and p.values(factor)]
                if not mine:
                    continue
                x = [float(p.sequences) for p in mine]
                hollow = width != widths[0]
                _per_seed(ax, mine, lambda s, f=factor: s.exact.get(f), styles.color[attn], hollow)
                ax.plot(x, [100 * stable_mean(p.values(factor)) for p in mine], color=styles.color[attn],
                        marker=styles.marker[attn], markerfacecolor="white" if hollow else styles.color[attn],
                        linewidth=2.0, linestyle=(0, (4, 2)) if hollow else "-",
                        label=legend_label(plain_text(f"{attn}" + (f" (width {width})" if len(widths) > 1
                                                                   else ""))))
            first = min(p.sequences for p in study)
            line = trend_line(attn, widths[0], factor, first) if trend_line else None
            if line is not None:
                ax.plot(*line, color=styles.color[attn], linewidth=0.9, linestyle=(0, (2, 2)), zorder=1)
        for attn, scores in paper.items():
            if any(p.attn == attn for p in study) and factor in scores:
                ax.scatter([float(paper_sequences)], [100 * scores[factor]], marker="x", s=60,
                           color=styles.color[attn], label=plain_text(f"paper: {attn}"), zorder=3)
        _sequences_axis(ax, [p.sequences for p in study] + [paper_sequences])
        ax.set_ylim(-2, 102)
        ax.grid(True, alpha=0.3)
        ax.set_title(f"exact match at {factor}×")
    axes[0][0].set_ylabel("exact match (%)")
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize=8, frameon=False)
    return _finish(fig, path, fmt)


def plot_near_miss_error(study: list[Any], path: Target, fmt: str | None = None) -> Any:
    """The per-near-miss error against training sequences (log–log), with the 95%-at-1024× line."""
    from lengthgen.leaderboard.budget import ALLOWED_ERROR

    styles = Styles([p.attn for p in study], ["nape"])
    widths = sorted({p.width for p in study})
    fig, ax = plt.subplots(figsize=(7.5, 4.0), layout="constrained")
    for attn in sorted({p.attn for p in study}, key=backend_rank):
        for width in widths:
            mine = [p for p in study if p.attn == attn and p.width == width and p.errors()]
            if not mine:
                continue
            hollow = width != widths[0]
            _per_seed(ax, mine, lambda s: s.near_miss_error, styles.color[attn], hollow)
            ax.plot([float(p.sequences) for p in mine], [100 * stable_mean(p.errors()) for p in mine],
                    color=styles.color[attn], marker=styles.marker[attn],
                    markerfacecolor="white" if hollow else styles.color[attn], linewidth=2.0,
                    linestyle=(0, (4, 2)) if hollow else "-",
                    label=legend_label(plain_text(f"{attn}" + (f" (width {width})" if len(widths) > 1
                                                               else ""))))
    ax.axhline(100 * ALLOWED_ERROR, color="0.4", linestyle=(0, (1, 2)), linewidth=1.0,
               label=f"{100 * ALLOWED_ERROR:.3f}%: 95% at 1024×")
    _sequences_axis(ax, [p.sequences for p in study if p.errors()])
    ax.set_yscale("log")
    ax.grid(True, alpha=0.3, which="both")
    ax.set_ylabel("error per near miss (%)")
    fig.legend(loc="outside right upper", fontsize=8, frameon=False)
    return _finish(fig, path, fmt)
