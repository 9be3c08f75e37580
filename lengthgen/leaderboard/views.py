"""What each table of the leaderboard shows, built from the summary (see ``long_table``) and the rows.

- :func:`task_table`: per task, a row per (backend, scheme) with its chosen setting, then the
  pinned rows (per backend: our paper-protocol row right above the paper's own).
- :func:`effective_table`: effective length per task × backend.
- :func:`comparison_table`: the paper's protocol against ours, field by field, for one task.
- :func:`protocol_table`: how every task's runs were made (preset, lengths, compute time).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from lengthgen.errors import UserError
from lengthgen.leaderboard.paper import (
    PAPER_CAVEATS,
    PAPER_LABEL,
    PAPER_PROTOCOL,
    PAPER_SELECTION_LEVEL,
    PROTOCOL_LABEL,
    PROTOCOL_SELECTION_LEVEL,
    backend_rank,
)
from lengthgen.leaderboard.rows import config_dict
from lengthgen.leaderboard.selection import ONLY, PROVISIONAL
from lengthgen.leaderboard.stats import EFFECTIVE_THRESHOLD, LEARNED_THRESHOLD, is_missing
from lengthgen.leaderboard.tables import (
    Cell,
    Header,
    Row,
    Table,
    effective_label,
    effective_sort,
    factor_label,
    learned_cell,
    pct,
)
from lengthgen.registry import reading_data

NONE = "—"


def _seeds_title(per_seed: Any) -> str:
    """``s0=0.0;s2=0.99`` → 's0 0.0%, s2 99.0%'."""
    if not isinstance(per_seed, str) or not per_seed:
        return ""
    items = [item.partition("=") for item in per_seed.split(";")]
    return ", ".join(f"{seed} {pct(float(value))}%" for seed, _, value in items)


def _interval_cell(r: Any, runs: int, paper: bool) -> Cell:
    if paper:
        return Cell(pct(r.exact_match), float(r.exact_match), "reported by the paper")
    detail = ""
    if r.ci_method == "t":
        detail = f"[{pct(r.ci_lo)}, {pct(r.ci_hi)}]"
        title = (f"mean over {int(r.n_seeds)} seeds [95% Student-t interval over seeds]: "
                 f"{_seeds_title(r.per_seed)}")
    elif r.ci_method == "wilson":
        detail = f"[{pct(r.ci_lo)}, {pct(r.ci_hi)}]"
        title = (f"one run [95% Wilson interval over its {int(r.n_samples)} test samples]: "
                 f"{_seeds_title(r.per_seed)}")
    else:
        title = _seeds_title(r.per_seed)
    if int(r.n_seeds) != runs:
        detail += f" (n={int(r.n_seeds)})"
        title += f"; {int(r.n_seeds)} of {runs} runs reached this length"
    return Cell(pct(r.exact_match), float(r.exact_match), title, detail=detail.strip())


def seed_lengths(text: Any) -> str:
    """``s0=>=1024;s1=32`` → '≥ 1024 / 32' (— for a seed that fails even 1×)."""
    if not isinstance(text, str) or not text:
        return ""
    parts = []
    for item in text.split(";"):
        value = item.partition("=")[2]
        capped, factor = value.startswith(">="), int(value.removeprefix(">="))
        parts.append("—" if factor == 0 else f"{'≥ ' if capped else ''}{factor}")
    return " / ".join(parts)


def worst_seed_sort(r: Any) -> float:
    """The order of effective lengths: by the worst seed's (what every seed holds), then by the
    mean's, so a mean carried by some seeds never ranks above one that every seed reaches."""
    worst = r.get("effective_length_worst") if hasattr(r, "get") else None
    mean = effective_sort(r["effective_length"], r["effective_length_capped"])
    if is_missing(worst):
        return mean
    return effective_sort(worst if int(worst) else None, r.get("effective_length_worst_capped")) * 4096 + mean


