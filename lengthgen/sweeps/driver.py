"""The driver of a sweep: the runs not yet recorded, handed to a launcher, counted with one progress
bar; the counts survive a Ctrl-C for the summary."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lengthgen.choices import LAUNCHERS, Launcher
from lengthgen.config import RunConfig
from lengthgen.errors import UserError
from lengthgen.files import new_folder
from lengthgen.harness import devices
from lengthgen.harness.tracking import check_tracker
from lengthgen.progress import display
from lengthgen.sweeps.dataset import data_dir, plan
from lengthgen.sweeps.launch_local import launch_local
from lengthgen.sweeps.launch_ray import launch_ray
from lengthgen.sweeps.report import SweepReport
from lengthgen.sweeps.worker import RunOutcome

__all__ = ["LAUNCHERS", "Launcher", "check_environment", "check_jobs", "check_launcher",
           "run_sweep"]



def check_jobs(jobs: Any) -> None:
    """``jobs`` (runs at once): None for the launcher's default, else a whole number ≥ 1."""
    if jobs is not None and (isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1):
        raise UserError(f"jobs (--jobs) must be a whole number of at least 1, got {jobs!r}")


def check_launcher(launcher: Any) -> None:
    """A launcher this installation can start: one of :data:`LAUNCHERS`, Ray only where it is installed."""
    if launcher not in LAUNCHERS:
        raise UserError(f"unknown launcher {launcher!r}; valid launchers: {', '.join(LAUNCHERS)}")
    if launcher == "ray" and importlib.util.find_spec("ray") is None:
        raise UserError("--launcher ray needs Ray: pip install 'lengthgen[ray]'")


def check_environment(launcher: str, device: str, log: str | None) -> None:
    """Before a sweep starts: its device and tracker are usable where its runs execute. Local runs
    execute on this machine, which resolves the device; a Ray cluster's workers resolve it there,
    so here only its name is checked."""
    if launcher == "local":
        devices.check_environment(device, log)
    else:
        devices.check_device_name(device)
        check_tracker(log)


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
    check_launcher(launcher)
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
            launch_local(todo_plan.todo, root, device, jobs or 1, on_done, log, "log" if progress else False)
        else:
            launch_ray(todo_plan.todo, root, device, jobs, ray_address, on_done, log)
    except KeyboardInterrupt:
        report.interrupted = True
        raise
    finally:
        bar.close()
    return report
