"""Attention backends: the interface plugins implement, the registry, and every built-in backend.

Layout (each layer imports only the ones below it; ``tests/test_layout.py`` enforces it):

* ``lengthgen.attention`` — this registry (entry-point group ``lengthgen.attention``), the backend
  interface (``backend``), the position-scheme lookup (``positions``) and the built-in backends,
  one file per family: ``softmax_family`` (softmax, ssmax, adaptive_temperature, topk) and
  ``entmax_family`` (entmax, sparsemax, asentmax);
* ``lengthgen.kernels`` — execution only: the one attention engine and its paths;
* ``lengthgen.functional`` — pure math (α-entmax, position schemes, query scales), torch only.
"""

from __future__ import annotations

import inspect

from lengthgen.registry import Registry


def _validate_backend(obj: object) -> None:
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


def _load_builtins() -> None:
    # The family modules list their classes; registering them here keeps those modules free of
    # any import of this package (no cycle between the registry and the backends).
    from lengthgen.attention.entmax_family import BACKENDS as ENTMAX_BACKENDS
    from lengthgen.attention.softmax_family import BACKENDS as SOFTMAX_BACKENDS

    for cls in (*SOFTMAX_BACKENDS, *ENTMAX_BACKENDS):
        ATTENTION.add(cls.name, cls, builtin=True)


ATTENTION: Registry = Registry(
    "attention backend", "lengthgen.attention", validate=_validate_backend, builtin_loader=_load_builtins
)
register_attention = ATTENTION.register


def __getattr__(name: str) -> object:
    # Re-export the public API lazily so importing the registry stays light and cycle-free.
    if name in ("AttentionBackend", "BackendOptions", "LayerSpec", "AttentionStats"):
        from lengthgen.attention import backend

        return getattr(backend, name)
    raise AttributeError(name)