def effective_cell(r: Any) -> Cell:
    """Effective length over all seeds with each seed's own beside it; when not every seed learned,
    also over the seeds that did (a mean that averages in seeds at 0% says "did not learn", not "did
    not extrapolate"). Sorted by the worst seed (``worst_seed_sort``)."""
    everyone = effective_label(r["effective_length"], r["effective_length_capped"])
    sort = worst_seed_sort(r)
    runs = 0 if is_missing(r["runs"]) else int(r["runs"])
    k = 0 if is_missing(r["learned_seeds"]) else int(r["learned_seeds"])
    seeds = seed_lengths(r.get("effective_length_seeds")) if runs > 1 else ""
    per_seed = f"seeds {seeds}" if seeds else ""
    seeds_title = f"; each seed's own: {seeds}" if seeds else ""
    if runs == 0 or k == runs:
        return Cell(everyone, sort, ("of the mean over every seed (every seed learned the task)"
                                     + seeds_title) if runs else "", detail=per_seed, wrap=True)
    if k == 0:
        return Cell(everyone, sort, "no seed learned the task in distribution: its extrapolation is not "
                    "measured", detail=f"0/{runs} learned", wrap=True)
    over_learned = effective_label(r["effective_length_learned"], r["effective_length_learned_capped"])
    return Cell(everyone, sort, f"first over all {runs} seeds, then over the {k} seeds that learned the task "
                f"(1× test exact match ≥ {LEARNED_THRESHOLD * 100:.0f}%){seeds_title}",
                detail=f"{over_learned} over {k}/{runs} learned · {per_seed}", wrap=True)


def _factor_headers(part: pd.DataFrame, factors: list[int]) -> list[Header]:
    headers = []
    for f in factors:
        lengths = sorted({int(v) for v in part.loc[part["factor"] == f, "eval_length"].dropna()})
        ours = f"ours: length {', '.join(map(str, lengths))}; " if lengths else ""
        headers.append(Header(factor_label(f), f"exact match (%) at {f}× the training length ({ours}paper "
                                               f"rows: {f}× 64)", numeric=True))
    return headers


def task_headers(part: pd.DataFrame, factors: list[int], schemes: bool) -> tuple[Header, ...]:
    return (
        Header("backend", "attention backend; the rows below the line are pinned: per backend, our run "
                          "chosen as the paper chose its numbers, then the paper's number"),
        *([Header("pos", "position scheme")] if schemes else []),
        Header("learned", f"seeds whose in-distribution (1×) test exact match is ≥ "
                          f"{LEARNED_THRESHOLD * 100:.0f}%, of all seeds", numeric=True),
        *_factor_headers(part, factors),
        Header("eff. length", f"largest factor whose mean exact match stays ≥ "
                              f"{EFFECTIVE_THRESHOLD * 100:.0f}% at every factor up to it "
                              "(≥: even the longest evaluated one passes), each seed's own below; when not "
                              "every seed learned, also over the seeds that learned", numeric=True),
    )


SETTINGS_HEADERS = (
    Header("backend", "attention backend; pinned below the line: our run chosen as the paper chose"),
    Header("pos", "position scheme"),
    Header("setting", "the setting (recipe without seed) shown: the one with the best mean "
                      "in-distribution validation exact match over the seeds every setting ran; "
                      "val = that mean (%)"),
    Header("runner-up", "the second-best setting by the same rule"),
    Header("seeds", "runs (seeds) of the setting", numeric=True),
    Header("failed", "runs recorded as failed (diverged, out of memory, …)", numeric=True),
)


def _setting_cells(first: Any) -> tuple[Cell, Cell]:
    val = "" if is_missing(first["val_exact_id"]) else f" · val {pct(first['val_exact_id'])}"
    detail = first["setting_detail"] if isinstance(first["setting_detail"], str) else ""
    setting = Cell(f"{first['setting']}{val}", None, f"{detail}. Selection: {first['selection']}.")
    if isinstance(first["runner_up"], str) and first["runner_up"]:
        runner_val = f" · val {pct(first['runner_up_val_exact_id'])}"
        return setting, Cell(f"{first['runner_up']}{runner_val}", None, "runner-up by mean 1× validation")
    if str(first["selection"]).startswith(PROVISIONAL):
        why = "no runner-up yet: the plan's other grid points are still to be screened"
    elif first["selection"] == ONLY:
        why = "no other setting was run"
    else:
        why = "no runner-up: settings cannot be ranked without validation scores"
    return setting, Cell(NONE, None, why)


