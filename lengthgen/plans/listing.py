"""What ``lengthgen sweep --plan … --dry-run`` prints: the missing work of each block with its
estimated CPU time, and what waits for a choice."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lengthgen.config import RunConfig
from lengthgen.plans.estimate import Timings, total
from lengthgen.plans.execute import pending_extensions
from lengthgen.plans.plan import Block, BlockState, Work, configs_at, extension_factors, missing_run
from lengthgen.progress import format_seconds


def resumes_mark(work: Work) -> str:
    """Marks a missing run whose stopped training resumes (its estimate counts the steps left), or
    that was stopped while it evaluated (it evaluates only the lengths it had not finished)."""
    step = work.resumes_at
    if step is None:
        return ""
    if step >= work.config.train.steps:
        left = ", ".join(f"{f}x" for f in work.to_evaluate)
        return f", trained: evaluates {left or 'nothing more'}"
    return f", resumes its saved training at step {step:,}"


def point_label(block: Block, config: RunConfig) -> str:
    """The grid fields of ``config`` (``train.lr=0.001, train.warmup_steps=200``)."""
    dumped = config.model_dump(mode="json")
    items = []
    for key in block.sweep.grid:
        section, _, name = key.partition(".")
        items.append(f"{key}={dumped[section][name]}")
    return ", ".join(items)


def work_seconds(work: Work, timings: Timings) -> float | None:
    """CPU seconds of the work: training (the steps left, for a resumed run) and evaluation."""
    if work.kind in ("extend", "variant") and not work.restore:
        return timings.eval_seconds(work.config, work.factors)
    if work.kind in ("extend", "variant"):  # trained and tested again (to compare), then evaluated
        again = work_seconds(Work("seed", work.block, work.config), timings)
        more = timings.eval_seconds(work.config, work.factors)
        return None if again is None or more is None else again + more
    train = timings.train_seconds(work.config)
    test = timings.eval_seconds(work.config, work.to_evaluate)
    if train is None or test is None:
        return None
    steps = work.config.train.steps
    done = min(work.resumes_at or 0, steps)
    return train * (steps - done) / steps + test if steps else test


def _waiting_seconds(state: BlockState, timings: Timings) -> list[float | None]:
    """Estimates for the runs and evaluations a block will need once its point is chosen."""
    block = state.block
    template = block.screening[0]
    out: list[float | None] = []
    for seed in block.rest_seeds[:state.waiting]:
        config = template.model_copy(update={"seed": seed})
        out.append(work_seconds(Work("seed", block.label, config), timings))
    wanted = extension_factors(template, block.full_max_factor)
    out.extend(timings.eval_seconds(template, wanted) for _ in range(pending_extensions(state)))
    return out


def _scaled_mark(config: RunConfig, timings: Timings, seconds: float | None) -> str:
    """Says when an estimate comes from runs of another model size (scaled by their arithmetic), or
    from the cost model where no run of the task is recorded."""
    if seconds is None or timings.size_recorded(config):
        return ""
    if not timings.task_recorded(config):
        return " (cost model: no run of this task recorded)"
    return " (scaled from another model size)"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def dry_run_lines(states: list[BlockState], timings: Timings) -> list[str]:
    lines: list[str] = []
    estimates: list[float | None] = []
    runs = evaluations = waiting = 0
    for state in states:
        block = state.block
        if state.chosen is not None:
            status = f"chosen {point_label(block, _chosen_config(state))}"
        elif block.staged:
            status = f"screening {state.screened} of {len(block.screening)} recorded"
        else:
            status = "one setting"
        todo = list(state.work)
        lines.append(f"{block.label} ({status}): "
                     + (f"{len(todo) + state.waiting + pending_extensions(state)} missing"
                        if todo or state.waiting or pending_extensions(state) else "complete"))
        for work in todo:
            seconds = work_seconds(work, timings)
            estimates.append(seconds)
            label = point_label(block, work.config)
            if work.kind in ("extend", "variant"):
                evaluations += 1
                pick = " the paper-protocol pick" if work.protocol else ""
                on = f" on {work.label}" if work.kind == "variant" else ""
                what = f"evaluate{pick}{on} at {', '.join(f'{f}x' for f in work.factors)}"
                what = f"train again (model.pt gone), {what}" if work.restore else what
            else:
                runs += 1
                what = "screening run" if work.kind == "screen" else "run"
            marks = _scaled_mark(work.config, timings, seconds) + resumes_mark(work)
            named = f"{work.key} ({label})" if label else work.key
            lines.append(f"  {what} {named}  ~{format_seconds(seconds)}{marks}")
        later = _waiting_seconds(state, timings)
        if later:
            known, unknown = total(later)
            waiting += len(later)
            seeds = ", ".join(map(str, block.rest_seeds))
            extensions = _count(pending_extensions(state), "evaluation")
            lines.append(f"  then {_count(state.waiting, 'run')} (seeds {seeds}) and {extensions} to "
                         f"{block.full_max_factor}x at the chosen point  "
                         f"~{format_seconds(known if not unknown else None)}"
                         + _scaled_mark(block.screening[0], timings, None if unknown else known))
            estimates.extend(later)
    known, unknown = total(estimates)
    if not estimates:
        lines.append("nothing missing: every run of the plan is recorded")
    else:
        lines.append(f"missing: {_count(runs, 'run')} and {_count(evaluations, 'evaluation')} now, "
                     f"{waiting} more after a choice; estimated CPU time {format_seconds(known)}"
                     + (f" + {unknown} without a comparable recorded run" if unknown else ""))
    return lines


def _chosen_config(state: BlockState) -> RunConfig:
    assert state.chosen is not None
    return configs_at(state.block, state.chosen, state.block.sweep.seeds[:1])[0]


def missing_run_lines(configs: Sequence[RunConfig], out: str, timings: Timings | None = None,
                      retry_failed: bool = False) -> list[str]:
    """``--dry-run`` of a plain sweep: each missing run with its estimated CPU time (from the runs
    recorded under ``out`` unless ``timings`` says otherwise)."""
    from lengthgen.sweeps import plan

    timings = timings if timings is not None else Timings.from_folders(Path(out))
    todo = [missing_run("screen", "", c, out) for c in plan(configs, out, retry_failed=retry_failed).todo]
    estimates = [work_seconds(work, timings) for work in todo]
    lines = [f"run {work.key}  ~{format_seconds(e)}{_scaled_mark(work.config, timings, e)}"
             + resumes_mark(work) for work, e in zip(todo, estimates, strict=True)]
    known, unknown = total(estimates)
    lines.append(f"missing: {len(todo)} of {len(configs)} runs; estimated CPU time {format_seconds(known)}"
                 + (f" + {unknown} without a comparable recorded run" if unknown else ""))
    return lines
