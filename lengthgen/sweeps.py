"""Sweeps: a grid of runs whose results survive crashes and resume where they stopped.

Layout under the sweep folder ``DIR``:

- ``DIR/data/<run_id>.parquet`` — the results dataset, one file per finished run, written with
  temp file + rename, so a run's rows appear all at once or not at all. A hard kill loses at most
  the runs in progress; readers ignore the dot-prefixed temp files a kill may leave behind.
- ``DIR/runs/<run_id>/`` — that run's artifacts (config, model, its own results, plot).

Whether a run is done is read from its data file alone, so re-running the same command skips
finished runs (and failed ones unless asked to retry) and redoes the rest. The same worker
function serves the local and the Ray launcher, so both produce the same dataset.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from lengthgen import limits, provenance
from lengthgen.config import RunConfig, build_run_config, combine_overrides, flag_overrides, parse_value
from lengthgen.errors import UserError
from lengthgen.files import new_folder
from lengthgen.progress import display

Launcher = Literal["local", "ray"]
RunState = Literal["ok", "failed", "missing"]


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
        """One config per grid point, in a stable order (task, backend, position, setting, seed),
        each built by ``build_run_config`` exactly as ``lengthgen run`` builds it, so a run has the
        same id whether it came from ``run`` or from a sweep."""
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


# -- the dataset ----------------------------------------------------------------------------------
def run_key(config: RunConfig) -> str:
    """The run's folder and data-file name (the harness's sanitized run id)."""
    from lengthgen.harness.run import safe_name

    return safe_name(config.run_id())


def data_dir(out: str | os.PathLike[str]) -> Path:
    return Path(out) / "data"


def data_path(out: str | os.PathLike[str], key: str) -> Path:
    return data_dir(out) / f"{key}.parquet"


def run_state(path: Path) -> RunState:
    """``ok`` when every row of the data file is ok, ``failed`` when any is not, ``missing`` when
    there is no readable file (an unreadable one is redone, and overwritten, like a missing one)."""
    if not path.is_file():
        return "missing"
    try:
        status = pd.read_parquet(path, columns=["status"])["status"]
    except Exception:
        return "missing"
    if status.empty:
        return "missing"
    return "ok" if (status == "ok").all() else "failed"


@dataclass
class Plan:
    todo: list[RunConfig]
    done_ok: list[str]
    done_failed: list[str]


def plan(configs: Sequence[RunConfig], out: str | os.PathLike[str], retry_failed: bool = False) -> Plan:
    """Split the grid into runs to do and runs already recorded."""
    result = Plan([], [], [])
    for config in configs:
        key = run_key(config)
        state = run_state(data_path(out, key))
        if state == "ok":
            result.done_ok.append(key)
        elif state == "failed" and not retry_failed:
            result.done_failed.append(key)
        else:
            result.todo.append(config)
    return result


def failed_frame(config: RunConfig, exc: BaseException | str) -> pd.DataFrame:
    """A one-row ``failed`` record for a run that died outside the harness's own error handling."""
    import lengthgen
    from lengthgen.harness.results import rows_to_frame

    error = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
    return rows_to_frame([{
        "run_id": run_key(config), "task": config.task, "attn": config.attn, "pos": config.pos,
        "seed": config.seed, "preset": config.preset, "train_length": config.train.train_length,
        "steps": config.train.steps, "selection": config.train.selection,
        "lengthgen_version": lengthgen.__version__, **provenance.software(),
        "config_hash": config.config_hash(), "config_json": config.canonical_json(), "status": "failed",
        "error": (error.splitlines() or ["unknown error"])[0],
    }])


@dataclass(frozen=True)
class RunOutcome:
    """What the driver needs to know about a finished run (small, so cheap to ship from Ray)."""

    key: str
    status: str
    error: str | None
    seconds: float


def outcome_of(key: str, frame: pd.DataFrame, seconds: float) -> RunOutcome:
    bad = frame[frame["status"] != "ok"]
    if bad.empty:
        return RunOutcome(key, "ok", None, seconds)
    return RunOutcome(key, "failed", str(bad["error"].iloc[0]), seconds)


