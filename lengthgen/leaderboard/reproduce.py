"""The commands that rebuild a leaderboard's runs and the leaderboard itself."""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Mapping
from typing import Any

import pandas as pd

from lengthgen.errors import UserError
from lengthgen.leaderboard.rows import config_dict, recipe_hash
from lengthgen.registry import reading_data

#: What varies inside one ``lengthgen sweep`` command (so it does not split commands).
GRID_FIELDS = ("seed", "attn", "attn_options", "pos")


def _values(series: pd.Series) -> str:
    items = sorted({str(v) for v in series.dropna()})
    return ", ".join(items) if items else "—"


@reading_data()  # names from data: a plugin file they name is never imported
def sweep_flags(task: str, config: dict[str, Any],
                grid: dict[str, tuple[Any, ...]] | None = None) -> tuple[str, ...] | None:
    """The flags that make ``lengthgen sweep`` build ``config`` (bar backend, position, seed):
    dedicated flags where they exist, ``--set`` for any other field that differs from the preset,
    and ``--set FIELD=a,b`` for each field of ``grid`` (dotted name → its values). None when this
    installation cannot rebuild it (unknown task or preset)."""
    from lengthgen.config import SECTIONS, build_run_config
    from lengthgen.sweeps import SweepSpec
    from lengthgen.tasks.base import STREAM

    grid = grid or {}
    try:
        preset = config["preset"]
        default = build_run_config(task, "softmax", preset=preset).model_dump(mode="json")
        dedicated = {"steps": ("train", "steps"), "train_length": ("train", "train_length"),
                     "max_factor": ("eval", "max_factor"), "eval_samples": ("eval", "samples")}
        chosen = {name: config[s][k] for name, (s, k) in dedicated.items()
                  if config[s][k] != default[s][k] and f"{s}.{k}" not in grid}
        params = {k: v for k, v in sorted(config["task_params"].items())
                  if default["task_params"].get(k) != v}
        if STREAM in default["task_params"] and STREAM not in config["task_params"]:
            params[STREAM] = 1  # recorded without a stream: the first, which new runs do not get
        spec = SweepSpec(tasks=(task,), attns=("softmax",), preset=preset, task_params=params, **chosen)
        built = spec.configs()[0].model_dump(mode="json")
    except (UserError, KeyError):  # a task or preset this installation cannot build, a field it lacks
        return None
    flags = [f"--{name.replace('_', '-')} {value}" for name, value in chosen.items()]
    flags += [f"--param {shlex.quote(f'{k}={json.dumps(v)}')}" for k, v in params.items()]
    flags += [f"--attn-option {shlex.quote(f'{k}={json.dumps(v)}')}"
              for k, v in sorted(_changed_options(config).items())]
    for section in SECTIONS:
        for key, value in sorted(config[section].items()):
            if f"{section}.{key}" not in grid and built[section].get(key) != value:
                flags.append(f"--set {shlex.quote(f'{section}.{key}={json.dumps(value)}')}")
    for key, values in grid.items():
        flags.append(f"--set {shlex.quote(key + '=' + ','.join(json.dumps(v) for v in values))}")
    return (f"--preset {shlex.quote(preset)}", *flags)


@reading_data()
def _changed_options(config: dict[str, Any]) -> dict[str, Any]:
    """The run's backend options that differ from its backend's defaults (``--attn-option``)."""
    from lengthgen.attention import ATTENTION
    from lengthgen.registry import RegistryError

    try:
        defaults = ATTENTION.get(config["attn"]).Options().model_dump(mode="json")
    except RegistryError:  # a backend this installation does not know
        return {}
    return {k: v for k, v in config.get("attn_options", {}).items() if defaults.get(k) != v}


def _dotted(config: dict[str, Any]) -> dict[str, str]:
    """The config minus the fields a sweep command varies itself, as dotted name → JSON text."""
    from lengthgen.config import SECTIONS

    out = {k: json.dumps(v, sort_keys=True) for k, v in config.items() if k not in SECTIONS}
    for section in SECTIONS:
        fields = config.get(section, {})
        out.update({f"{section}.{k}": json.dumps(v, sort_keys=True) for k, v in fields.items()})
    for key in GRID_FIELDS:
        out.pop(key, None)
    return out