def _backend_cell(first: Any) -> Cell:
    """The backend's name; one from another package shows that package and its version below."""
    package = first["attn_package"] if isinstance(first["attn_package"], str) else ""
    if not package or package.split(" ")[0] == "lengthgen":
        return Cell(str(first["method"]), None, "")
    return Cell(str(first["method"]), None, f"provided by {package}", detail=package)


def _factor_cells(group: pd.DataFrame, factors: list[int], runs: int, paper: bool) -> list[Cell]:
    by_factor = {int(r.factor): r for r in group.itertuples() if not is_missing(r.factor)}
    missing = Cell("", -1.0, "not reported") if paper else Cell(NONE, -1.0, "not evaluated")
    return [_interval_cell(by_factor[f], runs, paper) if f in by_factor else missing for f in factors]


def _measured_row(group: pd.DataFrame, factors: list[int], schemes: bool) -> Row:
    first = group.iloc[0]
    runs = int(first["runs"])
    by_factor = {int(r.factor): r for r in group.itertuples() if not is_missing(r.factor)}
    one_x = by_factor.get(1)
    learned = int(first["learned_seeds"])
    learned_title = (f"1× test exact match per seed: {_seeds_title(one_x.per_seed) if one_x else 'none'}; "
                     f"a seed learned when ≥ {LEARNED_THRESHOLD * 100:.0f}%")
    cells = [_backend_cell(first), *([Cell(str(first["pos"]))] if schemes else []),
             learned_cell(learned, runs, by_factor.keys(), learned_title),
             *_factor_cells(group, factors, runs, False), effective_cell(first)]
    return Row(tuple(cells))


def _protocol_label(first: Any) -> Cell:
    return Cell(f"{PROTOCOL_LABEL}: {first['method']}", None,
                "the single best run of this backend over seeds × settings × position schemes, "
                "selected on 8× validation exact match (never on test data), as the paper selected; "
                f"{PROTOCOL_SELECTION_LEVEL}; {PAPER_SELECTION_LEVEL}")


def _protocol_row(group: pd.DataFrame, factors: list[int], schemes: bool) -> Row:
    first = group.iloc[0]
    label = _protocol_label(first)
    pos = [Cell(str(first["pos"]) or NONE)] if schemes else []
    if is_missing(first["factor"]):
        why = Cell(f"{first['selection']} (no 8× validation scores to select on)", None,
                   "re-run or re-evaluate the runs to record validation scores", span=len(factors) + 2)
        return Row((label, *pos, why), kind="protocol")
    learned = int(first["learned_seeds"])
    cells = [label, *pos, Cell(f"{learned}/1", float(learned), f"{first['selection']}"),
             *_factor_cells(group, factors, 1, False),
             Cell(effective_label(first["effective_length"], first["effective_length_capped"]))]
    return Row(tuple(cells), kind="protocol")


def _paper_row(group: pd.DataFrame, factors: list[int], schemes: bool) -> Row:
    first = group.iloc[0]
    caveat = PAPER_CAVEATS.get((str(first["task"]), str(first["method"])))
    cells = [Cell(f"{PAPER_LABEL}: {first['method']}" + (" (see note)" if caveat else ""), None,
                  "the paper's reported number: its single best model over 3 seeds × several learning rates, "
                  "selected on 8× validation; factors are multiples of its training length 64"
                  + (f". Note: {caveat}" if caveat else "")),
             *([Cell(NONE)] if schemes else []), Cell(NONE),
             *_factor_cells(group, factors, 0, True),
             Cell(effective_label(first["effective_length"], first["effective_length_capped"]), None,
                  "over the reported factors only")]
    return Row(tuple(cells), kind="paper")


