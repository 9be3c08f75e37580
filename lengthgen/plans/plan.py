"""The leaderboard's recipe: a plan file that lists every sweep a published board is made of.

A plan (TOML, see ``docs/sweeps.md``) names, per sweep, the tasks, backends, position schemes,
seeds, preset, fixed settings and a grid. A grid is run in two stages:

1. **Screening.** Every grid point runs on the screening seeds (default: the first seed), tested
   only up to ``screen.max_factor`` when given: selection needs validation scores, which every
   run records, not test scores at long lengths.
2. **The chosen point.** Per (task, backend, position scheme), once all its screening runs are
   recorded, the leaderboard's selection rule (``selection.select_settings``: best mean
   in-distribution validation exact match over the seeds every setting ran) picks one point; the
   remaining seeds run there, and every run of that point is then evaluated up to the preset's
   ``max_factor`` (``lengthgen eval`` semantics, one length at a time so an interruption keeps
   what is done). A backend's paper-protocol pick (its best single run by 8× validation) is
   evaluated over that range too, once all the backend's runs are trained, when it is a screening
   run of a point not chosen.

What is done is read from the results dataset alone (``DIR/data``), so running a plan again does
exactly the work that is missing. A sweep without a grid is one stage: every seed at the preset.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import pandas as pd
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from lengthgen import limits
from lengthgen.config import RunConfig, parse_toml, validation_message
from lengthgen.errors import UserError
from lengthgen.files import read_text
from lengthgen.harness.storage.results import read_parquet_file
from lengthgen.harness.weights import MODEL_FILE
from lengthgen.plans.numerics import check_pins
from lengthgen.sweeps import SweepSpec, data_path, kept_factors, resume_step, run_key, run_path, run_state

#: What a plan may call a sweep, task, backend, position scheme, preset or ablation folder: a plain
#: name, never a path or a plugin spec (``file.py:Class`` would run code named by a plan that
#: someone downloaded to rebuild a board; installed plugins are found by their names).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")


def _plain_name(value: str) -> str:
    if not NAME.fullmatch(value):
        shown = repr(value) if len(value) <= 70 else repr(value[:70]) + "…"
        raise ValueError(f"{shown} is not a plain name (letters, digits, _ . -, at most 64; a plan names "
                         "built-in or installed tasks and backends, never a file.py:Class spec)")
    return value


def _text(limit: int) -> AfterValidator:
    """One line of text of at most ``limit`` characters, without control characters."""

    def check(value: str) -> str:
        if len(value) > limit:
            raise ValueError(f"is {len(value):,} characters long, over the limit of {limit:,}")
        if not limits.is_line(value, limit):
            raise ValueError("holds a control character (a line break, a tab, …): write one line of text")
        return value

    return AfterValidator(check)


Name = Annotated[str, AfterValidator(_plain_name)]
Seed = Annotated[StrictInt, Field(ge=0, le=limits.MAX_SEED)]
Seeds = Annotated[tuple[Seed, ...], Field(min_length=1, max_length=limits.MAX_SEEDS)]


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Screen(_Frozen):
    """How a grid is screened before the remaining seeds run at the chosen point."""

    seeds: Seeds | None = Field(None, description="screening seeds (default: the first seed)")
    max_factor: StrictInt | None = Field(None, ge=1, le=limits.MAX_LENGTH,
                                         description="test screening runs only up to this factor")

    @field_validator("max_factor")
    @classmethod
    def _power_of_two(cls, value: int | None) -> int | None:
        if value is not None and not limits.is_power_of_two(value):
            raise ValueError(f"must be a power of two, got {value}")
        return value


class PlanVariant(_Frozen):
    """An evaluation of every recorded run of a sweep on a variant of its task, as ``lengthgen eval
    RUN --param k=v --min-factor M --max-factor N`` makes it (MQMTAR's planted near misses: the
    training-budget study measures its error per near miss this way)."""

    param: dict[str, Any] = Field(min_length=1, description="task parameters of the variant")
    min_factor: int = Field(1, ge=1, description="the shortest length (a power of two)")
    max_factor: int | None = Field(None, ge=1, description="the longest (default: the run's own)")

    @model_validator(mode="after")
    def _powers_of_two(self) -> PlanVariant:
        for name in ("min_factor", "max_factor"):
            value = getattr(self, name)
            if value is not None and not limits.is_power_of_two(value):
                raise ValueError(f"{name} must be a power of two, got {value}")
        if self.max_factor is not None and self.max_factor < self.min_factor:
            raise ValueError(f"max_factor {self.max_factor} is under min_factor {self.min_factor}")
        return self


class PlanSweep(_Frozen):
    """One sweep of the plan, spelled as ``lengthgen sweep`` flags are (``set``, ``grid``, ``param``)."""

    name: Name
    task: tuple[Name, ...] = Field(min_length=1)
    attn: tuple[Name, ...] = Field(min_length=1)
    pos: tuple[Name, ...] = ("nape",)
    preset: Name = "quick"
    seeds: Seeds = (0,)
    set: dict[str, Any] = Field(default_factory=dict, description="SECTION.FIELD = value for every run")
    grid: dict[str, tuple[Any, ...]] = Field(default_factory=dict, description="SECTION.FIELD = [values]")
    param: dict[str, Any] = Field(default_factory=dict, description="task parameters")
    attn_option: dict[str, Any] = Field(default_factory=dict, description="backend options")
    screen: Screen = Screen()
    variants: tuple[PlanVariant, ...] = Field((), description="task variants every recorded run is "
                                              "also evaluated on")

    @field_validator("task", "attn", "pos", "seeds")
    @classmethod
    def _distinct(cls, values: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(set(values)) != len(values):
            raise ValueError(f"lists a value twice: {', '.join(map(str, values))}")
        return values

    @model_validator(mode="after")
    def _consistent(self) -> PlanSweep:
        for key, values in self.grid.items():
            texts = [json.dumps(v, sort_keys=True) for v in values]
            if len(values) < 2 or len(set(texts)) != len(texts):
                raise ValueError(f"grid {key} needs two or more distinct values, got {texts}")
            if key in self.set:
                raise ValueError(f"{key} is both in set and in grid")
        if not self.grid and self.screen != Screen():
            raise ValueError("screen needs a grid to screen")
        if not set(self.screening_seeds()) <= set(self.seeds):
            raise ValueError(f"screen.seeds {list(self.screening_seeds())} are not all in seeds")
        return self

    def screening_seeds(self) -> tuple[int, ...]:
        return self.screen.seeds if self.screen.seeds is not None else self.seeds[:1]

    def spec(self, seeds: Sequence[int], *, grid: bool, screening: bool,
             point: Mapping[str, Any] | None = None) -> SweepSpec:
        """The ``SweepSpec`` of a part of this sweep: the whole grid (``grid``), or one ``point``."""
        overrides = {**self.set, **(point or {})}
        if screening and self.screen.max_factor is not None:
            overrides["eval.max_factor"] = self.screen.max_factor
        return SweepSpec(tasks=self.task, attns=self.attn, positions=self.pos, seeds=tuple(seeds),
                         preset=self.preset, task_params=dict(self.param), overrides=overrides,
                         grid=dict(self.grid) if grid else {}, attn_options=dict(self.attn_option))

    def points(self) -> list[dict[str, Any]]:
        return self.spec((0,), grid=True, screening=False).points()


class PlanReason(_Frozen):
    """Why some seeds of a task × backend did not learn, and the ablation that shows it."""

    task: Name
    attn: tuple[Name, ...] = Field(min_length=1)
    ablation: Name = Field(description="the ablation folder's name")
    text: Annotated[str, Field(min_length=1), _text(4000)]


def _relative_path(value: str) -> str:
    """A path a plan names: relative to the plan file, inside its folder (no '..', not absolute)."""
    if not value or len(value) > 200 or Path(value).is_absolute() or ".." in Path(value).parts \
            or "\\" in value or not limits.is_line(value, 200):
        raise ValueError(f"{value[:70]!r} is not a folder inside the plan's folder (a relative path "
                         "without '..')")
    return value


class BoardPlan(_Frozen):
    """A plan file: the board's title, hardware note, numerics pin, ablation folder, sweeps and the
    reasons of the cells where not every seed learned."""

    title: Annotated[str, Field(min_length=1), _text(200)] = "lengthgen leaderboard"
    hardware: Annotated[str, _text(200)] | None = None
    numerics: dict[str, str] = Field(default_factory=dict, description="environment variables that pin "
                                     "the instruction sets the runs were made with (``numerics.py``)")
    ablations: str | None = Field(None, description="folder of ablation sweeps, relative to the plan file")
    budget: str | None = Field(None, description="the training-budget study's plan file, relative to this "
                               "one; its runs are in the folder of the same name beside it")
    timings: tuple[str, ...] = Field((), max_length=8, description="result folders, relative to this "
                                     "file, whose recorded runs also inform --dry-run's estimates")
    sweep: tuple[PlanSweep, ...] = Field(min_length=1)
    reason: tuple[PlanReason, ...] = ()

    @field_validator("timings")
    @classmethod
    def _relative_folders(cls, values: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_relative_path(value) for value in values)

    @field_validator("ablations", "budget")
    @classmethod
    def _relative_folder(cls, value: str | None) -> str | None:
        return None if value is None else _relative_path(value)

    @field_validator("numerics", mode="before")
    @classmethod
    def _known_pins(cls, pins: Any) -> Any:
        if isinstance(pins, dict):
            check_pins(pins)
        return pins

    @model_validator(mode="after")
    def _unique_names(self) -> BoardPlan:
        runs = sum(len(s.task) * len(s.attn) * len(s.pos) * len(s.seeds)
                   * math.prod(len(v) for v in s.grid.values()) for s in self.sweep)
        if runs > limits.MAX_RUNS:
            raise ValueError(f"the plan makes {runs:,} runs, over the limit of {limits.MAX_RUNS:,}")
        names = [s.name for s in self.sweep]
        if len(set(names)) != len(names):
            raise ValueError(f"two sweeps share a name: {', '.join(names)}")
        cells = {(t, a) for s in self.sweep for t in s.task for a in s.attn}
        given: set[tuple[str, str]] = set()
        for reason in self.reason:
            for attn in reason.attn:
                if (reason.task, attn) not in cells:
                    raise ValueError(f"reason for {reason.task} · {attn}: no sweep of the plan runs it")
                if (reason.task, attn) in given:
                    raise ValueError(f"two reasons for {reason.task} · {attn}")
                given.add((reason.task, attn))
        if self.reason and self.ablations is None:
            raise ValueError("reasons name ablations, but the plan has no ablations folder")
        return self

    def cell_reasons(self) -> list[tuple[str, str, str, str]]:
        """(task, backend, ablation, text) per cell the plan gives a reason for."""
        return [(r.task, a, r.ablation, r.text) for r in self.reason for a in r.attn]


def load_plan(path: str | Path) -> BoardPlan:
    """Read and check a plan file; every problem is a one-line ``UserError``."""
    try:
        data = parse_toml(read_text(path, limit=limits.MAX_TEXT_BYTES), f"--plan {path}")
    except FileNotFoundError:
        raise UserError(f"--plan {path}: no such file") from None
    try:
        return BoardPlan.model_validate(data)
    except ValidationError as exc:
        raise UserError(validation_message(exc, f"--plan {path}")) from None


def rule_text(plan: BoardPlan) -> str:
    """How the plan's grids became the board's rows, for the page (the rule this module applies)."""
    return _grids_text(plan) + _fixed_text(plan)


def _fixed_text(plan: BoardPlan) -> str:
    """The settings a sweep fixes beyond its preset (a wider model, a longer warm-up): a reader
    comparing a row with the preset's defaults needs them as much as the grid."""
    parts = [f"{sweep.name}: " + ", ".join(f"{key} = {json.dumps(value)}" for key, value in sweep.set.items())
             for sweep in plan.sweep if sweep.set]
    if not parts:
        return ""
    return " Fixed beyond the preset, for every run of a sweep: " + "; ".join(parts) + "."


