"""The words a few settings take, each set stated once: devices, checkpoint selections, number
formats, sweep launchers and experiment trackers.

Why here, importing nothing: the command line offers these sets as its choices (click checks them
and lists them in the help) before any command runs, and must not load torch or pandas to do so;
the library checks a name given from Python against the same tuple (``harness.devices``,
``config``, ``sweeps.driver``, ``harness.tracking``), so the two can never disagree.
"""

from __future__ import annotations

from typing import Literal, get_args

#: Where a run computes (``auto``: CUDA when available, else the CPU).
Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = get_args(Device)
#: Which checkpoint a run keeps: best in-distribution validation, or the paper's at 8x.
Selection = Literal["id", "8x"]
SELECTIONS: tuple[str, ...] = get_args(Selection)
#: The number format of a model's weights and activations while training (bf16: autocast) or
#: evaluating (bf16: the weights cast); attention scores and normalizers are fp32 in both
#: (``lengthgen/functional/precision.py``).
Precision = Literal["fp32", "bf16"]
PRECISIONS: tuple[str, ...] = get_args(Precision)
#: Where a sweep's runs execute.
Launcher = Literal["local", "ray"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)
#: Where a run streams its learning curve and per-length results.
TrackerName = Literal["tensorboard", "wandb"]
TRACKERS: tuple[str, ...] = get_args(TrackerName)
