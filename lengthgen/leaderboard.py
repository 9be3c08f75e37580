"""Leaderboard: tables, CSV, a standalone HTML page and plots, as pure functions of result rows.

Per task, one table row per backend (+ position scheme): exact match at every evaluated length
factor as the mean over seeds with a 95% interval (Student t over per-seed exact match with ≥ 2
seeds, the run's own Wilson interval with 1 seed), the seed count, failed runs, and the effective
length. The paper's reported numbers (design.md §5) are added as separate, labelled rows.

Everything written is deterministic: the same rows give byte-identical files (rows are sorted,
floats have fixed formats, nothing depends on the clock, PNGs carry no software/date metadata).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import html
import io
import json
import math
import os
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from lengthgen.files import atomic_write  # noqa: E402
from lengthgen.harness.results import load_results  # noqa: E402

#: Mean exact match a factor must reach (at it and every shorter factor) for the effective length.
EFFECTIVE_THRESHOLD = 0.9

#: The paper's Table 1 as quoted in design.md §5: task → method → factor → exact match (%).
#: Trained at lengths [32, 64]; factors are multiples of 64. Blank cells there are absent here.
PAPER_REPORTED: dict[str, dict[str, dict[int, float]]] = {
    "mqmtar": {
        "softmax": {1: 100, 2: 100, 4: 100, 16: 99.5, 64: 97.8, 256: 80.2, 1024: 3.0},
        "entmax": {1: 100, 2: 100, 4: 100, 16: 99.5, 64: 92.7, 256: 66.8, 1024: 9.3},
        "asentmax": {1: 100, 2: 100, 4: 100, 16: 99.7, 64: 99.6, 256: 99.0, 1024: 95.3},
    },
    "sort": {
        "softmax": {1: 100, 2: 0, 4: 0, 8: 0},
        "ssmax": {1: 100, 2: 0, 4: 0, 8: 0},
        "entmax": {1: 100, 2: 99.3, 4: 57.8, 8: 0},
        "asentmax": {1: 100, 2: 100, 4: 79.7, 8: 0},
    },
    "copy": {
        "softmax": {1: 100, 2: 100, 4: 99.9, 8: 99.9, 16: 99.4, 64: 85.5},
        "asentmax": {1: 100, 2: 100, 4: 99.9, 8: 99.7, 16: 99.4, 64: 86.6},
    },
}
PAPER_LABEL = "paper (reported)"
DEFAULT_TITLE = "lengthgen leaderboard"

CSV_COLUMNS: tuple[str, ...] = (
    "task", "source", "method", "pos", "recipe", "factor", "eval_length", "n_seeds", "exact_match",
    "ci_lo", "ci_hi", "ci_method", "attn_entropy", "attn_support", "n_samples", "effective_length",
    "effective_length_capped", "runs", "runs_failed",
)


# -- loading --------------------------------------------------------------------------------------
def load_rows(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Result rows of a sweep folder (its ``data/``), a results folder or one Parquet file."""
    return load_results(path)


