"""Which runs a table row shows, chosen by a stated rule on validation scores, never on test data.

Two rules, both computed from the validation exact match every run records for its selected
checkpoint (``val_exact_id`` at the training length, ``val_exact_8x`` at 8×):

- **Setting per row.** Per (task, backend, position scheme), the setting (recipe without seed)
  with the best mean in-distribution validation score over the seeds that every setting of the
  row ran (all its seeds when the settings share none); the runner-up is shown too. A grid
  screened on seed 0, whose winner then ran seeds 1 and 2, is so ranked on seed 0 alone: the
  extra seeds of the winner cannot change the choice they were run for.
- **Paper protocol.** Per (task, backend), the single best run over every seed, setting and
  position scheme, by 8× validation (ties: 1× validation, then the lower seed): how the paper
  picked the numbers it reports.

A row whose plan grid is screened in part (``screening``: recorded and planned screening runs, from
the plan) shows the best point so far, marked provisional: a point still to run may win.

A run that failed before evaluating anything (training diverged or crashed) scores 0: it learned
nothing. A run that was evaluated but has no validation score predates those columns; a rule
that needs its score is then not applied (``n/a``) rather than falling back to test data.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import pandas as pd

from lengthgen.leaderboard import settings
from lengthgen.leaderboard.rows import config_dict
from lengthgen.leaderboard.stats import is_missing

PREDATES = "n/a: runs predate validation columns"
#: How exact ties of the selection score are broken: the gentler optimizer, which is the less likely to
#: owe its score to a lucky escape from the instabilities that sink runs on these tasks; the
#: setting's id only when even those are equal.
TIE_BREAK = "the smaller learning rate, then the longer warm-up"
ONLY = "only setting"
PROVISIONAL = "provisional"
# (recorded, planned) screening runs per (task, backend, scheme) whose plan grid is screened in part
ScreeningProgress = Mapping[tuple[str, str, str], tuple[int, int]]


def run_score(run: Any, column: str) -> float | None:
    """A run's validation score (``val_id`` or ``val_8x``): 0 when training died, None when absent."""
    value = run[column]
    if not is_missing(value):
        return float(value)
    return None if run["evaluated"] else 0.0


@dataclass(frozen=True)
class SettingScore:
    setting: str
    label: str  # the fields that set it apart within its row
    description: str  # its difference from the preset
    score: float | None  # mean 1× validation exact match over the compared seeds; None when one lacks it
    runs: int
    tie_key: tuple[float, float] = (0.0, 0.0)  # (learning rate, −warm-up): ``TIE_BREAK``


def tie_key(config: Mapping[str, Any]) -> tuple[float, float]:
    """``TIE_BREAK`` as a sort key: (learning rate, −warm-up steps); missing fields sort first."""
    train = config.get("train", {}) if isinstance(config, Mapping) else {}
    return float(train.get("lr", 0.0) or 0.0), -float(train.get("warmup_steps", 0) or 0)


@dataclass(frozen=True)
class Selection:
    """The settings of one (task, backend, scheme): ranked best first when the rule applies."""

    ranked: tuple[SettingScore, ...]
    status: Literal["only", "selected", "n/a"]
    seeds: tuple[int, ...] = ()  # the seeds the settings were compared on
    screening: tuple[int, int] | None = None  # (recorded, planned) runs of a grid screened in part

    @property
    def shown(self) -> tuple[SettingScore, ...]:
        """The settings the table shows: the winner, or every setting when none can be chosen."""
        return self.ranked if self.status == "n/a" else self.ranked[:1]

    @property
    def runner_up(self) -> SettingScore | None:
        return self.ranked[1] if self.status == "selected" and len(self.ranked) > 1 else None

    @property
    def note(self) -> str:
        if self.screening is not None and self.status != "n/a":
            recorded, planned = self.screening
            return (f"{PROVISIONAL}: {recorded} of {planned} screening runs of the plan's grid recorded; "
                    "the rule chooses once every one is")
        if self.status == "only":
            return ONLY
        if self.status == "n/a":
            return f"{PREDATES}: {len(self.ranked)} settings shown separately"
        plural = "s" if len(self.seeds) > 1 else ""
        on = f" on seed{plural} {', '.join(map(str, self.seeds))}" if self.seeds else ""
        note = f"best mean 1× validation of {len(self.ranked)} settings{on}"
        if self.tied:
            note += f"; tied with the runner-up, broken by {TIE_BREAK}"
        return note

    @property
    def tied(self) -> bool:
        """Whether the winner's score equals the runner-up's (the tie-break chose)."""
        runner = self.runner_up
        return runner is not None and runner.score == self.ranked[0].score


