"""One way to say that a fast kernel is unavailable and a slower exact path runs instead."""

from __future__ import annotations

import warnings

__all__ = ["KernelFallbackWarning", "warn_fallback"]


class KernelFallbackWarning(RuntimeWarning):
    """A fused kernel could not be used (missing package, no device support); results stay exact."""


_warned: set[str] = set()


def warn_fallback(kernel: str, reason: str, instead: str) -> None:
    """Warn that ``kernel`` is unavailable (``reason``), once per process and reason: numba missing
    switches off several kernels, and says so in one line."""
    if reason in _warned:
        return
    _warned.add(reason)
    warnings.warn(
        f"{kernel} unavailable ({reason}); using the slower {instead} instead",
        KernelFallbackWarning,
        stacklevel=3,
    )


def reset() -> None:
    """Forget which fallbacks were announced (for tests)."""
    _warned.clear()
