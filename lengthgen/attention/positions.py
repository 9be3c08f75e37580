"""Position schemes by the names users type (``--pos``); the definitions are in
``lengthgen.functional.positions``."""

from __future__ import annotations

from lengthgen.functional.positions import (
    POSITION_SCHEMES,
    PositionScheme,
    alibi_slopes,
    apply_rope,
    log_visible,
)
from lengthgen.registry import UnknownNameError

__all__ = [
    "POSITION_SCHEMES", "PositionScheme", "alibi_slopes", "apply_rope", "get_position_scheme", "log_visible",
]


def get_position_scheme(name: str) -> PositionScheme:
    """The scheme called ``name``; an unknown name is a user error listing the valid ones."""
    try:
        return POSITION_SCHEMES[name]
    except KeyError:
        valid = ", ".join(POSITION_SCHEMES)
        raise UnknownNameError(f"unknown position scheme {name!r}; valid position schemes: {valid}") from None
