"""``lengthgen sweep --plan FILE``: a plan's missing work listed (``--dry-run``) or done.

The command line parses the flags and prints; this is the command. Its order matters: the plan's
numerics pins are set before torch loads, and checking the device loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.files import new_folder
from lengthgen.harness.devices import resolve_device
from lengthgen.paths import folder_for_writing
from lengthgen.plans import listing
from lengthgen.plans.estimate import Timings
from lengthgen.plans.execute import Echo, PlanReport, run_plan, summary_lines
from lengthgen.plans.numerics import pin_numerics
from lengthgen.plans.plan import ablations_dir, load_plan, survey, timings_dirs
from lengthgen.sweeps import data_dir

__all__ = ["interrupted_line", "refuse_grid_flags", "sweep_plan"]


def refuse_grid_flags(flags: Mapping[str, object]) -> None:
    """The plan sets the grid: every flag that would set some of it (flag → its value, None or
    empty when not given) must be left out beside ``--plan``."""
    given = [flag for flag, value in flags.items() if value]
    if given:
        raise UserError(f"--plan sets the grid itself; drop {', '.join(given)} (the plan file holds every "
                        "setting; with --plan: --out, --jobs, --device, --retry-failed, --dry-run, --quiet)")


def sweep_plan(plan_file: str, out: str, *, jobs: int = 1, device: str = "auto", retry_failed: bool = False,
               dry_run: bool = False, progress: bool = True, say: Echo = print, tell: Echo = print,
               report: PlanReport | None = None) -> PlanReport | None:
    """List (``dry_run``: through ``say``) or do the plan's missing work under ``out``; what it is
    doing goes to ``tell``. ``report`` keeps the counts when a Ctrl-C propagates."""
    plan = load_plan(plan_file)
    if dry_run:
        states = survey(plan, out, retry_failed=retry_failed)
        timings = Timings.from_folders(Path(out), ablations_dir(plan, plan_file, out),
                                       *timings_dirs(plan, plan_file))
        for line in listing.dry_run_lines(states, timings):
            say(line)
        return None
    pinned = pin_numerics(plan.numerics)  # before torch loads (the device check loads it)
    if pinned:
        tell(pinned)
    resolve_device(device)  # here; the pool's processes resolve the name again for themselves
    out_dir = folder_for_writing(out, "--out")
    tell(f"plan {plan_file}: {len(plan.sweep)} sweeps -> {out}")
    report = report if report is not None else PlanReport()
    with new_folder(data_dir(out_dir)):
        run_plan(plan, out_dir, jobs=jobs, device=device, retry_failed=retry_failed,
                 echo=tell if progress else None, progress=progress, report=report)
    for line in summary_lines(report, out):
        tell(line)
    return report


def interrupted_line(report: PlanReport) -> str:
    """What a plan stopped by Ctrl-C or SIGTERM says last."""
    return (f"interrupted: {report.remaining} pieces of work left; run the same command again "
            "to resume")
