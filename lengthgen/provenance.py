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
import subprocess
from pathlib import Path
from typing import Any

#: The package version (``lengthgen.__version__``), recorded in every row as ``lengthgen_version``.
VERSION = "0.1.0"

#: Bumped whenever a kernel, the model, the training loop or the evaluation changes any result.
#: 1: rows made before this column existed (the α-entmax training path before the numba row
#: solver, and everything older); 2: the numba Newton row solver in α-entmax training.
NUMERICS_VERSION = 2

#: The result columns this module fills, in their order.
COLUMNS: tuple[str, ...] = ("numpy_version", "numba_version", "git_commit", "git_dirty", "numerics_version",
                            "torch_threads", "cpu", "cpu_isa", "attn_package")


def _git(folder: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30,
                              check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


@functools.cache
def checkout() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git checkout the package runs from; (None, None) outside one."""
    package = Path(__file__).resolve().parent
    top = _git(package, "rev-parse", "--show-toplevel")
    if not top or not (Path(top) / "pyproject.toml").is_file():
        return None, None  # an installed copy, or a folder inside some other repository
    commit = _git(package, "rev-parse", "HEAD")
    status = _git(package, "status", "--porcelain", "--untracked-files=no", "--", str(package))
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

