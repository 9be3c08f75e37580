"""Attention backends: the interface plugins implement, the registry, and every built-in backend.

A built-in backend is an ``AttentionBackend`` subclass decorated with ``@register_attention()`` in a
module of this package (``softmax_family``, ``entmax_family``): the registry imports every module
here on its first lookup. Plugins add backends through the ``lengthgen.attention`` entry-point
group (``lengthgen.registry``). The interface is ``backend``, the position-scheme lookup
``positions``; a backend computes through the engine of ``lengthgen.kernels`` and the definitions
of ``lengthgen.functional`` (the layers: ``docs/architecture.md``).
"""

from __future__ import annotations

import inspect

from lengthgen.registry import Registry


def validate_backend(obj: object) -> None:
    """A ``TypeError`` saying why ``obj`` cannot be registered as a backend (nothing when it can)."""
    from lengthgen.attention.backend import AttentionBackend

    if not (inspect.isclass(obj) and issubclass(obj, AttentionBackend)):
        raise TypeError(f"{obj!r} is not a subclass of lengthgen.attention.AttentionBackend")
    if inspect.isabstract(obj):
        raise TypeError(
            f"backend class {obj.__name__} is abstract (missing {sorted(obj.__abstractmethods__)})"
        )
    for attr in ("name", "description"):
        if not isinstance(getattr(obj, attr, None), str):
            raise TypeError(f"backend class {obj.__name__} has no string attribute {attr!r}")


ATTENTION: Registry = Registry(
    "attention backend", "lengthgen.attention", validate=validate_backend, builtins=__name__
)
register_attention = ATTENTION.register


def __getattr__(name: str) -> object:
    # Re-export the public API lazily so importing the registry stays light.
    if name in ("AttentionBackend", "BackendOptions", "LayerSpec", "AttentionStats"):
        from lengthgen.attention import backend

        return getattr(backend, name)
    raise AttributeError(name)