# -- statistics -----------------------------------------------------------------------------------
def _t_two_sided_mass(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's t with integer ``df`` (closed-form finite series, A&S 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2 == 1:
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):  # c, (2/3)c^3, (2·4)/(3·5)c^5, …
            if k > 1:
                term *= c * c * (2 * (k - 1)) / (2 * (k - 1) + 1)
            total += term
        return (2 / math.pi) * (theta + s * total)
    total, term = 1.0, 1.0
    for k in range(1, df // 2):  # 1, (1/2)c^2, (1·3)/(2·4)c^4, …
        term *= c * c * (2 * k - 1) / (2 * k)
        total += term
    return s * total


@functools.cache
def t_quantile(df: int, confidence: float = 0.95) -> float:
    """Two-sided Student-t critical value (e.g. 12.706 for df 1, 2.776 for df 4); exact bisection."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be ≥ 1, got {df}")
    lo, hi = 0.0, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_two_sided_mass(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int
    method: str  # "t", "wilson" or "none"


def seed_interval(values: Sequence[float], wilson: tuple[float, float] | None = None) -> Interval:
    """Mean over seeds with a 95% interval, clipped to [0, 1].

    ≥ 2 seeds: Student t over the per-seed values. 1 seed: the run's Wilson interval (its samples)
    when given. The mean uses ``math.fsum`` over sorted values so it does not depend on row order.
    """
    xs = sorted(float(v) for v in values)
    n = len(xs)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0, "none")
    mean = math.fsum(xs) / n
    if n == 1:
        if wilson is None or any(v is None or math.isnan(v) for v in wilson):
            return Interval(mean, math.nan, math.nan, 1, "none")
        return Interval(mean, float(wilson[0]), float(wilson[1]), 1, "wilson")
    half = t_quantile(n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return Interval(mean, max(0.0, mean - half), min(1.0, mean + half), n, "t")


def effective_length(means: dict[int, float], threshold: float = EFFECTIVE_THRESHOLD) -> tuple[int, bool]:
    """Largest factor f with mean ≥ threshold at every evaluated factor ≤ f (0 if 1× fails or is absent).

    Returns (f, capped): ``capped`` means every evaluated factor passed, so the true effective
    length may be longer than the longest length evaluated. NaN counts as below the threshold.
    """
    factors = sorted(means)
    if not factors or factors[0] != 1:
        return 0, False
    best = 0
    for f in factors:
        value = means[f]
        if value is None or math.isnan(value) or value < threshold:
            return best, False
        best = f
    return best, True


# -- the summary table ----------------------------------------------------------------------------
def _recipe(config_json: Any, ignore: Sequence[str] = ("seed",)) -> str:
    """Hash of the run's config without its seed: runs that differ only by seed share it."""
    if not isinstance(config_json, str) or not config_json:
        return ""
    config = json.loads(config_json)
    for key in ignore:
        config.pop(key, None)
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:8]


def _prepared(rows: pd.DataFrame) -> pd.DataFrame:
    frame = rows.copy()
    # an evaluation variant (``lengthgen eval --param``) is a row of its own, labelled with it
    variants = frame["eval_variant"] if "eval_variant" in frame else [""] * len(frame)
    frame["recipe"] = [_recipe(c) + (f", {v}" if v else "")
                       for c, v in zip(frame["config_json"], variants, strict=True)]
    frame["pos"] = frame["pos"].fillna("")
    return frame.sort_values(["task", "attn", "pos", "recipe", "seed", "run_id", "factor"], kind="mergesort",
                             na_position="last").reset_index(drop=True)


def _group_labels(frame: pd.DataFrame) -> dict[tuple[str, str, str, str], str]:
    """Show the recipe hash only where one (task, backend, pos) holds runs of several recipes."""
    labels = {}
    for (task, attn, pos), group in frame.groupby(["task", "attn", "pos"], sort=True):
        recipes = sorted(group["recipe"].unique())
        for recipe in recipes:
            labels[(task, attn, pos, recipe)] = attn if len(recipes) == 1 else f"{attn} [{recipe}]"
    return labels


def _mean_or_nan(values: Iterable[Any]) -> float:
    xs = sorted(float(v) for v in values if v is not None and not pd.isna(v))
    return math.fsum(xs) / len(xs) if xs else math.nan