def run_one(config: RunConfig, out: str, device: str = "auto", threads: int | None = None,
            cwd: str | None = None, log: str | None = None) -> tuple[RunOutcome, pd.DataFrame]:
    """Execute one run and record it in the dataset; never raises for a failing run (only for a
    file system that cannot take its results: no space, no permission, and for a
    :class:`~lengthgen.errors.UserError` that every run would meet, such as a tracker that cannot
    start). The data file mirrors the run's ``results.parquet``, written under the run's lock, so
    rows that ``lengthgen eval`` added meanwhile are kept.

    Runs in the driver (local, jobs=1), in a pool process (local, jobs>1) or in a Ray worker.
    ``cwd`` lets a worker resolve relative ``file.py:Class`` plugin specs like the driver did.
    """
    from lengthgen.harness.run import execute, record_failure
    from lengthgen.harness.store import current_rows, run_lock, save_rows

    if cwd and os.path.isdir(cwd) and os.getcwd() != cwd:
        os.chdir(cwd)
    if threads:
        import torch

        torch.set_num_threads(threads)
    key = run_key(config)
    run_dir = Path(out) / "runs" / key
    start = time.perf_counter()
    try:
        frame = execute(config, Path(out) / "runs", device_name=device, progress=False, log=log)
        recorded: Path | None = run_dir / "results.parquet"
    except (OSError, UserError):
        raise
    except Exception as exc:  # the harness records its own failures; this catches the rest
        record_failure(run_dir, exc)
        frame, recorded = failed_frame(config, exc), None
    with run_lock(run_dir):
        rows = current_rows(recorded) if recorded is not None else None
        save_rows(data_path(out, key), frame if rows is None or rows.empty else rows, replace_variant="")
    return outcome_of(key, frame, time.perf_counter() - start), frame


def _pool_worker(config: RunConfig, out: str, device: str, threads: int | None, cwd: str,
                 log: str | None) -> RunOutcome:
    return run_one(config, out, device, threads, cwd, log)[0]


# -- launchers ------------------------------------------------------------------------------------
OnDone = Callable[[RunOutcome], None]


def launch_local(todo: Sequence[RunConfig], out: str, device: str, jobs: int, on_done: OnDone,
                 log: str | None = None) -> None:
    """In this process (jobs = 1) or in a pool of ``jobs`` processes sharing the cores."""
    if jobs <= 1:
        for config in todo:
            on_done(run_one(config, out, device, log=log)[0])
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, (os.cpu_count() or 1) // jobs)
    pool = ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn"))
    try:
        futures = {pool.submit(_pool_worker, c, out, device, threads, os.getcwd(), log): c
                   for c in todo}
        for future in as_completed(futures):
            try:
                outcome = future.result()
            except UserError:  # the same for every run (a tracker that cannot start): stop
                raise
            except Exception as exc:  # the worker process died (killed, out of memory)
                config = futures[future]
                frame = failed_frame(config, f"worker died: {type(exc).__name__}: {exc}")
                record_if_missing(config, out, frame)
                outcome = outcome_of(run_key(config), frame, 0.0)
            on_done(outcome)
    except BaseException:  # Ctrl-C: stop the runs in progress now, not after they finish
        terminate_workers(pool)
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def terminate_workers(pool: Any) -> None:
    """Stop a process pool's workers now (Ctrl-C), not after their runs finish; the pool has no
    public way to do it."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


def record_if_missing(config: RunConfig, out: str, frame: pd.DataFrame) -> None:
    """Write ``frame`` as the run's data file unless the run recorded one itself."""
    from lengthgen.harness.results import write_parquet_atomic

    path = data_path(out, run_key(config))
    if run_state(path) == "missing":
        write_parquet_atomic(frame, path)


def _ray_task(config: RunConfig, out: str, device: str, threads: int | None,
              cwd: str, log: str | None) -> tuple[RunOutcome, pd.DataFrame]:
    return run_one(config, out, device, threads, cwd, log)


