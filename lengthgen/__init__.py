"""lengthgen: does my attention variant still work at 1000x the training length?

In a notebook::

    import lengthgen
    rows = lengthgen.run(task="max_retrieval", attn="asentmax")   # a pandas DataFrame

``run``, ``sweep``, ``evaluate`` and ``load_results`` live in ``lengthgen.notebook`` and are
imported on first use, so ``import lengthgen`` (and the command line) stays fast.
"""

from __future__ import annotations

from typing import Any

from lengthgen.provenance import VERSION as __version__

_NOTEBOOK_API = ("run", "sweep", "evaluate", "load_results")
__all__ = ["__version__", *_NOTEBOOK_API]


def __getattr__(name: str) -> Any:
    if name in _NOTEBOOK_API:
        from lengthgen import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'lengthgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_NOTEBOOK_API])