def _shown_groups(summary: pd.DataFrame, task: str) -> list[tuple[str, pd.DataFrame]]:
    part = summary[summary["task"] == task]
    shown = part[part["chosen"].astype(bool)]
    keys = shown[["source", "method", "pos", "recipe"]].drop_duplicates()
    return [(source, shown[(shown["source"] == source) & (shown["method"] == method) & (shown["pos"] == pos)
                           & (shown["recipe"] == recipe)])
            for source, method, pos, recipe in keys.itertuples(index=False)]


def task_table(summary: pd.DataFrame, task: str) -> Table:
    """The task's exact match by length: chosen settings (sortable), then the pinned protocol and
    paper rows. The position scheme gets a column only when the task ran several; the settings
    are in :func:`task_settings_table`, so that the lengths fit a laptop's screen."""
    part = summary[summary["task"] == task]
    factors = sorted(int(f) for f in part["factor"].dropna().unique())
    measured = part[part["source"] == "measured"]
    schemes = measured["pos"].nunique() > 1
    rows, pinned = [], []
    for source, group in _shown_groups(summary, task):
        if source == "measured":
            rows.append(_measured_row(group, factors, schemes))
        elif source == "protocol":
            pinned.append(_protocol_row(group, factors, schemes))
        else:
            pinned.append(_paper_row(group, factors, schemes))
    return Table(task_headers(part, factors, schemes), tuple(rows), tuple(pinned),
                 label=f"{task}: exact match by length")


def task_settings_table(summary: pd.DataFrame, task: str) -> Table:
    """The settings behind the task's rows: the chosen one, the runner-up, seeds and failures; the
    paper-protocol run's below."""
    rows, pinned = [], []
    for source, group in _shown_groups(summary, task):
        first = group.iloc[0]
        if source == "measured":
            setting, runner = _setting_cells(first)
            runs = int(first["runs"])
            rows.append(Row((_backend_cell(first), Cell(str(first["pos"])), setting, runner,
                             Cell(str(runs), float(runs)),
                             Cell(str(int(first["runs_failed"])), float(first["runs_failed"])))))
        elif source == "protocol" and not is_missing(first["factor"]):
            detail = first["setting_detail"] if isinstance(first["setting_detail"], str) else ""
            chosen = Cell(str(first["setting"]), None, f"{first['selection']}; {detail}")
            pinned.append(Row((_protocol_label(first), Cell(str(first["pos"])), chosen, Cell(NONE),
                               Cell(f"1 of {int(first['runs'])}", 1.0, "one run, chosen among this many"),
                               Cell(str(int(first["runs_failed"])))), kind="protocol"))
    return Table(SETTINGS_HEADERS, tuple(rows), tuple(pinned), label=f"{task}: the settings shown")


# -- effective length, task × backend -------------------------------------------------------------
def _task_header(shown: pd.DataFrame, task: str) -> Header:
    """A task column names the preset and the number of seeds behind its measured cells."""
    part = shown[(shown["task"] == task) & (shown["source"] == "measured")]
    presets = sorted({p for value in part["preset"].dropna() for p in str(value).split(", ")})
    seeds = sorted({int(r) for r in part["runs"].dropna()})
    count = (f"{seeds[0]}" if len(seeds) == 1 else f"{seeds[0]}–{seeds[-1]}") if seeds else "0"
    what = ", ".join(presets) or "?"
    return Header(f"{task} ({what}, {count} seed{'' if count == '1' else 's'})",
                  f"effective length on {task}: largest factor whose mean exact match over the seeds stays ≥ "
                  f"{EFFECTIVE_THRESHOLD * 100:.0f}% at every factor up to it; the preset and the number "
                  "of seeds behind each cell of ours", numeric=True)


