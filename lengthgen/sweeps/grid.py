"""The grid of a sweep: tasks × backends × position schemes × settings × seeds, and its configs.

Every config is built by ``build_run_config`` exactly as ``lengthgen run`` builds it, so a run
has the same id whether it came from ``run`` or from a sweep.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from lengthgen import limits
from lengthgen.config import RunConfig, build_run_config, combine_overrides, flag_overrides
from lengthgen.errors import UserError

__all__ = ["SweepSpec", "shard_of", "validate_spec"]


@dataclass(frozen=True)
class SweepSpec:
    """The grid (tasks × backends × position schemes × settings × seeds) and the settings shared by
    its runs. ``grid`` holds the fields given several values (``--set train.lr=5e-4,1e-3``): every
    combination of them is a setting. A grid point whose values are the preset's builds exactly the
    config a sweep without the grid builds, so its run keeps its id."""

    tasks: tuple[str, ...]
    attns: tuple[str, ...]
    positions: tuple[str, ...] = ("nape",)
    seeds: tuple[int, ...] = (0,)
    preset: str = "quick"
    steps: int | None = None
    max_factor: int | None = None
    eval_samples: int | None = None
    train_length: int | None = None
    selection: str | None = None
    task_params: dict[str, Any] = field(default_factory=dict)
    #: Further ``SECTION.FIELD`` settings (``--set train.lr=5e-4``), as for ``lengthgen run``.
    overrides: dict[str, Any] = field(default_factory=dict)
    #: ``SECTION.FIELD`` → the values to cross (``{"train.lr": (5e-4, 1e-3)}``).
    grid: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    #: Backend options for every backend of the sweep (``--attn-option alpha=1.25``); each backend
    #: must accept them. The others keep the backend's defaults, written out in the config.
    attn_options: dict[str, Any] = field(default_factory=dict)

    def settings(self) -> dict[str, Any]:
        """The dedicated flags and ``overrides`` as one dict of dotted overrides."""
        flags = flag_overrides(steps=self.steps, max_factor=self.max_factor, train_length=self.train_length,
                               eval_samples=self.eval_samples, selection=self.selection)
        return combine_overrides(flags, self.overrides)

    def points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values (the first field varies slowest); one empty
        point without a grid."""
        keys = list(self.grid)
        return [dict(zip(keys, values, strict=True)) for values in itertools.product(*self.grid.values())]

    def size(self) -> int:
        """Runs in the grid, counted before any config is built."""
        return (len(self.tasks) * len(self.attns) * len(self.positions) * len(self.seeds)
                * math.prod(len(v) for v in self.grid.values()))

    def configs(self) -> list[RunConfig]:
        """One config per grid point, in a stable order (task, backend, position, setting, seed)."""
        settings = [combine_overrides(self.settings(), point) for point in self.points()]
        return [
            build_run_config(task, attn, pos=pos, preset=self.preset, seed=seed,
                             task_params=self.task_params, attn_options=self.attn_options, overrides=setting)
            for task in self.tasks for attn in self.attns for pos in self.positions for setting in settings
            for seed in self.seeds
        ]


def validate_spec(spec: SweepSpec) -> list[RunConfig]:
    """Check every name and every config before anything runs; a problem is a one-line
    ``UserError`` naming the valid choices."""
    for name, values in (("--task", spec.tasks), ("--attn", spec.attns), ("--pos", spec.positions),
                         ("--seeds", spec.seeds)):
        if not values:
            raise UserError(f"{name} needs at least one value")
        if len(set(values)) != len(values):
            raise UserError(f"{name} lists a value twice: {', '.join(map(str, values))}")
    limits.check_at_most("number of seeds", len(spec.seeds), limits.MAX_SEEDS)
    for seed in spec.seeds:
        limits.check_seed(seed)
    for key, values in spec.grid.items():
        texts = [json.dumps(v, sort_keys=True) for v in values]
        if len(set(texts)) != len(texts):
            raise UserError(f"--set {key} lists a value twice: {', '.join(texts)}")
    limits.check_at_most("runs in the sweep", spec.size(), limits.MAX_RUNS)
    return spec.configs()


def shard_of(configs: Sequence[RunConfig], shard: str) -> list[RunConfig]:
    """``I/N``: the runs I, I+N, I+2N, … of the grid, so N independent jobs (a Slurm array) split
    one grid without coordination; together they write the same dataset as one sweep."""
    index, slash, count = shard.partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i, n = -1, 0
    if not slash or n < 1 or not 0 <= i < n:
        raise UserError(f"bad --shard {shard!r}: expected I/N with 0 <= I < N, e.g. 0/4")
    return list(configs[i::n])
