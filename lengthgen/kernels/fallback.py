"""One way to say that a fast kernel is unavailable and a slower exact path runs instead."""

from __future__ import annotations

import warnings

__all__ = ["KernelFallbackWarning", "warn_fallback"]


class KernelFallbackWarning(RuntimeWarning):
    """A fused kernel could not be used (missing package, no device support); results stay exact."""


_warned: set[str] = set()


def warn_fallback(kernel: str, reason: str, instead: str) -> None:
    """Warn once per process and kernel that ``kernel`` is unavailable (``reason``)."""
    if kernel in _warned:
        return
    _warned.add(kernel)
    warnings.warn(
        f"{kernel} unavailable ({reason}); using the slower {instead} instead",
        KernelFallbackWarning,
        stacklevel=3,
    )


def reset() -> None:
    """Forget which fallbacks were announced (for tests)."""
    _warned.clear()