def summarize(rows: pd.DataFrame) -> pd.DataFrame:
    """Long table of measured cells plus the paper's rows: one line per (task, method, pos, factor).

    A method with no successful length at all (every run failed) keeps one line with NaN factor,
    so its failures still show.
    """
    out: list[dict[str, Any]] = []
    if not rows.empty:
        frame = _prepared(rows)
        labels = _group_labels(frame)
        for (task, attn, pos, recipe), group in frame.groupby(["task", "attn", "pos", "recipe"], sort=True):
            run_ok = group.groupby("run_id")["status"].agg(lambda s: bool((s == "ok").all()))
            ok = group[group["status"] == "ok"].dropna(subset=["factor"])
            base = {"task": task, "source": "measured", "method": labels[(task, attn, pos, recipe)],
                    "pos": pos, "recipe": recipe, "runs": int(run_ok.size),
                    "runs_failed": int((~run_ok).sum())}
            cells: list[dict[str, Any]] = []
            for factor, cell in ok.groupby("factor", sort=True):
                cell = cell.sort_values(["seed", "run_id"], kind="mergesort")
                wilson = None
                if len(cell) == 1:
                    wilson = (cell["exact_match_lo"].iloc[0], cell["exact_match_hi"].iloc[0])
                ci = seed_interval(cell["exact_match"].tolist(), wilson)
                cells.append({
                    **base, "factor": int(factor), "eval_length": int(cell["eval_length"].iloc[0]),
                    "n_seeds": ci.n, "exact_match": ci.mean, "ci_lo": ci.lo, "ci_hi": ci.hi,
                    "ci_method": ci.method, "attn_entropy": _mean_or_nan(cell["attn_entropy"]),
                    "attn_support": _mean_or_nan(cell["attn_support"]),
                    "n_samples": int(cell["n_samples"].sum()),
                })
            eff, capped = effective_length({c["factor"]: c["exact_match"] for c in cells})
            if not cells:
                cells.append({**base, "factor": None, "n_seeds": 0})
            for c in cells:
                c.update(effective_length=eff, effective_length_capped=capped)
            out.extend(cells)
    tasks = sorted({r["task"] for r in out}) if out else []
    for task in tasks:
        for method, by_factor in PAPER_REPORTED.get(task, {}).items():
            eff, capped = effective_length({f: v / 100 for f, v in by_factor.items()})
            for factor, value in sorted(by_factor.items()):
                out.append({
                    "task": task, "source": "paper", "method": method, "pos": "", "recipe": "",
                    "factor": factor, "exact_match": value / 100, "ci_method": "reported",
                    "effective_length": eff, "effective_length_capped": capped,
                })
    table = pd.DataFrame(out, columns=list(CSV_COLUMNS))
    # Measured rows first (by name), then the paper's in the order of its table.
    table["_rank"] = [_paper_rank(s, m) for s, m in zip(table["source"], table["method"], strict=True)]
    table = table.sort_values(["task", "_rank", "method", "pos", "recipe", "factor"], kind="mergesort",
                              na_position="last")
    return table.drop(columns="_rank").reset_index(drop=True)


_PAPER_ORDER = ("softmax", "ssmax", "entmax", "asentmax")


def _paper_rank(source: str, method: str) -> int:
    if source != "paper":
        return 0
    return 1 + (_PAPER_ORDER.index(method) if method in _PAPER_ORDER else len(_PAPER_ORDER))


# -- formatting -----------------------------------------------------------------------------------
def pct(value: Any, digits: int = 1) -> str:
    """Fraction → percent with fixed digits; never '-0.0'; '' for missing."""
    if value is None or pd.isna(value):
        return ""
    text = f"{100 * float(value):.{digits}f}"
    return text[1:] if text.startswith("-") and float(text) == 0 else text


def factor_label(factor: int) -> str:
    return "ID (1×)" if factor == 1 else f"{factor}×"


def effective_label(factor: Any, capped: Any) -> str:
    if factor is None or pd.isna(factor) or int(factor) == 0:
        return "—"
    return f"≥ {int(factor)}×" if bool(capped) else f"{int(factor)}×"


@dataclass(frozen=True)
class TableRow:
    """One displayed row: text cells plus the numbers the HTML page sorts by."""

    method: str
    pos: str
    seeds: str
    cells: tuple[str, ...]
    sort_values: tuple[float, ...]
    effective: str
    effective_value: int
    failed: str
    paper: bool


def task_table(summary: pd.DataFrame, task: str) -> tuple[list[int], list[TableRow]]:
    """The factors (columns) and display rows of one task."""
    part = summary[summary["task"] == task]
    factors = sorted(int(f) for f in part["factor"].dropna().unique())
    rows: list[TableRow] = []
    keys = part[["source", "method", "pos", "recipe"]].drop_duplicates()
    for source, method, pos, recipe in keys.itertuples(index=False):
        group = part[(part["source"] == source) & (part["method"] == method) & (part["pos"] == pos)
                     & (part["recipe"] == recipe)]
        by_factor = {int(r.factor): r for r in group.itertuples() if not pd.isna(r.factor)}
        first = group.iloc[0]
        paper = source == "paper"
        runs = 0 if paper else int(first["runs"])
        cells, sort_values = [], []
        for f in factors:
            r = by_factor.get(f)
            if r is None:
                cells.append("" if paper else "—")
                sort_values.append(-1.0)
                continue
            sort_values.append(float(r.exact_match))
            if paper:
                cells.append(pct(r.exact_match))
                continue
            text = pct(r.exact_match)
            if r.ci_method in ("t", "wilson"):
                text += f" [{pct(r.ci_lo)}, {pct(r.ci_hi)}]"
            if int(r.n_seeds) != runs:
                text += f" (n={int(r.n_seeds)})"
            cells.append(text)
        eff = first["effective_length"]
        rows.append(TableRow(
            method=f"{PAPER_LABEL}: {method}" if paper else str(method), pos="—" if paper else str(pos),
            seeds="—" if paper else str(runs), cells=tuple(cells), sort_values=tuple(sort_values),
            effective=effective_label(eff, first["effective_length_capped"]),
            effective_value=0 if pd.isna(eff) else int(eff),
            failed="—" if paper else str(int(first["runs_failed"])), paper=paper,
        ))
    return factors, rows