def _grids_text(plan: BoardPlan) -> str:
    grids = [s for s in plan.sweep if s.grid]
    if not grids:
        return "Every sweep of the plan has one setting: each row shows all its seeds."
    parts = []
    for sweep in grids:
        fields = " × ".join(f"{key} {{{', '.join(json.dumps(v) for v in values)}}}"
                            for key, values in sweep.grid.items())
        seeds = sweep.screening_seeds()
        tested = "" if sweep.screen.max_factor is None else f", tested only to {sweep.screen.max_factor}×"
        parts.append(f"{sweep.name}: {fields} on seed{'s' if len(seeds) > 1 else ''} "
                     f"{', '.join(map(str, seeds))}{tested}")
    return ("Two-stage grids. Stage 1 runs every grid point on the screening seed (" + "; ".join(parts)
            + "). Per task, backend and position scheme, the point with the best in-distribution "
            "validation exact match on the screening seed (exact ties: the smaller learning rate, then the "
            "longer warm-up) is chosen, never on test data; "
            "stage 2 runs the remaining seeds there, and every run of the chosen point is evaluated over "
            "the preset's whole range of factors. The other points keep their screening run alone and show "
            "as runner-up settings; when one of those runs is a backend's paper-protocol pick (best 8× "
            "validation), it too is evaluated over the whole range. While a row's grid is screened in "
            "part, it shows the best point recorded so far, marked provisional.")


