"""Attention machinery: position schemes, query scales, normalizers and execution paths.

Backends live in one registry (entry-point group ``lengthgen.attention``). The baselines are in
``lengthgen.baselines``; ASEntmax and the α-entmax family in ``lengthgen.attention.asentmax`` and
``lengthgen.attention.entmax_family``.
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
    # Importing the modules runs their @register_attention decorators.
    from lengthgen import baselines  # noqa: F401
    from lengthgen.attention import asentmax  # noqa: F401


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