def markdown_table(factors: Sequence[int], rows: Sequence[TableRow]) -> str:
    header = ["backend", "pos", "seeds", *[factor_label(f) for f in factors], "eff. length", "failed runs"]
    align = ["---"] * 3 + ["---:"] * (len(factors) + 2)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        method = f"*{r.method}*" if r.paper else f"**{r.method}**"
        lines.append("| " + " | ".join([method, r.pos, r.seeds, *r.cells, r.effective, r.failed]) + " |")
    return "\n".join(lines)


# -- plots ----------------------------------------------------------------------------------------
def _ok_rows(rows: pd.DataFrame, task: str) -> pd.DataFrame:
    return rows[(rows["task"] == task) & (rows["status"] == "ok")].dropna(subset=["factor"])


def _finish(fig: Any, path: str | os.PathLike[str] | io.BytesIO) -> Any:
    """Save without software/date metadata so identical figures give identical bytes."""
    def save(handle: Any) -> None:
        fig.savefig(handle, format="png", metadata={"Software": None})

    try:
        if isinstance(path, io.BytesIO):
            save(path)
            return path
        return atomic_write(path, save)
    finally:
        plt.close(fig)


def _colors(task: str, methods: Iterable[str]) -> dict[str, Any]:
    """One color per method name, the same in both figures of a task (paper lines included)."""
    cmap = plt.get_cmap("tab10")
    names = sorted(set(methods) | set(PAPER_REPORTED.get(task, {})))
    return {m: cmap(i % 10) for i, m in enumerate(names)}


def _factor_axis(ax: Any, factors: Iterable[float]) -> None:
    """log2 x axis with ticks at the evaluated factors, labelled 1×, 2×, …"""
    ticks = sorted({float(f) for f in factors})
    ax.set_xscale("log", base=2)
    if ticks:
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{int(f)}×" for f in ticks], fontsize=8)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("evaluation length / training length")