def _inside(plan_path: str | Path, relative: str, what: str, out: str | Path | None) -> Path:
    """``relative`` to the plan file; it must lie inside the plan's folder or the output folder
    ``out`` once links are followed (a link inside a downloaded plan's folder must not make the
    board read and publish some other folder)."""
    target = Path(plan_path).parent / relative
    real = target.resolve()
    roots = [Path(plan_path).parent.resolve(), *([Path(out).resolve()] if out is not None else [])]
    if not any(real == root or root in real.parents for root in roots):
        raise UserError(f"the plan's {what} {str(target)!r} leads to {str(real)!r}, outside the "
                        "plan's folder: keep it there")
    return target


def ablations_dir(plan: BoardPlan, plan_path: str | Path, out: str | Path | None = None) -> Path | None:
    """The plan's ablation folder (``_inside`` the plan's folder or ``out``)."""
    if plan.ablations is None:
        return None
    return _inside(plan_path, plan.ablations, "ablations folder", out)


def timings_dirs(plan: BoardPlan, plan_path: str | Path) -> list[Path]:
    """The result folders the plan names for its estimates (``_inside`` the plan's folder)."""
    return [_inside(plan_path, folder, "timings folder", None) for folder in plan.timings]


def budget_paths(plan: BoardPlan, plan_path: str | Path) -> tuple[Path, Path] | None:
    """The training-budget study's plan file and its runs' folder (the plan file's name without
    ``.toml``, beside it), both inside the plan's folder; None when the plan names no study."""
    if plan.budget is None:
        return None
    study = _inside(plan_path, plan.budget, "budget study", None)
    return study, _inside(plan_path, str(Path(plan.budget).with_suffix("")), "budget study's folder", None)


