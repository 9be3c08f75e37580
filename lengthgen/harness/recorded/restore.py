"""Restoring a run folder whose weights are gone, so that the run can be evaluated at more lengths.

A board travels as its data files: ``model.pt`` is not committed (a fresh clone, a new machine),
so extending a published run there means training it again. Training is deterministic, so the
recorded config trained again is the same model; the rows it gives must agree with the recorded
ones by ``lengthgen verify``'s rule (bitwise on the same library versions, else within its
tolerance) before the folder is put in place. A run that does not reproduce is not restored:
lengths evaluated on another model would not be that run's. Used by a plan's extensions and by
``lengthgen eval --restore``.

The retraining runs in a scratch folder named after the run (``runs/.restore-RUN``), which outlives
an interruption: a restore stopped mid-training (a killed campaign, a closed laptop) resumes from
the training state saved there, as a stopped run does in its own folder.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.harness.recorded.saved import sweep_data_file
from lengthgen.harness.recorded.verify import (
    compare,
    plugin_problem,
    published_runs,
    recorded_config,
    recorded_threads,
    rederive,
)
from lengthgen.harness.weights import MODEL_FILE
from lengthgen.progress import Shown

#: The scratch folder of a restore is this prefix and the run's name, beside the run's folder.
SCRATCH_PREFIX = ".restore-"


def restore_run(run_dir: Path, recorded: Path, progress: Shown = False) -> str:
    """Retrain the run of ``run_dir`` from the rows in ``recorded`` (its data file) on the device
    and thread count they record, and put the folder in place, the recorded rows as its results;
    returns the warning that metrics were compared within the tolerance ("" when bitwise). A folder
    without ``model.pt`` at ``run_dir`` (a training that stopped) is replaced. Raises a one-line
    ``UserError`` when it cannot. A restore interrupted earlier resumes from its scratch folder's
    training state. ``progress``: the retraining's, as ``execute`` shows it."""
    run_id = run_dir.name
    published = published_runs(recorded).get(run_id)
    if published is None:
        raise UserError(f"cannot restore {run_id}: {recorded} holds no evaluated rows of it")
    config, problem = recorded_config(published)
    problem = problem or (plugin_problem(config) if config is not None else "")
    if config is None or problem:
        raise UserError(f"cannot restore {run_id}: {problem}")
    own = published[published["factor"] <= config.eval.max_factor].reset_index(drop=True)
    scratch = run_dir.parent / f"{SCRATCH_PREFIX}{run_id}"
    scratch.mkdir(parents=True, exist_ok=True)
    device = str(published["device"].iloc[0])
    # an interruption (or any error) keeps the scratch folder: the next attempt resumes from its state
    new = rederive(config, [], scratch, device, recorded_threads(published), progress)
    difference, warning = compare(own, new)
    if difference is not None:
        shutil.rmtree(scratch, ignore_errors=True)
        raise UserError(f"{run_id} trained again does not reproduce its recorded rows ({difference}); "
                        "its model is not restored")
    trained = scratch / run_id
    shutil.copyfile(recorded, trained / "results.parquet")
    if run_dir.exists():
        shutil.rmtree(run_dir)
    trained.rename(run_dir)
    shutil.rmtree(scratch, ignore_errors=True)
    return warning


def models_to_restore(path: Path) -> list[tuple[Path, Path]]:
    """(run folder, data file) of each run whose sweep's data records evaluated rows but whose
    ``model.pt`` is gone: ``path`` is a run folder of a sweep (``DIR/runs/RUN``, which need not
    exist) or the sweep folder."""
    if (path / "data").is_dir() and not (path / "config.json").is_file():
        candidates = [(path / "runs" / f.stem, f) for f in sorted((path / "data").glob("*.parquet"))]
    else:
        data = sweep_data_file(path)
        candidates = [(path, data)] if data is not None else []
    found = []
    for run_dir, data in candidates:
        if (run_dir / MODEL_FILE).is_file():
            continue
        try:
            if run_dir.name in published_runs(data):
                found.append((run_dir, data))
        except UserError:  # only failed rows: nothing to restore
            continue
    return found


def restore_models(path: Path, tell: Callable[[str], None] = print) -> None:
    """``lengthgen eval --restore``: restore every run under ``path`` whose model is gone
    (:func:`models_to_restore`), saying what it does through ``tell``."""
    for run_dir, data in models_to_restore(path):
        tell(f"restore {run_dir.name}: training it again from its recorded config")
        warning = restore_run(run_dir, data)
        tell(f"restore {run_dir.name}: its recorded rows reproduce"
             + (f" within the tolerance ({warning})" if warning else " exactly"))
