"""Model weights on disk, each file saved with the config it belongs to: the selected model
(``model.pt``) and, when ``train.keep_every`` asks for them, the weights every so many steps
(``checkpoints/step-N.pt``).

Why keep more than the selected weights: which checkpoint a protocol keeps can decide a long-length
score, and a rule that validates at a length where the checkpoints all score alike cannot tell them
apart. Kept checkpoints let ``lengthgen eval --checkpoint N`` measure any of them without training
again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from lengthgen.config import RunConfig
from lengthgen.files import atomic_write

if TYPE_CHECKING:
    import torch

#: The selected weights of a run folder.
MODEL_FILE = "model.pt"
#: The folder of a run folder that holds the kept checkpoints.
CHECKPOINTS = "checkpoints"

_STEP_FILE = re.compile(r"step-([1-9][0-9]*)\.pt")


def save_weights(model: torch.nn.Module, config: RunConfig, path: Path) -> None:
    """The model's weights with the config they belong to, written atomically."""
    import torch  # here, not at the top: plans read the file names without loading torch

    state = {"config": config.model_dump(mode="json"), "state_dict": model.state_dict()}
    atomic_write(path, lambda handle: torch.save(state, handle))


def checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where a run keeps its weights after ``step`` steps."""
    return run_dir / CHECKPOINTS / f"step-{step}.pt"


def kept_steps(run_dir: Path) -> list[int]:
    """The steps whose weights ``run_dir`` keeps, in order."""
    folder = run_dir / CHECKPOINTS
    found = (_STEP_FILE.fullmatch(p.name) for p in folder.iterdir()) if folder.is_dir() else ()
    return sorted(int(m.group(1)) for m in found if m)