# -- what the plan consists of ------------------------------------------------------------------------
@dataclass(frozen=True)
class Block:
    """One (task, backend, position scheme) of a plan sweep: its grid points on the screening seeds,
    and the seeds left to run at the chosen point."""

    sweep: PlanSweep
    task: str
    attn: str
    pos: str
    screening: tuple[RunConfig, ...]  # every grid point × screening seed (all seeds without a grid)
    rest_seeds: tuple[int, ...]
    full_max_factor: int

    @property
    def label(self) -> str:
        return f"{self.sweep.name}: {self.task}/{self.attn}/{self.pos}"

    @property
    def staged(self) -> bool:
        return bool(self.sweep.grid)


def blocks(plan: BoardPlan) -> list[Block]:
    """Every block of the plan, in file order; the configs are built (and so checked) here (the
    plan's size is checked when it is read)."""
    out = []
    seen: dict[str, str] = {}
    for sweep in plan.sweep:
        screening_seeds = sweep.screening_seeds() if sweep.grid else sweep.seeds
        rest = tuple(s for s in sweep.seeds if s not in screening_seeds)
        configs = sweep.spec(screening_seeds, grid=True, screening=True).configs()
        full = sweep.spec(sweep.seeds[:1], grid=False, screening=False).configs()
        per_block = len(configs) // (len(sweep.task) * len(sweep.attn) * len(sweep.pos))
        for index, (task, attn, pos) in enumerate(
                (t, a, p) for t in sweep.task for a in sweep.attn for p in sweep.pos):
            mine = tuple(configs[index * per_block:(index + 1) * per_block])
            for config in mine:
                key = run_key(config)
                if key in seen:
                    raise UserError(f"plan sweeps {seen[key]!r} and {sweep.name!r} both make run {key}")
                seen[key] = sweep.name
            out.append(Block(sweep, task, attn, pos, mine, rest, full[index].eval.max_factor))
    return out


