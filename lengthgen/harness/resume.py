"""Training state on disk, so that a run stopped mid-training (Ctrl-C, a killed process, a machine
taken back) goes on from its last validation instead of from step 0.

Why: a width-256 copy run trains for hours on a CPU and a sitting ends when it ends; without this
every stop threw away the steps done. The state holds everything the remaining steps depend on
(weights, optimizer moments, the best checkpoint so far, the learning curve, the global RNG that
only plugins draw from); the data of every step derive from (seed, step), so a resumed run computes
bit for bit what an uninterrupted one does (``tests/test_resume.py``). Only a process with the
same config and the same provenance (code, versions, threads, instruction sets: what the rows
record) resumes; any other starts over, so a row never names code that trained only part of it.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lengthgen.config import RunConfig
from lengthgen.files import atomic_write
from lengthgen.harness.storage.identity import made_now

if TYPE_CHECKING:
    import torch

#: The state file in a run folder while the run trains; removed once ``model.pt`` is written.
STATE_FILE = "train_state.pt"


@dataclass
class TrainingProgress:
    """Where training stands after ``step`` steps."""

    step: int = 0
    seconds: float = 0.0  # training time spent before this process
    best_exact: float = -1.0
    best_step: int = 0
    best_state: dict[str, torch.Tensor] | None = None
    history: list[dict[str, float]] = field(default_factory=list)


def save_progress(path: Path, config: RunConfig, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, progress: TrainingProgress) -> None:
    """Write the state atomically: a stop while writing leaves the previous state intact."""
    import torch  # here, not at the top: sweep listings read STATE_FILE without loading torch

    state = {
        "config": config.model_dump(mode="json"),
        "made_by": _maker(),
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "progress": progress.__dict__,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }
    buffer = io.BytesIO()  # serialized first: a full disk is then an OSError of the write, as
    torch.save(state, buffer)  # for every other file, not an error inside torch's zip writer
    atomic_write(path, buffer.getvalue())


def load_progress(path: Path, config: RunConfig, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, device: torch.device) -> TrainingProgress | None:
    """Restore model, optimizer and RNG from ``path`` when it holds this config's state; None
    (start from step 0) when there is no such file or another config or provenance made it."""
    import torch

    state = _read(path, config, device)
    if state is None or state.get("made_by") != _maker():
        return None
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["rng"].cpu())
    if state["cuda_rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda_rng"]])
    return TrainingProgress(**state["progress"])


def saved_step(path: Path, config: RunConfig) -> int | None:
    """The step from which ``config``'s training resumes with the state at ``path``; None when the
    file holds no state of this config. For listings: the weights are mapped, not read, and the
    process check is left to the run (a listing does not know the thread count its runs get)."""
    import torch

    state = _read(path, config, torch.device("cpu"), mmap=True)
    return None if state is None else int(state["progress"]["step"])


def _read(path: Path, config: RunConfig, device: torch.device, mmap: bool = False) -> dict[str, Any] | None:
    """The state at ``path`` when it is readable and of ``config``."""
    import torch

    if not path.is_file():
        return None
    try:
        state: dict[str, Any] = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except Exception:  # unreadable (not written by this module): the steps are redone, nothing lost
        return None
    return state if state.get("config") == config.model_dump(mode="json") else None


def _maker() -> str:
    """The provenance columns of this process's rows, without the clock (as JSON text: the state is
    read back with ``weights_only``, which takes plain data only)."""
    columns = {key: value for key, value in made_now().items() if key != "created_at"}
    return json.dumps(columns, sort_keys=True, default=str)
