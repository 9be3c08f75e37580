"""Naming settings for readers: the fields that set a setting apart, and its difference from the preset.

A setting is identified by a hash (see ``rows.setting_of``); people need the fields instead, e.g.
``train.lr=0.0005`` for one point of a learning-rate grid.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from lengthgen.errors import UserError
from lengthgen.registry import reading_data

#: Fields that never distinguish settings on a table row: the row itself shows them.
ROW_FIELDS = ("task", "attn", "pos", "seed")

#: How many differences a label spells out before it says "+N more" (the hover text has them all).
LABEL_FIELDS = 3

#: The order differences are named in: what makes a different model first, how it was tested last,
#: so a label cut at LABEL_FIELDS keeps e.g. ``train.steps`` ahead of ``eval.max_factor``.
FIELD_ORDER = ("preset", "train.", "arch.", "task_params.", "attn_options.")


def flatten(config: dict[str, Any]) -> dict[str, Any]:
    """``{"train": {"lr": 1e-3}}`` → ``{"train.lr": 1e-3}``; the fields of a table row left out. A
    config without a task stream names stream 1, the one it was made with (``tasks.base``), so a
    run recorded before stream versions reads ``task_params.stream=1`` beside a preset's newer one."""
    out: dict[str, Any] = {"task_params.stream": 1} if "task_params" in config else {}
    for key, value in config.items():
        if key in ROW_FIELDS:
            continue
        if isinstance(value, dict):
            for inner, item in value.items():
                out[f"{key}.{inner}"] = item
        else:
            out[key] = value
    return out


def format_value(value: Any) -> str:
    """As ``--set`` takes it: JSON for numbers, lists and booleans, strings bare."""
    return value if isinstance(value, str) else json.dumps(value)


def differences(config: dict[str, Any], others: Sequence[dict[str, Any]]) -> list[str]:
    """``field=value`` of ``config`` for every field whose value is not the same in all ``others``."""
    mine = flatten(config)
    theirs = [flatten(o) for o in others]
    keys = sorted(set(mine).union(*theirs), key=_field_rank)
    missing = object()
    return [f"{key}={format_value(mine.get(key, '(unset)'))}" for key in keys
            if any(o.get(key, missing) != mine.get(key, missing) for o in theirs)]


def _field_rank(key: str) -> tuple[int, str]:
    """FIELD_ORDER's groups first, in that order, then other fields, then ``eval.``; by name within."""
    if key.startswith("eval."):
        return len(FIELD_ORDER) + 1, key
    ranks = [i for i, prefix in enumerate(FIELD_ORDER) if key.startswith(prefix)]
    return (ranks[0] if ranks else len(FIELD_ORDER)), key


def short_label(items: Sequence[str], empty: str) -> str:
    if not items:
        return empty
    shown = ", ".join(items[:LABEL_FIELDS])
    return shown if len(items) <= LABEL_FIELDS else f"{shown}, +{len(items) - LABEL_FIELDS} more"


@reading_data()  # names from data: a plugin file they name is never imported
def preset_config(config: dict[str, Any]) -> dict[str, Any] | None:
    """The config ``lengthgen run`` builds for this run's task, backend, scheme and preset with no
    other flag (backend options at their defaults); None when this installation cannot build it."""
    from lengthgen.config import build_run_config

    try:
        built = build_run_config(config["task"], config["attn"], pos=config["pos"], preset=config["preset"],
                                 seed=config.get("seed", 0))
    except (UserError, KeyError):  # a plugin or preset this installation lacks, or no recorded config
        return None
    return built.model_dump(mode="json")


def describe(config: dict[str, Any], setting: str) -> str:
    """The setting against its preset, for hover text and the CSV: 'quick preset with train.lr=…'."""
    preset = preset_config(config)
    if preset is None:
        return f"recipe {setting} (its preset cannot be rebuilt here)"
    changes = differences(config, [preset])
    name = config.get("preset", "?")
    return f"{name} preset with " + ", ".join(changes) if changes else f"{name} preset as is"


def labels(configs: dict[str, dict[str, Any]]) -> dict[str, str]:
    """A short label per setting (id → config): the fields in which the settings differ; with a
    single setting, its difference from the preset ('quick preset' when there is none)."""
    if len(configs) == 1:
        (setting, config), = configs.items()
        preset = preset_config(config)
        if preset is None:
            return {setting: f"recipe {setting}"}
        return {setting: short_label(differences(config, [preset]), f"{config.get('preset', '?')} preset")}
    out = {}
    for setting, config in configs.items():
        others = [c for s, c in configs.items() if s != setting]
        out[setting] = short_label(differences(config, others), f"recipe {setting}")
    return out