# -- where the plan stands -----------------------------------------------------------------------------
WorkKind = Literal["screen", "seed", "extend", "variant"]


@dataclass(frozen=True)
class Work:
    """One piece of missing work: train a screening run of a grid (``screen``) or any other run
    (``seed``), or extend a recorded run's evaluation to more factors (``extend``), training it
    again first when its ``model.pt`` is gone (``restore``)."""

    kind: WorkKind
    block: str
    config: RunConfig
    factors: tuple[int, ...] = ()  # extend: the factors still to evaluate
    restore: bool = False  # extend: the run folder has no model.pt to evaluate
    resumes_at: int | None = None  # screen, seed: the step a stopped training resumes from
    kept: tuple[int, ...] = ()  # screen, seed, trained whole: the factors its stopped attempt evaluated
    protocol: bool = False  # extend: the paper-protocol pick, a screening run of a point not chosen
    variant: PlanVariant | None = None  # variant: the task variant to evaluate at ``factors``

    @property
    def key(self) -> str:
        return run_key(self.config)

    @property
    def to_evaluate(self) -> list[int]:
        """screen, seed: the factors its run evaluates, less those a stopped attempt kept."""
        return [f for f in self.config.eval.factors() if f not in self.kept]

    @property
    def label(self) -> str:
        """The variant as its rows name it (``eval_variant``); '' for the other kinds."""
        from lengthgen.harness.recorded.saved import changed_task_params, variant_label

        if self.variant is None:
            return ""
        return variant_label(changed_task_params(self.config, self.variant.param))


def missing_run(kind: WorkKind, block: str, config: RunConfig, out: str | Path) -> Work:
    """A run to make, with what a stopped attempt left under ``out``: the step its saved training
    resumes from and, when it was trained whole, the lengths it keeps."""
    step = resume_step(out, config)
    return Work(kind, block, config, resumes_at=step, kept=kept_factors(out, config, step))


