"""Where a run computes: the one check that turns a device name into a ``torch.device``.

The name is checked once, where the user's input enters (the command line, the Python API), and
the resolved ``torch.device`` is handed inward: every function below that takes a device accepts
either, and passes a resolved one through untouched. A sweep's worker processes resolve the name
themselves, since whether CUDA is there is a property of the process that runs. Importing this
module does not load torch (a plan pins its numerics before torch loads; see ``plans.numerics``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from lengthgen.choices import DEVICES
from lengthgen.errors import UserError

if TYPE_CHECKING:
    import torch

__all__ = ["DEVICES", "check_device_name", "check_environment", "resolve_device"]


def check_device_name(device: object) -> str:
    """``device`` if it is one of :data:`DEVICES`, else a one-line ``UserError`` naming them."""
    if not isinstance(device, str) or device not in DEVICES:
        raise UserError(f"unknown device {device!r}; valid devices: {', '.join(DEVICES)}")
    return device


def resolve_device(device: str | torch.device) -> torch.device:
    """The torch device for a name (``auto``: CUDA when available, else the CPU); CUDA asked for
    where there is none is a one-line ``UserError``. A ``torch.device`` is returned as it is."""
    import torch

    if isinstance(device, torch.device):
        return device
    name = check_device_name(device)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested but CUDA is not available; valid devices here: auto, cpu")
    return torch.device(name)


def check_environment(device: str | torch.device, log: str | None) -> torch.device:
    """What a command whose runs execute in this process checks before any work: the device,
    resolved, and the package of the tracker ``log`` names. (Runs that execute elsewhere, on a
    Ray cluster, resolve their device there.)"""
    from lengthgen.harness.tracking import check_tracker

    where = resolve_device(device)
    check_tracker(log)
    return where