def effective_table(summary: pd.DataFrame) -> Table:
    """Effective length of every backend (chosen setting) on every task; pinned: per backend, the
    paper-protocol run's, then the paper's. A task's column names its preset and seed count."""
    tasks = sorted(summary["task"].unique())
    shown = summary[summary["chosen"].astype(bool)]
    headers = (Header("backend", "attention backend"), Header("pos", "position scheme"),
               *[_task_header(shown, t) for t in tasks])

    def cells_for(part: pd.DataFrame) -> list[Cell]:
        out = []
        for task in tasks:
            lines = part[part["task"] == task].drop_duplicates(["recipe", "setting"])
            if lines.empty:
                out.append(Cell("", -1.0, "not run"))
                continue
            if lines["factor"].isna().all() and (lines["source"] == "protocol").all():
                out.append(Cell("n/a", -1.0, str(lines["selection"].iloc[0])))
                continue
            cells = [effective_cell(r) if r["source"] == "measured" else
                     Cell(effective_label(r["effective_length"], r["effective_length_capped"]),
                          effective_sort(r["effective_length"], r["effective_length_capped"]))
                     for _, r in lines.iterrows()]
            titles = [f"{c.title}; setting {r['setting']}" if r["setting"] else str(r["selection"])
                      for c, (_, r) in zip(cells, lines.iterrows(), strict=True)]
            details = [c.detail for c in cells if c.detail]
            out.append(Cell(" / ".join(c.text for c in cells), max(c.sort or -1.0 for c in cells),
                            "; ".join(titles), detail=" / ".join(details), wrap=True))
        return out

    rows = []
    measured = shown[shown["source"] == "measured"]
    for (method, pos), part in sorted(measured.groupby(["method", "pos"], sort=True), key=lambda kv: kv[0]):
        rows.append(Row((Cell(str(method)), Cell(str(pos)), *cells_for(part))))
    pinned = []
    methods = sorted(set(shown.loc[shown["source"] != "measured", "method"]), key=backend_rank)
    for method in methods:
        for source, label in (("protocol", PROTOCOL_LABEL), ("paper", PAPER_LABEL)):
            part = shown[(shown["source"] == source) & (shown["method"] == method)]
            if not part.empty:
                pinned.append(Row((Cell(f"{label}: {method}"), Cell(NONE), *cells_for(part)), kind=source))
    return Table(headers, tuple(rows), tuple(pinned), label="effective length per task and backend")


# -- the paper's protocol against ours ------------------------------------------------------------
def _joined(values: Iterable[Any]) -> str:
    items = sorted({str(v) for v in values if not is_missing(v)}, key=lambda s: (len(s), s))
    return ", ".join(items) if items else NONE


@reading_data()  # names from data: a plugin file they name is never imported
def _train_range(task: str, config: dict[str, Any]) -> str:
    """The training length range as the harness draws it (``Task.train_range``)."""
    from lengthgen.tasks import get_task

    top, low = config["train"]["train_length"], config["train"]["min_train_length"]
    try:
        low, top = get_task(task, **config.get("task_params", {})).train_range(top, low)
    except (UserError, ValueError):  # a task this installation does not know, or not with these parameters
        return f"{'L/2' if low is None else low}..{top}"
    return f"{low}..{top}"


def _samples(ok: pd.DataFrame) -> str:
    n = ok["n_samples"].dropna().astype(int)
    if n.empty:
        return NONE
    return f"{n.max()}" if n.min() == n.max() else f"{n.max()} (1×) .. {n.min()}"


def ours(rows: pd.DataFrame, task: str) -> dict[str, str]:
    """Our protocol for one task, in the fields of ``PAPER_PROTOCOL`` (every value seen, joined),
    from this board's own rows only (a submission's rows are never ours)."""
    own = rows["source"].fillna("").astype(str) == "" if "source" in rows else True
    part = rows[(rows["task"] == task) & own]
    configs = [config_dict(c) for c in sorted(set(part["config_json"].dropna()))]
    ok = part[part["status"] == "ok"].dropna(subset=["factor"])
    rules = _joined(c["train"]["selection"] for c in configs)
    return {
        "train lengths": _joined(_train_range(task, c) for c in configs),
        "steps": _joined(c["train"]["steps"] for c in configs),
        "batch": _joined(c["train"]["batch_size"] for c in configs),
        "width": _joined(f"d {c['arch']['d_model']}, {c['arch']['n_heads']} heads" for c in configs),
        "depth": _joined(f"{c['arch']['n_layers']} layers" for c in configs),
        "learning rate": _joined(json.dumps(c["train"]["lr"]) for c in configs),
        "warm-up": _joined(f"{c['train']['warmup_steps']} steps" for c in configs),
        "schedule": _joined(_schedule(c) for c in configs),
        "test samples per length": _samples(ok),
        "selection": f"checkpoint: best {rules} validation; a row: the setting with the best mean 1× "
                     "validation over the seeds every setting ran, mean over its seeds; paper-protocol row: "
                     "best single run by 8× validation, " + PROTOCOL_SELECTION_LEVEL.removeprefix("ours: "),
    }