@dataclass
class BlockState:
    block: Block
    chosen: dict[str, Any] | None = None  # the chosen grid point (None: not decided yet)
    work: list[Work] = field(default_factory=list)
    waiting: int = 0  # runs that wait for the choice (seeds at the chosen point)
    board: list[str] = field(default_factory=list)  # run keys the board shows (recorded ones)

    @property
    def screened(self) -> int:
        """Screening runs recorded (the work still lists the others)."""
        return len(self.block.screening) - sum(w.kind == "screen" for w in self.work)


def _ok_factors(path: Path, variant: str = "") -> set[int]:
    """Factors with an ok row of the training task (``variant`` '': no evaluation variant) or of an
    evaluation variant in a data file."""
    try:
        rows = read_parquet_file(path, columns=["factor", "status", "eval_variant"])
    except Exception:  # unreadable: run_state already calls such a run missing
        return set()
    variants = rows["eval_variant"].fillna("").astype(str)
    ok = rows[(rows["status"] == "ok") & (variants == variant) & rows["factor"].notna()]
    return {int(f) for f in ok["factor"]}


def _choose(block: Block, out: Path) -> dict[str, Any] | None:
    """The grid point the selection rule picks from the block's screening runs (all recorded)."""
    from lengthgen.leaderboard.rows import load_rows, prepared, runs, setting_of
    from lengthgen.leaderboard.selection import select_settings

    frames = [load_rows(data_path(out, run_key(c))) for c in block.screening]
    table = runs(prepared(pd.concat(frames, ignore_index=True)))
    winner = select_settings(table)[(block.task, block.attn, block.pos)].ranked[0].setting
    seed = block.screening[0].seed
    for point in block.sweep.points():
        if setting_of(configs_at(block, point, (seed,))[0].canonical_json()) == winner:
            return point
    raise AssertionError(f"{block.label}: the selected setting {winner} is no grid point")


def configs_at(block: Block, point: Mapping[str, Any], seeds: Sequence[int]) -> list[RunConfig]:
    """The block's runs at one grid point for ``seeds`` (tested up to the screening factor)."""
    spec = block.sweep.spec(seeds, grid=False, screening=True, point=point)
    return [c for c in spec.configs() if (c.task, c.attn, c.pos) == (block.task, block.attn, block.pos)]


def survey(plan: BoardPlan, out: str | Path, retry_failed: bool = False) -> list[BlockState]:
    """What each block has recorded under ``out`` and what it still needs, in plan order."""
    root = Path(out)
    states = []
    for block in blocks(plan):
        state = BlockState(block)
        recorded = {}
        for config in block.screening:
            key = run_key(config)
            recorded[key] = run_state(data_path(root, key))
            if recorded[key] == "missing" or (recorded[key] == "failed" and retry_failed):
                kind: WorkKind = "screen" if block.staged else "seed"
                state.work.append(missing_run(kind, block.label, config, root))
        if block.staged and state.work:
            state.waiting = len(block.rest_seeds)
            states.append(state)
            continue
        if block.staged:
            state.chosen = _choose(block, root)
        for config in _runs_at_chosen(state):
            key = run_key(config)
            status = run_state(data_path(root, key))
            if status == "missing" or (status == "failed" and retry_failed):
                if config.seed in block.rest_seeds:
                    state.work.append(missing_run("seed", block.label, config, root))
                continue
            state.board.append(key)
            if status == "failed":
                continue
            _add_extension(state, config, root)
            _add_variants(state, config, root)
        states.append(state)
    _extend_protocol_picks(states, root)
    return states


