"""Restoring a run folder whose weights are gone, so that the run can be evaluated at more lengths.

A board travels as its data files: ``model.pt`` is not committed (a fresh clone, a new machine),
so extending a published run there means training it again. Training is deterministic, so the
recorded config trained again is the same model; the rows it gives must agree with the recorded
ones by ``lengthgen verify``'s rule (bitwise on the same library versions, else within its
tolerance) before the folder is put in place. A run that does not reproduce is not restored:
lengths evaluated on another model would not be that run's.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.harness.verify import (
    compare,
    plugin_problem,
    published_runs,
    recorded_config,
    recorded_threads,
    rederive,
)


def restore_run(run_dir: Path, recorded: Path, device: str) -> str:
    """Retrain the run of ``run_dir`` from the rows in ``recorded`` (its data file) and put the
    folder in place, the recorded rows as its results; returns the warning that metrics were
    compared within the tolerance ("" when bitwise). A folder without ``model.pt`` at ``run_dir``
    (a training that stopped) is replaced. Raises a one-line ``UserError`` when it cannot."""
    run_id = run_dir.name
    published = published_runs(recorded).get(run_id)
    if published is None:
        raise UserError(f"cannot restore {run_id}: {recorded} holds no evaluated rows of it")
    config, problem = recorded_config(published)
    problem = problem or (plugin_problem(config) if config is not None else "")
    if config is None or problem:
        raise UserError(f"cannot restore {run_id}: {problem}")
    own = published[published["factor"] <= config.eval.max_factor].reset_index(drop=True)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".restore-{run_id}-", dir=run_dir.parent))
    try:
        new = rederive(config, [], scratch, device, recorded_threads(published))
        difference, warning = compare(own, new)
        if difference is not None:
            raise UserError(f"{run_id} trained again does not reproduce its recorded rows ({difference}); "
                            "its model is not restored")
        trained = scratch / run_id
        shutil.copyfile(recorded, trained / "results.parquet")
        if run_dir.exists():
            shutil.rmtree(run_dir)
        trained.rename(run_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return warning
