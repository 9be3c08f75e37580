"""Sweeps: a grid of runs whose results survive crashes and resume where they stopped.

Layout under the sweep folder ``DIR``:

- ``DIR/data/<run_id>.parquet`` — the results dataset, one file per finished run, written with
  temp file + rename, so a run's rows appear all at once or not at all. A hard kill loses at most
  the runs in progress; readers ignore the dot-prefixed temp files a kill may leave behind.
- ``DIR/runs/<run_id>/`` — that run's artifacts (config, model, its own results, plot).

Whether a run is done is read from its data file alone, so re-running the same command skips
finished runs (and failed ones unless asked to retry) and redoes the rest. One module per job:
``grid`` (the runs a sweep names), ``dataset`` (where the sweep stands), ``worker`` (one run,
recorded), ``launch_local`` and ``launch_ray`` (where runs execute; both call the same worker, so
both write the same dataset), ``driver`` (the runs to do, to a launcher, counted), ``parsing`` (the
command line's lists), ``signals`` (SIGTERM as Ctrl-C) and ``report`` (the counts and the closing
lines). The
names below are the sweep API the command line, the Python API and plans use.
"""

from lengthgen.files import new_folder  # a sweep's folders are made with it; callers import it from here
from lengthgen.sweeps.dataset import (
    Plan,
    RunState,
    data_dir,
    data_path,
    kept_factors,
    plan,
    record_if_missing,
    resume_step,
    run_key,
    run_path,
    run_state,
)
from lengthgen.sweeps.driver import (
    LAUNCHERS,
    Launcher,
    check_environment,
    check_jobs,
    check_launcher,
    run_sweep,
)
from lengthgen.sweeps.grid import SweepSpec, shard_of, validate_spec
from lengthgen.sweeps.launch_local import launch_local, terminate_workers
from lengthgen.sweeps.launch_ray import launch_ray
from lengthgen.sweeps.parsing import parse_choices, parse_list, parse_seeds, spec_from_flags, split_settings
from lengthgen.sweeps.report import SweepReport, summarize
from lengthgen.sweeps.signals import SweepTerminated, sigterm_stops_cleanly
from lengthgen.sweeps.worker import RunOutcome, failed_frame, outcome_of, run_one

__all__ = [
    "LAUNCHERS", "Launcher", "Plan", "RunOutcome", "RunState", "SweepReport", "SweepSpec", "SweepTerminated",
    "check_environment", "check_jobs", "check_launcher", "data_dir", "data_path", "failed_frame",
    "kept_factors", "launch_local", "launch_ray",
    "new_folder", "outcome_of", "parse_choices", "parse_list", "parse_seeds", "plan", "record_if_missing",
    "resume_step", "run_key", "run_one", "run_path", "run_state", "run_sweep", "shard_of",
    "sigterm_stops_cleanly", "spec_from_flags", "split_settings", "summarize", "terminate_workers",
    "validate_spec",
]