def _extend_protocol_picks(states: list[BlockState], root: Path) -> None:
    """Add the evaluation of each backend's paper-protocol pick (``selection.paper_protocol``: the
    best single run by 8× validation) over the full range when it is a screening run that was
    tested only to the screening factor; decided once every run of the backend is trained, so a
    later seed cannot take the pick from a run already extended for it."""
    from lengthgen.leaderboard.rows import load_rows, prepared, runs
    from lengthgen.leaderboard.selection import paper_protocol

    groups: dict[tuple[str, str], list[BlockState]] = {}
    for state in states:
        groups.setdefault((state.block.task, state.block.attn), []).append(state)
    for (task, attn), group in groups.items():
        if any(s.waiting or (s.block.staged and s.chosen is None)
               or any(w.kind not in ("extend", "variant") for w in s.work) for s in group):
            continue
        owner: dict[str, tuple[BlockState, RunConfig]] = {}
        for state in group:
            for config in (*state.block.screening, *_runs_at_chosen(state)):
                owner.setdefault(run_key(config), (state, config))
        frames = [load_rows(data_path(root, key)) for key in owner if data_path(root, key).is_file()]
        if not frames:
            continue
        pick = paper_protocol(runs(prepared(pd.concat(frames, ignore_index=True)))).get((task, attn))
        if pick is None or pick.run_id is None or pick.run_id not in owner:
            continue
        state, config = owner[pick.run_id]
        if any(w.key == pick.run_id for w in state.work):
            continue  # a run of the chosen point: already being extended
        _add_extension(state, config, root, protocol=True)


def _add_extension(state: BlockState, config: RunConfig, root: Path, protocol: bool = False) -> None:
    """Add the evaluation of a recorded run at the factors up to the full range it still lacks."""
    key = run_key(config)
    wanted = extension_factors(config, state.block.full_max_factor)
    missing = tuple(f for f in wanted if f not in _ok_factors(data_path(root, key)))
    if missing:
        restore = not (run_path(root, key) / MODEL_FILE).is_file()
        state.work.append(Work("extend", state.block.label, config, missing, restore, protocol=protocol))


def _add_variants(state: BlockState, config: RunConfig, root: Path) -> None:
    """Add the evaluations of a recorded run on its sweep's task variants that it still lacks."""
    key = run_key(config)
    restore = not (run_path(root, key) / MODEL_FILE).is_file()
    for variant in state.block.sweep.variants:
        top = variant.max_factor or config.eval.max_factor
        work = Work("variant", state.block.label, config, restore=restore, variant=variant)
        done = _ok_factors(data_path(root, key), work.label)
        missing = tuple(2**k for k in range(top.bit_length())
                        if variant.min_factor <= 2**k <= top and 2**k not in done)
        if missing:
            state.work.append(replace(work, factors=missing))


def _runs_at_chosen(state: BlockState) -> list[RunConfig]:
    """The block's runs at its chosen point, every seed (none while the point is not chosen)."""
    if not state.block.staged:
        return list(state.block.screening)
    if state.chosen is None:
        return []
    return configs_at(state.block, state.chosen, state.block.sweep.seeds)


def extension_factors(config: RunConfig, full_max_factor: int) -> tuple[int, ...]:
    """The factors past the run's own ``max_factor`` up to the full one."""
    return tuple(2**k for k in range(full_max_factor.bit_length())
                 if config.eval.max_factor < 2**k <= full_max_factor)


def screening_progress(states: Sequence[BlockState]) -> dict[tuple[str, str, str], tuple[int, int]]:
    """(recorded, planned) screening runs per (task, backend, position scheme) whose grid is screened
    in part (``states`` from ``survey``): the board marks those rows provisional, since a point still
    to run may win the choice."""
    return {(s.block.task, s.block.attn, s.block.pos): (s.screened, len(s.block.screening))
            for s in states if s.block.staged and 0 < s.screened < len(s.block.screening)}


def board_run_ids(states: Sequence[BlockState]) -> set[str]:
    """The recorded runs the board is made of (``states`` from ``survey``): every screening run, and
    the runs at each chosen point (the leaderboard shows the screening runs that lost as runner-up
    settings)."""
    keys: set[str] = set()
    for state in states:
        keys.update(run_key(c) for c in state.block.screening)
        keys.update(state.board)
    return keys