def _schedule(config: dict[str, Any]) -> str:
    floor = config["train"].get("min_lr_ratio", 0.0)
    return f"linear warm-up, then cosine decay to {floor:g} × the learning rate"


def comparison_table(rows: pd.DataFrame, task: str) -> Table | None:
    """The paper's protocol and ours side by side, field by field (None without paper numbers)."""
    paper = PAPER_PROTOCOL.get(task)
    if paper is None:
        return None
    mine = ours(rows, task)
    body = tuple(Row((Cell(field), Cell(value), Cell(mine[field]))) for field, value in paper.items())
    headers = (Header("field", "what is compared"), Header("paper", "the paper's protocol for this task"),
               Header("ours", "the protocol of the runs in this table"))
    return Table(headers, body, label=f"{task}: the paper's protocol and ours")


# -- how the runs were made -----------------------------------------------------------------------
def protocol_table(rows: pd.DataFrame) -> Table:
    """Per task: preset, training lengths, steps, batch, checkpoint rule, factors, samples, runs, time."""
    headers = (Header("task"), Header("preset"), Header("train lengths", "uniform in this range"),
               Header("steps", numeric=True), Header("batch", numeric=True),
               Header("learning rate", "peak learning rates of the runs (per backend where a grid ran)"),
               Header("warm-up", "linear warm-up steps of the runs"), Header("schedule"),
               Header("selection", "checkpoint selection: id = in-distribution validation, 8x = at 8×"),
               Header("eval factors"), Header("samples per length", "test samples (fewer at long lengths)"),
               Header("runs", numeric=True), Header("train + eval time", "summed over runs", numeric=True))
    body = []
    for task, group in sorted(rows.groupby("task"), key=lambda kv: kv[0]):
        configs = [config_dict(c) for c in sorted(set(group["config_json"].dropna()))]
        ok = group[group["status"] == "ok"].dropna(subset=["factor"])
        factors = sorted(set(ok["factor"].astype(int)))
        per_run = group.drop_duplicates("run_id")
        seconds = math.fsum(float(v) for v in per_run["train_seconds"].dropna())
        seconds += math.fsum(float(v) for v in ok["eval_seconds"].dropna())
        body.append(Row((
            Cell(str(task)), Cell(_joined(group["preset"])),
            Cell(_joined(_train_range(str(task), c) for c in configs)),
            Cell(_joined(group["steps"].dropna().astype(int)), _first_number(group["steps"])),
            Cell(_joined(c["train"]["batch_size"] for c in configs), _first_number(
                pd.Series([c["train"]["batch_size"] for c in configs]))),
            Cell(_joined(json.dumps(c["train"]["lr"]) for c in configs)),
            Cell(_joined(c["train"]["warmup_steps"] for c in configs)),
            Cell(_joined(_schedule(c) for c in configs)),
            Cell(_joined(group["selection"])),
            Cell(f"1×..{factors[-1]}×" if factors else NONE, float(factors[-1]) if factors else -1.0),
            Cell(_samples(ok)), Cell(str(per_run["run_id"].nunique()), float(per_run["run_id"].nunique())),
            Cell(f"{seconds / 60:.1f} min", seconds),
        )))
    return Table(headers, tuple(body), label="how the runs were made")


def _first_number(series: pd.Series) -> float:
    values = sorted(float(v) for v in series.dropna())
    return values[0] if values else -1.0