def launch_ray(todo: Sequence[RunConfig], out: str, device: str, jobs: int | None, address: str | None,
               on_done: OnDone, log: str | None = None) -> None:
    """One Ray task per run: one GPU each where the cluster has GPUs, else CPUs.

    Connects to ``address`` (or a cluster this process already joined), otherwise starts a local
    instance with ``jobs`` CPUs. Each task writes its own data file; the driver writes it from the
    returned rows too when the worker's file is not visible here (nodes without a shared disk).
    """
    try:
        import ray
    except ImportError:
        raise UserError("--launcher ray needs Ray: pip install 'lengthgen[ray]'") from None
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False)
        started = True
    try:
        resources = ray.cluster_resources()
        if resources.get("GPU", 0) >= 1 and device != "cpu":
            options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1}
            threads = None
        else:
            cpus = int(resources.get("CPU", 1))
            per_run = max(1, cpus // jobs) if jobs else 1
            options, threads = {"num_cpus": per_run}, per_run
        remote = ray.remote(_ray_task).options(**options)
        cwd = os.getcwd()
        pending = {remote.remote(c, out, device, threads, cwd, log): c for c in todo}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    config = pending.pop(ref)
                    try:
                        outcome, frame = ray.get(ref)
                        record_if_missing(config, out, frame)
                    except Exception as exc:  # the task or its worker died (crash, node loss, OOM kill)
                        cause = getattr(exc, "cause", exc)
                        if isinstance(cause, UserError):  # the same for every run: stop
                            raise UserError(str(cause)) from None
                        frame = failed_frame(config, f"ray task died: {type(exc).__name__}: {exc}")
                        record_if_missing(config, out, frame)
                        outcome = outcome_of(run_key(config), frame, 0.0)
                    on_done(outcome)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()


# -- the driver -----------------------------------------------------------------------------------
@dataclass
class SweepReport:
    total: int
    skipped_ok: int
    skipped_failed: int
    ok: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    interrupted: bool = False

    @property
    def remaining(self) -> int:
        return self.total - self.skipped_ok - self.skipped_failed - len(self.ok) - len(self.failed)


def run_sweep(
    configs: Sequence[RunConfig],
    out: str | os.PathLike[str],
    *,
    launcher: Launcher = "local",
    device: str = "auto",
    jobs: int | None = None,
    ray_address: str | None = None,
    retry_failed: bool = False,
    progress: bool = True,
    report: SweepReport | None = None,
    log: str | None = None,
) -> SweepReport:
    """Run every config of the grid not yet recorded under ``out``; one progress bar with ETA.

    Pass ``report`` to keep the partial counts when a Ctrl-C (KeyboardInterrupt) propagates;
    ``log`` names a tracker for every run (``tensorboard``, ``wandb``).
    """
    check_jobs(jobs)
    root = str(Path(out).resolve())
    with new_folder(data_dir(root)):
        return _run_sweep(configs, root, launcher, device, jobs, ray_address, retry_failed, progress,
                          report, log)


def _run_sweep(configs: Sequence[RunConfig], root: str, launcher: Launcher, device: str, jobs: int | None,
               ray_address: str | None, retry_failed: bool, progress: bool, report: SweepReport | None,
               log: str | None) -> SweepReport:
    todo_plan = plan(configs, root, retry_failed=retry_failed)
    if report is None:
        report = SweepReport(len(configs), len(todo_plan.done_ok), len(todo_plan.done_failed))
    else:
        report.total, report.skipped_ok = len(configs), len(todo_plan.done_ok)
        report.skipped_failed = len(todo_plan.done_failed)
    done_before = report.skipped_ok + report.skipped_failed
    bar = display(len(configs), "sweep", enabled=progress, unit="runs", initial=done_before)

    def on_done(outcome: RunOutcome) -> None:
        if outcome.status == "ok":
            report.ok.append(outcome.key)
        else:
            report.failed.append((outcome.key, outcome.error or "unknown error"))
            bar.write(f"failed: {outcome.key}: {outcome.error}")
        bar.set_postfix(ok=len(report.ok), failed=len(report.failed), refresh=False)
        bar.update(1)

    try:
        if launcher == "local":
            launch_local(todo_plan.todo, root, device, jobs or 1, on_done, log)
        elif launcher == "ray":
            launch_ray(todo_plan.todo, root, device, jobs, ray_address, on_done, log)
        else:
            raise UserError(f"unknown launcher {launcher!r}; valid launchers: local, ray")
    except KeyboardInterrupt:
        report.interrupted = True
        raise
    finally:
        bar.close()
    return report


def check_jobs(jobs: Any) -> None:
    """``jobs`` (runs at once): None for the launcher's default, else a whole number ≥ 1."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserError(f"jobs (--jobs) must be a whole number of at least 1, got {jobs!r}")


def parse_list(text: str, what: str) -> tuple[str, ...]:
    """``a,b , c`` → ('a', 'b', 'c'); empty items are an error, not silently dropped."""
    items = tuple(item.strip() for item in text.split(","))
    if not text.strip() or any(not item for item in items):
        raise UserError(f"bad {what} list {text!r}: expected comma-separated names")
    return items


def parse_seeds(text: str) -> tuple[int, ...]:
    """``0,1,2`` or a range ``0-4`` (inclusive), or a mix: ``0,2,5-7``; at most ``MAX_SEEDS``
    seeds, counted before a range is expanded."""
    seeds: list[int] = []
    for item in parse_list(text, "seed"):
        lo, dash, hi = item.partition("-")
        try:
            first, last = (int(lo), int(hi)) if dash else (int(item), int(item))
        except ValueError:
            raise UserError(f"bad seed {item!r} in --seeds {text!r}: expected integers like 0,1,2 or 0-4") \
                from None
        limits.check_seed(first)
        limits.check_seed(last)
        if last < first:
            raise UserError(f"bad seed range {item!r} in --seeds {text!r}: the end is before the start")
        limits.check_at_most("number of seeds", len(seeds) + last - first + 1, limits.MAX_SEEDS)
        seeds.extend(range(first, last + 1))
    return tuple(seeds)


def parse_choices(raw: str) -> tuple[Any, ...]:
    """The values a sweep's ``--set`` gives one field: ``5e-4,1e-3`` → (0.0005, 0.001). Each value
    reads as ``lengthgen run`` reads one (``config.parse_value``); a comma inside a JSON list or
    object does not split it (``[0.9,0.99],[0.9,0.999]`` is two values), text splits at every
    comma (``id,8x``)."""
    try:
        values = json.loads(f"[{raw}]", parse_constant=_refuse_constant)
    except ValueError:
        items = [item.strip() for item in raw.split(",")]
        if any(not item for item in items):
            raise UserError(f"bad --set value {raw!r}: an empty item in a comma-separated list") from None
        values = [parse_value(item) for item in items]
    if not values:
        raise UserError("--set needs a value after '='")
    return tuple(values)


def _refuse_constant(constant: str) -> Any:
    raise ValueError(constant)  # NaN, Infinity: left as text, which the config then refuses


def split_settings(choices: dict[str, tuple[Any, ...]]) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]]]:
    """``--set`` fields with one value (shared settings) apart from those with several (the grid)."""
    shared = {key: values[0] for key, values in choices.items() if len(values) == 1}
    return shared, {key: values for key, values in choices.items() if len(values) > 1}


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


class SweepTerminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``scancel``, a scheduler's preemption) taking the Ctrl-C path.

    A background job started by a non-interactive shell ignores SIGINT, and batch schedulers stop
    jobs with SIGTERM; both should stop a sweep as cleanly as Ctrl-C does.
    """


@contextmanager
def sigterm_stops_cleanly() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`SweepTerminated` (main thread only)."""

    def handler(signum: int, frame: object) -> None:
        raise SweepTerminated()

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def summarize(report: SweepReport, out: str | os.PathLike[str]) -> Iterable[str]:
    """Lines for the end of a sweep (also after Ctrl-C)."""
    yield (f"sweep: {len(report.ok)} ok, {len(report.failed)} failed this time; "
           f"{report.skipped_ok + report.skipped_failed} already recorded "
           f"({report.skipped_failed} failed, skipped: use --retry-failed to redo); "
           f"{report.total} in the grid")
    for key, error in report.failed:
        yield f"  failed: {key}: {error}"
    if report.interrupted:
        yield (f"interrupted: {report.remaining} runs not recorded; run the same command again to resume")
    yield f"results: {Path(out) / 'data'}"