def _value_order(text: str) -> tuple[int, float, str]:
    value = json.loads(text)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return (0, float(value), "") if number else (1, 0.0, text)


def grid_blocks(configs: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, tuple[Any, ...]]]]:
    """Configs that form a full grid over some ``train``/``eval``/``arch`` fields → one (config,
    grid) block, so one ``--set FIELD=a,b`` command rebuilds them all; otherwise one block each."""
    if len(configs) < 2:
        return [(c, {}) for c in configs]
    flat = [_dotted(c) for c in configs]
    keys = sorted(set().union(*flat))
    varying = [k for k in keys if len({f.get(k) for f in flat}) > 1]
    values = {k: sorted({f[k] for f in flat if k in f}, key=_value_order) for k in varying}
    points = {tuple(f.get(k) for k in varying) for f in flat}
    full = len(points) == len(flat) == math.prod(len(v) for v in values.values())
    if not full or any(k.split(".")[0] not in ("train", "eval", "arch") or any(k not in f for f in flat)
                       for k in varying):
        return [(c, {}) for c in configs]
    return [(configs[0], {k: tuple(json.loads(v) for v in values[k]) for k in varying})]


def sweep_commands(rows: pd.DataFrame, sweep_dir: str) -> list[str]:
    """`lengthgen sweep` commands that rebuild the runs in the rows: one per set of tasks sharing
    backends, position scheme, seeds and recipe (flags only where they differ from the preset),
    with a grid (``--set train.lr=a,b``) where runs form one. Position schemes get separate
    commands so that a scheme run with only some backends is not crossed with all of them."""
    units: dict[tuple[str, str, str, str], list[tuple[dict[str, Any], str]]] = {}
    options = [json.dumps(_changed_options(config_dict(c)), sort_keys=True) for c in rows["config_json"]]
    frame = rows.assign(recipe=[recipe_hash(c, GRID_FIELDS) + o
                                for c, o in zip(rows["config_json"], options, strict=True)])
    for (task, _, _), whole in frame.groupby(["task", "recipe", "pos"], sort=True, dropna=False):
        for group in _seed_grids(whole):
            _add_unit(units, str(task), group)
    groups: dict[tuple[str, ...], list[str]] = {}
    for (task, attns, positions, seeds), entries in sorted(units.items()):
        known = [config for config, _ in entries if config]
        blocks: list[tuple[tuple[str, ...] | None, str]] = [
            (sweep_flags(task, config, grid), config["preset"]) for config, grid in grid_blocks(known)]
        blocks += [(None, preset) for config, preset in entries if not config]
        for flags, preset in blocks:
            if flags is None:
                flags = (f"--preset {shlex.quote(preset)}", "# (recipe not rebuildable here)")
            groups.setdefault((attns, positions, seeds, *flags), []).append(task)
    commands = []
    for key, tasks in sorted(groups.items(), key=lambda kv: (kv[1], kv[0])):
        attns, pos, seeds, *flags = key
        tail = [f for f in flags if f.startswith("#")]
        flags = [f for f in flags if not f.startswith("#")]
        parts = ["lengthgen sweep", f"--task {shlex.quote(','.join(tasks))}", f"--attn {attns}",
                 f"--pos {shlex.quote(pos)}",
                 f"--seeds {seeds}", *flags, f"--out {shlex.quote(sweep_dir)}", *tail]
        commands.append(" ".join(parts))
    return commands


def _seed_grids(group: pd.DataFrame) -> list[pd.DataFrame]:
    """``group`` as one block when its backends all ran the same seeds (``--attn a,b --seeds ..``
    then builds exactly its runs), else one block per backend, so no command adds runs."""
    parts = [part for _, part in group.groupby("attn", sort=True)]
    if len({frozenset(part["seed"].dropna().astype(int)) for part in parts}) <= 1:
        return [group]
    return parts