def plot_exact_match(rows: pd.DataFrame, task: str, path: str | os.PathLike[str] | io.BytesIO,
                     summary: pd.DataFrame | None = None) -> Any:
    """Exact match vs length factor (log2 axis), mean over seeds with its 95% band, one line per
    backend (+ pos); the paper's reported numbers as dashed lines with crosses."""
    table = summary if summary is not None else summarize(_ok_rows(rows, task))
    part = table[(table["task"] == task)].dropna(subset=["factor"])
    measured = part[part["source"] == "measured"]
    keys = sorted({(m, p) for m, p in zip(measured["method"], measured["pos"], strict=True)})
    paper = part[part["source"] == "paper"]
    colors = _colors(task, [k[0] for k in keys])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=100)
    for method, pos in keys:
        line = measured[(measured["method"] == method) & (measured["pos"] == pos)].sort_values("factor")
        x = line["factor"].to_numpy(dtype=float)
        ax.plot(x, line["exact_match"], marker="o", ms=3, color=colors[method], label=f"{method} ({pos})")
        band = line.dropna(subset=["ci_lo", "ci_hi"])
        if not band.empty:
            ax.fill_between(band["factor"].to_numpy(dtype=float), band["ci_lo"], band["ci_hi"],
                            color=colors[method], alpha=0.2, linewidth=0)
    for method in sorted(paper["method"].unique()):
        line = paper[paper["method"] == method].sort_values("factor")
        ax.plot(line["factor"].to_numpy(dtype=float), line["exact_match"], linestyle="--", marker="x",
                ms=4, linewidth=1, color=colors[method], alpha=0.7, label=f"{method}: {PAPER_LABEL}")
    _factor_axis(ax, part["factor"])
    ax.set_ylabel("exact match (mean over seeds, 95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(f"{task}: exact match vs length")
    if keys or not paper.empty:
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _finish(fig, path)


def plot_dispersion(rows: pd.DataFrame, task: str, path: str | os.PathLike[str] | io.BytesIO) -> Any:
    """The dispersion picture: normalized attention entropy and support size vs length factor,
    mean over seeds with the min–max band, one line per backend (+ pos)."""
    ok = _prepared(_ok_rows(rows, task))
    labels = _group_labels(ok)
    fig, (ax_e, ax_s) = plt.subplots(1, 2, figsize=(9.6, 3.8), dpi=100)
    groups = sorted(ok.groupby(["task", "attn", "pos", "recipe"], sort=True), key=lambda kv: kv[0])
    colors = _colors(task, [labels[k] for k, _ in groups])
    for key, group in groups:
        label = labels[key]
        for ax, column in ((ax_e, "attn_entropy"), (ax_s, "attn_support")):
            stats = []
            for factor, cell in group.groupby("factor", sort=True):
                values = sorted(float(v) for v in cell[column] if not pd.isna(v))
                if values:
                    stats.append((float(factor), math.fsum(values) / len(values), values[0], values[-1]))
            if not stats:
                continue
            x, mean, lo, hi = (list(t) for t in zip(*stats, strict=True))
            ax.plot(x, mean, marker="o", ms=3, color=colors[label], label=f"{label} ({key[2]})")
            ax.fill_between(x, lo, hi, color=colors[label], alpha=0.2, linewidth=0)
    for ax in (ax_e, ax_s):
        _factor_axis(ax, ok["factor"])
        ax.grid(True, alpha=0.3)
    ax_e.set_ylabel("normalized attention entropy")
    ax_e.set_ylim(-0.02, 1.02)
    ax_s.set_ylabel("support size (keys with weight > 0)")
    ax_s.set_yscale("log", base=2)
    ax_e.set_title(f"{task}: attention entropy")
    ax_s.set_title(f"{task}: attention support")
    if groups:
        ax_e.legend(fontsize=7)
    fig.tight_layout()
    return _finish(fig, path)


# -- protocol, commands ---------------------------------------------------------------------------
def _values(series: pd.Series) -> str:
    items = sorted({str(v) for v in series.dropna()})
    return ", ".join(items) if items else "—"


def _train_range(task: str, config: dict[str, Any]) -> str:
    """The training length range as the harness draws it (default low end: max(task minimum, L/2))."""
    top, low = config["train"]["train_length"], config["train"]["min_train_length"]
    if low is None:
        try:
            from lengthgen.tasks import get_task

            low = max(get_task(task, **config.get("task_params", {})).min_length, top // 2)
        except Exception:  # a task this installation does not know
            return f"L/2..{top}"
    return f"{low}..{top}"


def protocol_lines(rows: pd.DataFrame) -> list[str]:
    """What the rows say about how they were produced (per task, then environment)."""
    lines = ["| task | preset | train lengths | steps | batch | selection | eval factors | "
             "samples per length | runs | train + eval time |",
             "|---|---|---|---:|---:|---|---|---|---:|---:|"]
    for task, group in sorted(rows.groupby("task"), key=lambda kv: kv[0]):
        configs = [json.loads(c) for c in sorted(set(group["config_json"].dropna()))]
        batch = _values(pd.Series([c["train"]["batch_size"] for c in configs]))
        train = ", ".join(sorted({_train_range(task, c) for c in configs})) or "—"
        ok = group[group["status"] == "ok"].dropna(subset=["factor"])
        factors = sorted(set(ok["factor"].astype(int)))
        fac = f"1×..{factors[-1]}×" if factors else "—"
        n = ok["n_samples"].dropna().astype(int)
        samples = "—" if n.empty else (f"{n.max()}" if n.min() == n.max() else f"{n.max()} (1×) .. {n.min()}")
        per_run = group.drop_duplicates("run_id")
        seconds = math.fsum(float(v) for v in per_run["train_seconds"].dropna())
        seconds += math.fsum(float(v) for v in ok["eval_seconds"].dropna())
        cells = [task, _values(group["preset"]), train, _values(group["steps"]), batch,
                 _values(group["selection"]), fac, samples, str(per_run["run_id"].nunique()),
                 f"{seconds / 60:.1f} min"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _sweep_flags(task: str, config: dict[str, Any]) -> tuple[str, ...] | None:
    """The flags that make ``lengthgen sweep`` build ``config`` (bar backend, position, seed):
    dedicated flags where they exist, ``--set`` for any other field that differs from the preset.
    None when this installation cannot rebuild it (unknown task or preset)."""
    from lengthgen.config import SECTIONS, build_run_config
    from lengthgen.sweeps import SweepSpec

    try:
        preset = config["preset"]
        default = build_run_config(task, "softmax", preset=preset).model_dump(mode="json")
        dedicated = {"steps": ("train", "steps"), "train_length": ("train", "train_length"),
                     "max_factor": ("eval", "max_factor"), "eval_samples": ("eval", "samples")}
        chosen = {name: config[s][k] for name, (s, k) in dedicated.items() if config[s][k] != default[s][k]}
        params = {k: v for k, v in sorted(config["task_params"].items())
                  if default["task_params"].get(k) != v}
        spec = SweepSpec(tasks=(task,), attns=("softmax",), preset=preset, task_params=params, **chosen)
        built = spec.configs()[0].model_dump(mode="json")
    except Exception:
        return None
    flags = [f"--{name.replace('_', '-')} {value}" for name, value in chosen.items()]
    flags += [f"--param {_shell_quote(f'{k}={json.dumps(v)}')}" for k, v in params.items()]
    for section in SECTIONS:
        for key, value in sorted(config[section].items()):
            if built[section].get(key) != value:
                flags.append(f"--set {_shell_quote(f'{section}.{key}={json.dumps(value)}')}")
    return (f"--preset {preset}", *flags)


def _sweep_commands(rows: pd.DataFrame, sweep_dir: str) -> list[str]:
    """`lengthgen sweep` commands that rebuild the runs in the rows: one per set of tasks sharing
    backends, position scheme, seeds and recipe (flags only where they differ from the preset).
    Position schemes get separate commands so that a scheme run with only some backends is not
    crossed with all of them."""
    groups: dict[tuple[str, ...], list[str]] = {}
    grid_fields = ("seed", "attn", "attn_options", "pos")  # what varies inside one sweep command
    frame = rows.assign(recipe=[_recipe(c, grid_fields) for c in rows["config_json"]])
    for (task, _, _), group in frame.groupby(["task", "recipe", "pos"], sort=True, dropna=False):
        known = sorted(group["config_json"].dropna())
        flags = _sweep_flags(task, json.loads(known[0])) if known else None
        if flags is None:
            flags = (f"--preset {_values(group['preset'])}", "# (recipe not rebuildable here)")
        seeds = ",".join(str(s) for s in sorted(set(group["seed"].dropna().astype(int))))
        attns = _shell_quote(",".join(sorted(set(group["attn"]))))
        positions = ",".join(sorted(set(group["pos"].dropna())))
        groups.setdefault((attns, positions, seeds, *flags), []).append(task)
    commands = []
    for key, tasks in sorted(groups.items(), key=lambda kv: (kv[1], kv[0])):
        attns, pos, seeds, *flags = key
        tail = [f for f in flags if f.startswith("#")]
        flags = [f for f in flags if not f.startswith("#")]
        parts = ["lengthgen sweep", f"--task {','.join(tasks)}", f"--attn {attns}", f"--pos {pos}",
                 f"--seeds {seeds}", *flags, f"--out {_shell_quote(sweep_dir)}", *tail]
        commands.append(" ".join(parts))
    return commands


# -- the outputs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rendered:
    """All outputs of a leaderboard in memory (file name → bytes), so writing is one step."""

    files: dict[str, bytes]


def render(rows: pd.DataFrame, *, title: str = DEFAULT_TITLE, source: str = "DIR",
           out_name: str = "OUT", hardware: str | None = None) -> Rendered:
    """README.md, leaderboard.csv, leaderboard.html and plots/*.png for the rows."""
    rows = rows.sort_values(["task", "attn", "pos", "seed", "run_id", "factor"], kind="mergesort",
                            na_position="last").reset_index(drop=True)
    summary = summarize(rows)
    tasks = sorted(rows["task"].dropna().unique())
    files: dict[str, bytes] = {}
    md = [f"# {title}", "",
          f"Generated by `lengthgen leaderboard` from {len(rows)} result rows "
          f"({rows['run_id'].nunique()} runs); a pure function of those rows, so regenerating from the "
          "same data reproduces these files byte for byte.", "",
          "**Cells**: exact match (%) at each evaluation length, as a multiple of the training length: "
          "mean over seeds [95% CI]. With ≥ 2 seeds the interval is a Student-t interval over the "
          "per-seed exact match (it is degenerate, zero-width, when every seed scores the same); with 1 "
          "seed it is the run's Wilson interval over its test samples. `(n=k)` marks cells with fewer "
          "seeds than the row (runs that failed at that length). **eff. length**: the largest factor "
          f"whose mean exact match stays ≥ {EFFECTIVE_THRESHOLD * 100:.0f}% at every evaluated factor up to "
          "it (`≥` when even the longest evaluated length passes; — when 1× does not). "
          f"Rows marked *{PAPER_LABEL}* are the paper's Table 1 as quoted in design.md §5, not measured "
          "here: the paper's models and training (train lengths 32..64), blank where not reported; their "
          "effective length is taken over the reported factors.", ""]
    html_sections: list[str] = []
    for task in tasks:
        factors, table_rows = task_table(summary, task)
        exact_png = _finish_bytes(plot_exact_match(rows, task, io.BytesIO(), summary=summary))
        disp_png = _finish_bytes(plot_dispersion(rows, task, io.BytesIO()))
        files[f"plots/{task}_exact_match.png"] = exact_png
        files[f"plots/{task}_dispersion.png"] = disp_png
        md += [f"## {task}", "", markdown_table(factors, table_rows), "",
               f"![{task}: exact match vs length](plots/{task}_exact_match.png)", "",
               f"![{task}: attention entropy and support vs length](plots/{task}_dispersion.png)", ""]
        html_sections.append(_html_section(task, factors, table_rows, exact_png, disp_png))
    protocol = protocol_lines(rows)
    env = [f"- device: {_values(rows['device'])}" + (f"; hardware: {hardware}" if hardware else ""),
           f"- lengthgen {_values(rows['lengthgen_version'])}, torch {_values(rows['torch_version'])}",
           "- evaluation: a fixed test set per (task, length), independent of the training seed (paired); "
           "checkpoint selection as in the table (`id` = in-distribution validation)."]
    commands = [*_sweep_commands(rows, source),
                f"lengthgen leaderboard {_shell_quote(source)} --out {_shell_quote(out_name)}"
                + (f" --hardware {_shell_quote(hardware)}" if hardware else "")
                + (f" --title {_shell_quote(title)}" if title != DEFAULT_TITLE else "")]
    md += ["## Protocol and hardware", "", *protocol, "", *env, "", "## Reproduce", "",
           "Re-running a sweep command resumes it (finished runs are skipped).", "", "```sh", *commands,
           "```", ""]
    files["README.md"] = "\n".join(md).encode()
    files["leaderboard.csv"] = _csv(summary)
    files["leaderboard.html"] = _html(title, html_sections, protocol, env, commands).encode()
    return Rendered(files)


def _finish_bytes(buffer: io.BytesIO) -> bytes:
    return buffer.getvalue()


def _shell_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _csv(summary: pd.DataFrame) -> bytes:
    table = summary.copy()
    integers = ("factor", "eval_length", "n_seeds", "n_samples", "effective_length", "runs", "runs_failed")
    for column in integers:
        table[column] = table[column].astype("Int64")
    return table.to_csv(index=False, float_format="%.6f", lineterminator="\n").encode()


_HTML_STYLE = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}th,td{border:1px solid #ccc;padding:3px 7px}
th{background:#f0f0f0;cursor:pointer;user-select:none}td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.paper td{color:#666;font-style:italic;background:#fafafa}img{max-width:100%}
pre{background:#f6f6f6;padding:1em}"""

_HTML_SCRIPT = """document.querySelectorAll('table.sortable th').forEach(function(th, col){
  th.addEventListener('click', function(){
    var body = th.closest('table').tBodies[0], rows = Array.from(body.rows);
    var dir = th.dataset.dir === 'desc' ? 1 : -1; th.dataset.dir = dir === 1 ? 'asc' : 'desc';
    rows.sort(function(a, b){
      var x = a.cells[col].dataset.v, y = b.cells[col].dataset.v;
      if (x !== undefined && y !== undefined) return dir * (parseFloat(x) - parseFloat(y));
      return dir * a.cells[col].textContent.localeCompare(b.cells[col].textContent);
    });
    rows.forEach(function(r){ body.appendChild(r); });
  });
});"""


def _html_section(task: str, factors: Sequence[int], rows: Sequence[TableRow], exact_png: bytes,
                  disp_png: bytes) -> str:
    e = html.escape
    head = ["backend", "pos", "seeds", *[factor_label(f) for f in factors], "eff. length", "failed runs"]
    out = [f"<h2>{e(task)}</h2>", '<table class="sortable"><thead><tr>'
           + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr></thead><tbody>"]
    for r in rows:
        cells = [f"<td>{e(r.method)}</td>", f"<td>{e(r.pos)}</td>",
                 f'<td class="n" data-v="{r.seeds if r.seeds.isdigit() else -1}">{e(r.seeds)}</td>']
        cells += [f'<td class="n" data-v="{v:.6f}">{e(c)}</td>'
                  for c, v in zip(r.cells, r.sort_values, strict=True)]
        cells.append(f'<td class="n" data-v="{r.effective_value}">{e(r.effective)}</td>')
        cells.append(f'<td class="n" data-v="{r.failed if r.failed.isdigit() else -1}">{e(r.failed)}</td>')
        out.append(("<tr class=\"paper\">" if r.paper else "<tr>") + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    for png, alt in ((exact_png, "exact match vs length"), (disp_png, "attention entropy and support")):
        out.append(f'<p><img alt="{e(task)}: {alt}" src="data:image/png;base64,'
                   f'{base64.b64encode(png).decode()}"></p>')
    return "\n".join(out)


def _code(text: str) -> str:
    """Markdown `code` spans → <code> (the environment lines are shared with the README)."""
    import re

    return re.sub(r"`([^`]+)`", r"<code>\1</code>", text)


def _html(title: str, sections: Sequence[str], protocol: Sequence[str], env: Sequence[str],
          commands: Sequence[str]) -> str:
    e = html.escape
    proto_rows = [line.strip("|").split("|") for line in protocol]
    proto = ['<table><thead><tr>' + "".join(f"<th>{e(c.strip())}</th>" for c in proto_rows[0])
             + "</tr></thead><tbody>"]
    proto += ["<tr>" + "".join(f"<td>{e(c.strip())}</td>" for c in row) + "</tr>" for row in proto_rows[2:]]
    proto.append("</tbody></table>")
    return "\n".join([
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{e(title)}</title>",
        f"<style>{_HTML_STYLE}</style></head><body>", f"<h1>{e(title)}</h1>",
        "<p>Exact match (%) per evaluation length as a multiple of the training length: mean over seeds "
        "[95% CI] (Student t over seeds with ≥ 2 seeds, the run's Wilson interval with 1). Effective "
        f"length: the largest factor whose mean stays ≥ {EFFECTIVE_THRESHOLD * 100:.0f}% at every factor up "
        f"to it. Grey italic rows: {PAPER_LABEL} numbers, not measured here. Click a column to sort.</p>",
        *sections, "<h2>Protocol and hardware</h2>", *proto,
        "<ul>" + "".join(f"<li>{_code(e(line[2:]))}</li>" for line in env) + "</ul>",
        "<h2>Reproduce</h2>", "<pre>" + e("\n".join(commands)) + "</pre>",
        f"<script>{_HTML_SCRIPT}</script>", "</body></html>", "",
    ])


def write_leaderboard(rows: pd.DataFrame, out: str | os.PathLike[str], *, title: str = DEFAULT_TITLE,
                      source: str = "DIR", hardware: str | None = None) -> list[Path]:
    """Render and write every output under ``out`` (atomically, file by file); returns the paths."""
    rendered = render(rows, title=title, source=source, out_name=str(out), hardware=hardware)
    return [atomic_write(Path(out) / name, data) for name, data in sorted(rendered.files.items())]
