"""Doing a plan's missing work: screening runs, the remaining seeds at each chosen point, and the
evaluations that extend the chosen runs to the full factor range.

The work list is read again from the dataset after every finished piece (``plan.survey``), so a
block's remaining seeds start as soon as its last screening run is recorded. The order is in
``_order``: a chosen run is extended while its model is on disk, before more training, because a
run folder may not outlive the machine (a board's clone holds its data, not its weights) and a
model trained again costs about what the long evaluation does; then training (runs that wait for
no choice: sweeps without a grid and the chosen points' other seeds; then screening; each in the
plan's order); the runs whose model is already gone are trained again and extended last.
At most ``jobs`` pieces run at once (in this process when ``jobs`` is 1, else in a pool of
processes with cores/jobs threads each). Each piece is tried once per invocation: a run that fails
is recorded as failed (``--retry-failed`` tries it again next time) and an evaluation that fails
at some length keeps the lengths before it.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from lengthgen.harness.weights import MODEL_FILE
from lengthgen.plans.plan import BlockState, BoardPlan, Work, survey
from lengthgen.progress import Shown, format_seconds, log_line
from lengthgen.sweeps import data_path, failed_frame, record_if_missing, run_one, run_path, terminate_workers

if TYPE_CHECKING:
    from lengthgen.harness.evaluate import LengthResult

Echo = Callable[[str], None]


@dataclass(frozen=True)
class Done:
    """What the driver learns about a finished piece of work."""

    work: Work
    status: str  # ok or failed
    error: str | None
    seconds: float


@dataclass
class PlanReport:
    done: list[Done] = field(default_factory=list)
    remaining: int = 0
    interrupted: bool = False

    @property
    def failed(self) -> list[Done]:
        return [d for d in self.done if d.status != "ok"]


def evaluate_recorded(out: str, work: Work, device: str, progress: Shown = False) -> str | None:
    """Evaluate a recorded run at ``work.factors``, on its own task (``extend``) or on a task variant
    (``variant``), each length kept as it completes, training the run again first if its model is
    gone; returns the error that stopped it, if any. ``progress="log"``: in a log, the retraining's
    lines and a line per length done (one MQMTAR length can take 15 minutes)."""
    from lengthgen.harness.recorded.reevaluate import plan_evaluation, run_evaluation
    from lengthgen.harness.recorded.restore import restore_run
    from lengthgen.harness.recorded.saved import load_saved_run

    run_dir = run_path(out, work.key)
    if not (run_dir / MODEL_FILE).is_file():
        restore_run(run_dir, data_path(out, work.key), progress)
    run = load_saved_run(run_dir)
    factors = list(work.factors)
    if work.variant is None:
        plan = plan_evaluation(run, max_factor=max(factors))
    else:
        plan = plan_evaluation(run, max_factor=max(*factors, run.config.eval.max_factor),
                               task_params=work.variant.param, min_factor=min(factors))
    finished = [time.perf_counter()]

    def said(result: LengthResult) -> None:
        now = time.perf_counter()
        what = f" on {work.label}" if work.variant is not None else ""
        log_line(f"evaluate {work.key}{what}: {result.factor}x done, {len(finished)}/{len(factors)} lengths "
                 f"({format_seconds(now - finished[-1])})", enabled=progress == "log")
        finished.append(now)

    outcome = run_evaluation(plan, factors, device=device, progress=False, on_length=said)
    if outcome.error:
        return f"at {factors[len(outcome.rows)]}x: {outcome.error}"
    return None


def do_work(work: Work, out: str, device: str, threads: int | None = None, progress: Shown = False) -> Done:
    """One piece of work, in the driver or in a pool process; never raises for a failing run.
    ``progress="log"``: a line every tenth of a run's training in a log."""
    if threads:
        import torch

        torch.set_num_threads(threads)
    start = time.perf_counter()
    if work.kind in ("extend", "variant"):
        try:
            error = evaluate_recorded(out, work, device, progress)
        except Exception as exc:  # a model that cannot be loaded or restored: report it, go on
            error = f"{type(exc).__name__}: {exc}".splitlines()[0]
        return Done(work, "failed" if error else "ok", error, time.perf_counter() - start)
    outcome, _ = run_one(work.config, out, device, progress=progress)
    return Done(work, outcome.status, outcome.error, time.perf_counter() - start)


def pending_extensions(state: BlockState) -> int:
    """Evaluations a block will need once its point is chosen (one per seed), not yet listed."""
    block, screened_to = state.block, state.block.sweep.screen.max_factor
    if state.chosen is not None or not block.staged or screened_to is None:
        return 0
    return len(block.sweep.seeds) if screened_to < block.full_max_factor else 0


