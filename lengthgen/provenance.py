"""Which code made a result row: the checkout's git commit, whether it had local changes, the
numerics version, and the versions of the libraries that compute.

The package version alone cannot say it: two rows both marked lengthgen 0.1.0 came from different
α-entmax training paths and differ from 2× on. So every row records the git commit of the checkout
lengthgen runs from (none when it is installed from a wheel), whether the package's tracked files
differed from that commit, and :data:`NUMERICS_VERSION`, which names the results a given code
produces and is bumped by hand whenever a change to a kernel, the model or the training path
changes them (``lengthgen verify`` uses it to say why two rows differ).
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

#: The package version (``lengthgen.__version__``), recorded in every row as ``lengthgen_version``.
VERSION = "0.1.0"

#: Bumped whenever a kernel, the model, the training loop or the evaluation changes any result.
#: 1: rows made before this column existed (the α-entmax training path before the numba row
#: solver, and everything older); 2: the numba Newton row solver in α-entmax training; 3: the
#: numba row kernels in stick-breaking training (``kernels/cpu/stickbreaking_rows.py``) and FoX's
#: bias gradient summed in float32 (``kernels/problem.py``).
NUMERICS_VERSION = 3

#: The result columns this module fills, in their order.
COLUMNS: tuple[str, ...] = ("numpy_version", "numba_version", "git_commit", "git_dirty", "numerics_version",
                            "torch_threads", "cpu", "cpu_isa", "attn_package")


#: Settings no configuration may give the git calls below: ``core.fsmonitor`` names a command
#: that ``git status`` runs (from ``GIT_CONFIG_*`` in the environment, or a folder's own config).
GIT_SETTINGS: tuple[str, ...] = ("-c", "core.fsmonitor=false")


def git_environment() -> dict[str, str]:
    """The environment of lengthgen's git calls: this process's, without any ``GIT_*`` variable
    (``GIT_CONFIG_COUNT``/``GIT_CONFIG_KEY_0`` can set any option, ``GIT_DIR`` another repository),
    so what the call reads and runs is not steered by what a parent process (or a plan) set."""
    return {k: v for k, v in os.environ.items() if not k.upper().startswith("GIT_")}


def git(folder: Path, *args: str) -> str | None:
    """``git -C folder ARGS`` with the settings above and the cleaned environment; its output, or
    None when git is missing or fails."""
    try:
        done = subprocess.run(["git", *GIT_SETTINGS, "-C", str(folder), *args], capture_output=True,
                              text=True, timeout=30, check=True, env=git_environment(),
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


#: What :func:`data_commit` says outside a git repository.
UNKNOWN_COMMIT = "unknown"


def data_commit(path: str | os.PathLike[str]) -> str:
    """The last git commit that touched ``path`` (its data), '+ uncommitted changes' when it has
    some; ``unknown`` outside a git repository. Committing a regenerated page does not change it."""
    target = Path(path)
    folder = target if target.is_dir() else target.parent
    commit = git(folder, "log", "-1", "--format=%h", "--", str(target.resolve()))
    dirty = git(folder, "status", "--porcelain", "--", str(target.resolve()))
    if commit is None or dirty is None:
        return UNKNOWN_COMMIT
    if not commit:
        return f"{UNKNOWN_COMMIT} (data not committed)"
    return f"{commit} + uncommitted changes" if dirty else commit


#: The checkout's own plugin distributions (the FoX and stick-breaking baselines, the example
#: plugin): their code makes rows as the package's does, so a change to it makes a row dirty too.
PLUGIN_FOLDERS = ("baselines", "examples")


@functools.cache
def checkout() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout the package runs from, dirty when the package or the
    checkout's plugin distributions have uncommitted changes; (None, None) outside one."""
    package = Path(__file__).resolve().parent
    top = git(package, "rev-parse", "--show-toplevel")
    if not top or not (Path(top) / "pyproject.toml").is_file():
        return None, None  # an installed copy, or a folder inside some other repository
    code = [package, *(p for p in (Path(top) / name for name in PLUGIN_FOLDERS) if p.is_dir())]
    commit = git(package, "rev-parse", "HEAD")
    status = git(package, "status", "--porcelain", "--untracked-files=no", "--", *map(str, code))
    return commit or None, None if status is None else bool(status)


def software() -> dict[str, Any]:
    """The provenance columns of a row made by this process now (the thread count can change, and
    a sum split over another number of threads may round differently)."""
    import torch

    return {**_libraries(), "torch_threads": torch.get_num_threads(), "cpu": cpu(), "cpu_isa": cpu_isa()}


@functools.cache
def _libraries() -> dict[str, Any]:
    import numpy

    try:
        import numba

        numba_version: str | None = numba.__version__
    except ImportError:
        numba_version = None
    commit, dirty = checkout()
    return {"numpy_version": numpy.__version__, "numba_version": numba_version, "git_commit": commit,
            "git_dirty": dirty, "numerics_version": NUMERICS_VERSION}


@functools.cache
def cpu() -> str:
    """The processor's model name (another processor may pick other BLAS kernels, which round
    differently), with the architecture."""
    import platform

    name = ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    return " ".join(part for part in (platform.machine(), name or platform.processor()) if part)


@functools.cache
def cpu_isa() -> str:
    """The instruction sets the CPU kernels were built for in this process: torch's vector
    capability (its own kernels; MKL and oneDNN pick theirs alike) and numba's compile target.
    Two machines with the same model name can differ here (a VM that shows AVX-512 or not), and
    their trainings then round differently from the first step on."""
    import torch

    try:
        import llvmlite.binding as llvm
        from numba.core import config

        target = config.CPU_NAME or llvm.get_host_cpu_name()
    except ImportError:
        target = "none"
    return f"torch {torch.backends.cpu.get_cpu_capability()}, numba {target}"


@functools.cache
def _distributions() -> dict[str, list[str]]:
    from importlib import metadata

    return metadata.packages_distributions()


def package_of(obj: object) -> str | None:
    """``"distribution version"`` of the installed distribution whose top-level package defines
    ``obj`` (``lengthgen 0.1.0``, ``lengthgen-example-plugin 0.1.0``); None for code that no
    installed distribution provides (a ``file.py:Class`` plugin)."""
    from importlib import metadata

    top = str(getattr(obj, "__module__", "") or "").split(".")[0]
    names = sorted(set(_distributions().get(top, [])))
    if not names:
        return None
    try:
        return f"{names[0]} {metadata.version(names[0])}"
    except metadata.PackageNotFoundError:
        return None