def _add_unit(units: dict[tuple[str, str, str, str], list[tuple[dict[str, Any], str]]], task: str,
              group: pd.DataFrame) -> None:
    """Adds the runs of ``group`` (one task, recipe and position scheme) under its backends and seeds."""
    known = sorted(group["config_json"].dropna())
    seeds = ",".join(str(s) for s in sorted(set(group["seed"].dropna().astype(int))))
    attns = shlex.quote(",".join(sorted(set(group["attn"]))))
    positions = ",".join(sorted(set(group["pos"].dropna())))
    units.setdefault((task, attns, positions, seeds), []).append(
        (json.loads(known[0]) if known else {}, _values(group["preset"])))


def leaderboard_command(source: str, out_name: str, hardware: str | None, title: str,
                        default_title: str, ablations: str | None = None) -> str:
    return (f"lengthgen leaderboard {shlex.quote(source)} --out {shlex.quote(out_name)}"
            + (f" --hardware {shlex.quote(hardware)}" if hardware else "")
            + (f" --title {shlex.quote(title)}" if title != default_title else "")
            + (f" --ablations {shlex.quote(ablations)}" if ablations else ""))


def plan_sweep_command(plan: str, sweep_dir: str) -> str:
    return f"lengthgen sweep --plan {shlex.quote(plan)} --out {shlex.quote(sweep_dir)}"


def pin_text(numerics: Mapping[str, str]) -> str:
    """A plan's numerics pin as shell assignments (``ATEN_CPU_CAPABILITY=avx2 …``)."""
    return " ".join(f"{name}={shlex.quote(value)}" for name, value in numerics.items())


def export_line(numerics: Mapping[str, str]) -> str:
    """The shell line that sets a plan's numerics pin for commands run one by one (``sweep --plan``
    sets it itself)."""
    return "export " + pin_text(numerics)


def plan_leaderboard_command(source: str, out_name: str, plan: str) -> str:
    return (f"lengthgen leaderboard {shlex.quote(source)} --plan {shlex.quote(plan)} "
            f"--out {shlex.quote(out_name)}")


def _variant_flags(variant: str) -> list[str]:
    """``eval_variant`` text → the ``lengthgen eval`` flags that evaluate it again."""
    import re

    flags = []
    for item in re.split(r",(?=[A-Za-z_][\w.]*=)", variant) if variant else []:
        key, _, value = item.partition("=")
        if key == "attn":
            flags.append(f"--attn {shlex.quote(value)}")
        elif key.startswith("attn."):
            flags.append(f"--attn-option {shlex.quote(key[5:] + '=' + value)}")
        elif key in ("precision", "checkpoint"):
            flags.append(f"--{key} {shlex.quote(value)}")
        else:
            flags.append(f"--param {shlex.quote(item)}")
    return flags


def eval_commands(rows: pd.DataFrame, sweep_dir: str) -> list[str]:
    """``lengthgen eval`` commands for what a sweep command does not rebuild: a run's lengths beyond
    its config's ``max_factor`` and its evaluation variants, from the shortest evaluated length to
    the longest. One command per run and variant, or one for the whole sweep folder when every run
    in it was evaluated the same way."""
    ok = rows[rows["status"] == "ok"].dropna(subset=["factor"])
    variants = ok["eval_variant"].fillna("").astype(str) if "eval_variant" in ok else pd.Series("", ok.index)
    by_flags: dict[tuple[str, ...], list[str]] = {}
    for (run_id, variant), group in ok.groupby([ok["run_id"], variants], sort=True):
        config = config_dict(group["config_json"].iloc[0])
        top = int(group["factor"].max())
        configured = int(config.get("eval", {}).get("max_factor", top)) if config else top
        if not variant and top <= configured:
            continue
        low = int(group["factor"].min())
        flags = [f"--max-factor {top}"] if top != configured or variant else []
        flags += [f"--min-factor {low}"] if low > 1 else []
        by_flags.setdefault((*flags, *_variant_flags(variant)), []).append(str(run_id))
    every_run = sorted(set(ok["run_id"].astype(str)))
    folder = sweep_dir.rstrip("/")
    commands = []
    for flags, run_ids in sorted(by_flags.items(), key=lambda item: (item[1][0], item[0])):
        targets = [folder] if len(run_ids) > 1 and sorted(run_ids) == every_run else \
            [f"{folder}/runs/{run_id}" for run_id in run_ids]
        commands += [" ".join(["lengthgen eval", shlex.quote(target), *flags]) for target in targets]
    return commands