def _configs(runs: pd.DataFrame) -> dict[str, dict[str, Any]]:
    return {s: config_dict(group["config_json"].iloc[0]) for s, group in runs.groupby("setting", sort=True)}


def compared_seeds(group: pd.DataFrame) -> set[Any]:
    """The seeds every setting of a row ran (all seeds when they share none)."""
    per_setting = [set(part["seed"]) for _, part in group.groupby("setting", sort=True)]
    common = set.intersection(*per_setting) if per_setting else set()
    return common or set(group["seed"])


def select_settings(runs: pd.DataFrame,
                    screening: ScreeningProgress | None = None) -> dict[tuple[str, str, str], Selection]:
    """The rule per (task, backend, scheme) over the per-run table of ``rows.runs``; ``screening``
    names the rows whose plan grid is screened in part."""
    out = {}
    for key, group in runs.groupby(["task", "attn", "pos"], sort=True):
        configs = _configs(group)
        labels = settings.labels(configs)
        seeds = compared_seeds(group)
        scored = []
        for setting, part in group.groupby("setting", sort=True):
            values = [run_score(run, "val_id") for _, run in part.iterrows() if run["seed"] in seeds]
            score = None if any(v is None for v in values) else math.fsum(sorted(values)) / len(values)
            scored.append(SettingScore(setting, labels[setting], settings.describe(configs[setting], setting),
                                       score, len(part), tie_key(configs[setting])))
        if len(scored) == 1:
            status: Literal["only", "selected", "n/a"] = "only"
        elif any(s.score is None for s in scored):
            status = "n/a"
        else:
            status = "selected"
            scored.sort(key=lambda s: (-(s.score or 0.0), s.tie_key, s.setting))
        compared = tuple(sorted(int(s) for s in seeds if not is_missing(s)))
        row = (str(key[0]), str(key[1]), str(key[2]))
        out[row] = Selection(tuple(scored), status, compared, (screening or {}).get(row))
    return out


@dataclass(frozen=True)
class ProtocolPick:
    """The paper-protocol run of one (task, backend), or why there is none."""

    run_id: str | None
    candidates: int
    val_8x: float | None = None
    val_id: float | None = None
    label: str = ""
    description: str = ""

    @property
    def tie_break(self) -> bool:
        """Every candidate scored 0 at 8× validation: the pick is the 1× tie-break's, not an 8× one."""
        return self.run_id is not None and not self.val_8x

    @property
    def note(self) -> str:
        if self.run_id is None:
            return PREDATES
        if self.tie_break:
            return (f"tie-break pick: 8× validation is 0 for all {self.candidates} runs, so the best 1× "
                    f"validation ({100 * (self.val_id or 0.0):.1f}%), then the lower seed, chose")
        return f"best of {self.candidates} runs by 8× validation ({100 * (self.val_8x or 0.0):.1f}%)"


def paper_protocol(runs: pd.DataFrame) -> dict[tuple[str, str], ProtocolPick]:
    """The best single run per (task, backend) by 8× validation, over seeds × settings × schemes."""
    out = {}
    for (task, attn), group in runs.groupby(["task", "attn"], sort=True):
        scored = [(run_score(run, "val_8x"), run_score(run, "val_id"), run) for _, run in group.iterrows()]
        if any(v8 is None for v8, _, _ in scored):
            out[(str(task), str(attn))] = ProtocolPick(None, len(scored))
            continue
        v8, vid, best = min(scored, key=lambda t: (-(t[0] or 0.0), -(t[1] or 0.0), t[2]["seed"],
                                                   t[2]["run_id"]))
        configs = _configs(group)
        setting = best["setting"]
        others = [c for s, c in configs.items() if s != setting]
        label = settings.short_label(settings.differences(configs[setting], others), "") if others else ""
        label = f"seed {best['seed']}" + (f", {label}" if label else "")
        out[(str(task), str(attn))] = ProtocolPick(
            str(best["run_id"]), len(scored), v8, vid, label, settings.describe(configs[setting], setting))
    return out
