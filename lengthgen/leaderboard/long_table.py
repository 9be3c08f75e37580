"""The leaderboard's numbers as one long table: a line per (task, row, length factor).

Three kinds of row (``source``):

- ``measured``: a (backend, scheme) and one of its settings; mean over seeds with a 95% interval,
  per-seed values, learned seeds. ``chosen`` marks the setting the selection rule picked (every
  setting is listed, so the losing ones stay in the CSV).
- ``protocol``: the paper-protocol run of a backend (single best run on 8× validation).
- ``paper``: the paper's reported numbers.

Tables, CSV and plots are all drawn from this table.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from lengthgen.leaderboard.paper import PAPER_CAVEATS, PAPER_REPORTED, PAPER_TRAIN_LENGTHS, backend_rank
from lengthgen.leaderboard.rows import config_dict, ok_rows, prepared, runs
from lengthgen.leaderboard.selection import (
    ProtocolPick,
    ScreeningProgress,
    Selection,
    paper_protocol,
    run_score,
    select_settings,
)
from lengthgen.leaderboard.stats import effective_length, learned, seed_interval, stable_mean

CSV_COLUMNS: tuple[str, ...] = (
    "task", "source", "method", "pos", "setting", "setting_detail", "recipe", "chosen", "selection",
    "val_exact_id", "val_exact_8x", "runner_up", "runner_up_val_exact_id", "factor", "eval_length",
    "n_seeds", "exact_match", "ci_lo", "ci_hi", "ci_method", "per_seed", "learned_seeds", "runs",
    "runs_failed", "attn_entropy", "attn_support", "n_samples", "effective_length",
    "effective_length_capped", "effective_length_learned", "effective_length_learned_capped",
    "effective_length_seeds", "effective_length_worst", "effective_length_worst_capped", "preset",
    "attn_package",
)


def per_seed_text(cell: pd.DataFrame) -> str:
    """``s0=0.000000;s1=0.996094``: each seed's exact match (the CSV and the hover text)."""
    return ";".join(f"s{int(seed)}={float(value):.6f}"
                    for seed, value in zip(cell["seed"], cell["exact_match"], strict=True))


def _effective(means: dict[int, float]) -> tuple[int | None, bool | None]:
    """Effective length and whether it is capped; both empty when even 1x fails (never 0)."""
    factor, capped = effective_length(means)
    return (factor, capped) if factor else (None, None)


def seed_effective_lengths(group: pd.DataFrame) -> list[tuple[int, int, bool]]:
    """(seed, effective length, capped) of every run of a cell, by seed: each run's own effective
    length over the factors it was evaluated at (0 when even 1× fails or the run failed)."""
    out = []
    ok = ok_rows(group)
    runs_by_seed = group[["seed", "run_id"]].drop_duplicates().sort_values(["seed", "run_id"])
    for seed, run_id in runs_by_seed.itertuples(index=False):
        mine = ok[ok["run_id"] == run_id]
        means = {int(f): float(v) for f, v in zip(mine["factor"], mine["exact_match"], strict=True)}
        factor, capped = effective_length(means)
        out.append((int(seed), int(factor), bool(capped and factor)))
    return out


def seed_lengths_text(per_seed: list[tuple[int, int, bool]]) -> str:
    """``s0=>=1024;s1=32;s2=0`` (the CSV): each seed's effective length, ``>=`` when capped."""
    return ";".join(f"s{seed}={'>=' if capped else ''}{factor}" for seed, factor, capped in per_seed)


def _common_means(ok: pd.DataFrame) -> dict[int, float]:
    """Mean exact match per factor, up to the first factor that not every run reached: an
    effective length stands on all of its runs, so where some seeds were not (yet) evaluated
    further it stops there, marked capped, rather than reading one seed's score as the mean."""
    runs = ok["run_id"].nunique()
    means: dict[int, float] = {}
    for factor, cell in ok.groupby("factor", sort=True):
        if cell["run_id"].nunique() < runs:
            break
        means[int(factor)] = stable_mean(cell["exact_match"])
    return means


def _learned_means(group: pd.DataFrame, learned_runs: set[str]) -> dict[int, float]:
    """Mean exact match per factor over the runs that learned the task (every one of them)."""
    ok = ok_rows(group)
    return _common_means(ok[ok["run_id"].isin(learned_runs)])