def remaining(states: list[BlockState]) -> int:
    """Pieces of work still to do, those that wait for a choice included."""
    return sum(len(s.work) + s.waiting + pending_extensions(s) for s in states)


def _describe(done: Done) -> str:
    what = {"screen": "screening run", "seed": "run", "extend": "evaluation",
            "variant": f"evaluation on {done.work.label}"}[done.work.kind]
    what += " of the paper-protocol pick" if done.work.protocol else ""
    what += " (trained again: its model.pt was gone)" if done.work.restore else ""
    factors = f" at {', '.join(f'{f}x' for f in done.work.factors)}" if done.work.factors else ""
    result = "ok" if done.status == "ok" else f"FAILED: {done.error}"
    return f"{what} {done.work.key}{factors}: {result} ({format_seconds(done.seconds)})"


def run_plan(plan: BoardPlan, out: str | Path, *, jobs: int = 1, device: str = "auto",
             retry_failed: bool = False, echo: Echo | None = None, progress: bool = True,
             report: PlanReport | None = None) -> PlanReport:
    """Do every missing piece of the plan's work under ``out``; ``report`` keeps the counts when a
    Ctrl-C (KeyboardInterrupt) propagates."""
    from tqdm.auto import tqdm

    root = str(Path(out).resolve())
    report = report if report is not None else PlanReport()
    tried: set[tuple[str, str, str]] = set()
    running: dict[Future[Done], Work] = {}
    pool = None
    if jobs > 1:
        import multiprocessing

        pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    threads = max(1, (os.cpu_count() or 1) // jobs) if pool else None
    shown: Shown = "log" if progress else False  # each run's training, in a log; the bar holds a terminal
    bar = tqdm(total=0, desc="plan", unit="piece", dynamic_ncols=True, smoothing=0.1,
               disable=not (progress and sys.stderr.isatty()))
    say = bar.write if not bar.disable else (echo or (lambda line: None))

    def finished(done: Done) -> None:
        report.done.append(done)
        say(_describe(done))
        bar.update(1)

    try:
        while True:
            states = survey(plan, root, retry_failed=retry_failed)
            report.remaining = remaining(states)
            bar.total = len(report.done) + report.remaining
            bar.refresh()
            busy = {(w.kind, w.key, w.label) for w in running.values()}
            ready = [w for w in sorted((w for s in states for w in s.work), key=_order)
                     if (w.kind, w.key, w.label) not in tried and (w.kind, w.key, w.label) not in busy]
            if pool is None:
                if not ready:
                    break
                tried.add((ready[0].kind, ready[0].key, ready[0].label))
                finished(do_work(ready[0], root, device, progress=shown))
                continue
            for work in ready[:jobs - len(running)]:
                tried.add((work.kind, work.key, work.label))
                running[pool.submit(do_work, work, root, device, threads, shown)] = work
            if not running:
                break
            completed, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for future in completed:
                work = running.pop(future)
                try:
                    finished(future.result())
                except Exception as exc:  # the worker process died (killed, out of memory)
                    error = f"worker died: {type(exc).__name__}: {exc}"
                    if work.kind in ("screen", "seed"):
                        record_if_missing(work.config, root, failed_frame(work.config, error))
                    finished(Done(work, "failed", error, 0.0))
    except BaseException:
        report.interrupted = True
        if pool is not None:
            terminate_workers(pool)
        raise
    finally:
        bar.close()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
    return report


def _order(work: Work) -> int:
    """Extending runs whose model is on disk (and evaluating them on task variants), then runs that
    wait for no choice (sweeps without a grid, the chosen points' other seeds), then screening, then
    the evaluations that train their run again first; the plan's order within each (the sort is
    stable)."""
    if work.kind in ("extend", "variant"):
        return 3 if work.restore else 0
    return {"seed": 1, "screen": 2}[work.kind]


def summary_lines(report: PlanReport, out: str | Path) -> list[str]:
    """Lines for the end of a plan's invocation."""
    ok = len(report.done) - len(report.failed)
    lines = [f"plan: {ok} pieces of work ok, {len(report.failed)} failed this time; {report.remaining} left"]
    lines += [f"  failed: {_describe(d)}" for d in report.failed]
    if report.remaining and not report.interrupted:
        lines.append("  (left: failed runs are kept as results; --retry-failed tries them again)")
    lines.append(f"results: {Path(out) / 'data'}")
    return lines
