"""Which run a results row belongs to, and which code made it: the columns every writer of rows
fills the same way (a run, a sweep recording a run that died, ``lengthgen eval``).

A run's id is ``task-attn-pos-s<seed>-<hash8>`` (``run_id_of``; the hash is the config's own,
``config.config_hash_of`` of its recorded JSON) made safe as a folder name (``safe_name``): the
name of its run folder and of its sweep data file (``run_key``). A row made by a run or
``lengthgen eval`` also names the distribution that provided its backend (``backend_package``); a
row recorded for a run that died may not be able to.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Any

from lengthgen import provenance
from lengthgen.config import RunConfig

__all__ = ["backend_package", "made_now", "run_columns", "run_id_of", "run_key",
           "safe_name"]


def safe_name(text: str, max_length: int = 120) -> str:
    """A folder name for ``text``: no separators, never hidden, short enough for any filesystem.

    ``file.py:Class`` specs make run ids like ``./my/attn.py:Relu2-...``; a leading dot would hide
    the folder, and two long absolute paths could pass the 255-byte name limit, so long names keep
    their start plus a hash of the whole text (still unique).
    """
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).lstrip("._").rstrip("_")
    if len(name) > max_length:
        name = f"{name[: max_length - 9]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return name


def run_id_of(config: RunConfig, config_hash: str) -> str:
    """The run id (folder and data-file name) of a config recorded with this hash."""
    return safe_name(f"{config.task}-{config.attn}-{config.pos}-s{config.seed}-{config_hash[:8]}")


def run_key(config: RunConfig) -> str:
    """The run's folder and data-file name."""
    return run_id_of(config, config.config_hash())


def run_columns(config: RunConfig) -> dict[str, Any]:
    """The columns that name the run a row belongs to, from its config."""
    return {
        "run_id": run_key(config),
        "task": config.task,
        "attn": config.attn,
        "pos": config.pos,
        "seed": config.seed,
        "preset": config.preset,
        "train_length": config.train.train_length,
        "steps": config.train.steps,
        "selection": config.train.selection,
        "config_hash": config.config_hash(),
        "config_json": config.canonical_json(),
    }


def made_now() -> dict[str, Any]:
    """The columns that say which code made a row, and when: versions, provenance, ``created_at``."""
    import torch  # here, not at the top: the sweep and plan commands read names without it

    return {
        "lengthgen_version": provenance.VERSION,
        "torch_version": torch.__version__,
        **provenance.software(),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def backend_package(attn: str) -> str | None:
    """The installed distribution and version providing a backend (``lengthgen 0.1.0``), or the
    ``file.py:Class`` spec itself when no distribution provides it."""
    from lengthgen.attention import ATTENTION

    package = provenance.package_of(ATTENTION.get(attn))
    return package if package is not None else (attn if ":" in attn else None)