def _cells(group: pd.DataFrame, base: dict[str, Any], learned_runs: set[str]) -> list[dict[str, Any]]:
    """One line per evaluated factor of a set of runs (several seeds, or one run), with the
    effective length over all of them and over those that learned (``learned_runs``)."""
    cells = []
    for factor, cell in ok_rows(group).groupby("factor", sort=True):
        cell = cell.sort_values(["seed", "run_id"], kind="mergesort")
        wilson = None
        if len(cell) == 1:
            wilson = (cell["exact_match_lo"].iloc[0], cell["exact_match_hi"].iloc[0])
        ci = seed_interval(cell["exact_match"].tolist(), wilson)
        cells.append({
            **base, "factor": int(factor), "eval_length": int(cell["eval_length"].iloc[0]), "n_seeds": ci.n,
            "exact_match": ci.mean, "ci_lo": ci.lo, "ci_hi": ci.hi, "ci_method": ci.method,
            "per_seed": per_seed_text(cell), "attn_entropy": stable_mean(cell["attn_entropy"]),
            "attn_support": stable_mean(cell["attn_support"]), "n_samples": int(cell["n_samples"].sum()),
        })
    eff, capped = _effective(_common_means(ok_rows(group)))
    eff_learned, capped_learned = _effective(_learned_means(group, learned_runs))
    per_seed = seed_effective_lengths(group)
    worst = min(per_seed, key=lambda s: (s[1], s[2])) if per_seed else None
    if not cells:  # every run failed before any evaluation: keep a line so its failures show
        cells.append({**base, "factor": None, "n_seeds": 0})
    for c in cells:
        c.update(effective_length=eff, effective_length_capped=capped, effective_length_learned=eff_learned,
                 effective_length_learned_capped=capped_learned,
                 effective_length_seeds=seed_lengths_text(per_seed) if per_seed else None,
                 effective_length_worst=worst[1] if worst else None,
                 effective_length_worst_capped=worst[2] if worst else None)
    return cells


def _learned_runs(run_table: pd.DataFrame) -> set[str]:
    return {str(r) for r, v in zip(run_table["run_id"], run_table["exact_1x"], strict=True) if learned(v)}


def _package(group: pd.DataFrame) -> str | None:
    """Which distribution (and version) provided the backend: as the rows recorded it, else as
    installed now (built-ins and entry points only: a name from data never imports a file)."""
    recorded = sorted({str(p) for p in group["attn_package"].dropna()}) if "attn_package" in group else []
    if recorded:
        return ", ".join(recorded)
    name = config_dict(group["config_json"].iloc[0]).get("attn", "") if len(group) else ""
    if not name or ":" in name:
        return None
    from lengthgen import provenance
    from lengthgen.attention import ATTENTION
    from lengthgen.registry import RegistryError

    try:
        return provenance.package_of(ATTENTION.get(name))
    except RegistryError:  # not installed here
        return None


def _presets(run_table: pd.DataFrame) -> str:
    return ", ".join(sorted({str(p) for p in run_table["preset"].dropna()}))


def _score(value: float | None) -> float:
    return math.nan if value is None else value


def _measured(frame: pd.DataFrame, run_table: pd.DataFrame, key: tuple[str, str, str],
              selection: Selection) -> list[dict[str, Any]]:
    task, attn, pos = key
    shown = {s.setting for s in selection.shown}
    runner = selection.runner_up
    out = []
    for setting in selection.ranked:
        group = frame[(frame["task"] == task) & (frame["attn"] == attn) & (frame["pos"] == pos)
                      & (frame["setting"] == setting.setting)]
        setting_runs = run_table[(run_table["task"] == task) & (run_table["attn"] == attn)
                                 & (run_table["pos"] == pos) & (run_table["setting"] == setting.setting)]
        chosen = setting.setting in shown
        scores_8x = [run_score(run, "val_8x") for _, run in setting_runs.iterrows()]
        val_8x = math.nan if any(v is None for v in scores_8x) else stable_mean(scores_8x)
        base = {
            "task": task, "source": "measured", "method": attn, "pos": pos, "setting": setting.label,
            "setting_detail": setting.description, "recipe": setting.setting, "chosen": chosen,
            "selection": selection.note if chosen else "not chosen", "val_exact_id": _score(setting.score),
            "val_exact_8x": val_8x,
            "runner_up": runner.label if chosen and runner else None,
            "runner_up_val_exact_id": _score(runner.score) if chosen and runner else math.nan,
            "learned_seeds": int(sum(learned(v) for v in setting_runs["exact_1x"])),
            "runs": len(setting_runs), "runs_failed": int(setting_runs["failed"].sum()),
            "preset": _presets(setting_runs), "attn_package": _package(group),
        }
        out.extend(_cells(group, base, _learned_runs(setting_runs)))
    return out


def _protocol(frame: pd.DataFrame, run_table: pd.DataFrame, task: str, attn: str,
              pick: ProtocolPick) -> list[dict[str, Any]]:
    base = {"task": task, "source": "protocol", "method": attn, "selection": pick.note, "chosen": True,
            "runs": pick.candidates, "runner_up_val_exact_id": math.nan}
    if pick.run_id is None:
        return [{**base, "pos": "", "setting": "", "recipe": "", "factor": None, "n_seeds": 0,
                 "val_exact_id": math.nan, "val_exact_8x": math.nan}]
    chosen = run_table[run_table["run_id"] == pick.run_id]
    run = chosen.iloc[0]
    base.update(pos=run["pos"], setting=pick.label, setting_detail=pick.description, recipe=run["setting"],
                val_exact_id=_score(pick.val_id), val_exact_8x=_score(pick.val_8x),
                learned_seeds=int(learned(run["exact_1x"])), runs_failed=int(run["failed"]),
                preset=_presets(chosen))
    return _cells(frame[frame["run_id"] == pick.run_id], base, _learned_runs(chosen))


def _paper(task: str) -> list[dict[str, Any]]:
    out = []
    for method, by_factor in PAPER_REPORTED.get(task, {}).items():
        eff, capped = _effective({f: v / 100 for f, v in by_factor.items()})
        for factor, value in sorted(by_factor.items()):
            out.append({
                "task": task, "source": "paper", "method": method, "pos": "",
                "setting": f"reported (trained at {PAPER_TRAIN_LENGTHS})", "recipe": "", "chosen": True,
                "selection": "; ".join(["the paper's own (see the protocol table)",
                                        *([PAPER_CAVEATS[(task, method)]] if (task, method) in PAPER_CAVEATS
                                          else [])]),
                "factor": factor,
                "exact_match": value / 100, "ci_method": "reported", "effective_length": eff,
                "effective_length_capped": capped,
            })
    return out


def _sort_key(source: str, method: str) -> tuple[int, int, str, int]:
    """Measured rows first, then the pinned rows: per backend, our paper-protocol row right above
    the paper's own."""
    if source == "measured":
        return (0, 0, "", 0)
    rank, name = backend_rank(method)
    return (1, rank, name, 0 if source == "protocol" else 1)


def summarize(rows: pd.DataFrame, screening: ScreeningProgress | None = None) -> pd.DataFrame:
    """The long table (``CSV_COLUMNS``) of the rows plus the paper's numbers for their tasks;
    ``screening`` as in ``selection.select_settings``."""
    out: list[dict[str, Any]] = []
    if not rows.empty:
        frame = prepared(rows)
        run_table = runs(frame)
        for key, selection in sorted(select_settings(run_table, screening).items()):
            out.extend(_measured(frame, run_table, key, selection))
        own = run_table[run_table["source"] == ""]  # the paper-protocol rows are ours: never a submission's
        for (task, attn), pick in sorted(paper_protocol(own).items()):
            out.extend(_protocol(frame, run_table, task, attn, pick))
    for task in sorted({r["task"] for r in out}):
        out.extend(_paper(task))
    table = pd.DataFrame(out, columns=list(CSV_COLUMNS))
    keys = [_sort_key(s, m) for s, m in zip(table["source"], table["method"], strict=True)]
    table["_block"], table["_rank"], table["_name"], table["_kind"] = (
        [k[i] for k in keys] for i in range(4))
    table["_chosen"] = ~table["chosen"].astype(bool)
    table = table.sort_values(["task", "_block", "_rank", "_name", "_kind", "method", "pos", "_chosen",
                               "setting", "factor"], kind="mergesort", na_position="last")
    return table.drop(columns=["_block", "_rank", "_name", "_kind", "_chosen"]).reset_index(drop=True)

