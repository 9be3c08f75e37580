"""The command line's lists: names (``copy,sort``), seeds (``0,2,5-7``) and the values a ``--set``
gives one field (``train.lr=5e-4,1e-3``), each a one-line ``UserError`` when malformed; and the
grid a ``lengthgen sweep`` command line names (:func:`spec_from_flags`)."""

from __future__ import annotations

from typing import Any

from lengthgen import limits
from lengthgen.config import parse_assignments, parse_json, parse_value
from lengthgen.errors import UserError
from lengthgen.sweeps.grid import SweepSpec

__all__ = ["parse_choices", "parse_list", "parse_seeds", "spec_from_flags", "split_settings"]


def parse_list(text: str, what: str) -> tuple[str, ...]:
    """``a,b , c`` → ('a', 'b', 'c'); empty items are an error, not silently dropped."""
    items = tuple(item.strip() for item in text.split(","))
    if not text.strip() or any(not item for item in items):
        raise UserError(f"bad {what} list {text!r}: expected comma-separated names")
    return items


def parse_seeds(text: str) -> tuple[int, ...]:
    """``0,1,2`` or a range ``0-4`` (inclusive), or a mix: ``0,2,5-7``; at most ``MAX_SEEDS``
    seeds, counted before a range is expanded."""
    seeds: list[int] = []
    for item in parse_list(text, "seed"):
        lo, dash, hi = item.partition("-")
        try:
            first, last = (int(lo), int(hi)) if dash else (int(item), int(item))
        except ValueError:
            raise UserError(f"bad seed {item!r} in --seeds {text!r}: expected integers like 0,1,2 or 0-4") \
                from None
        limits.check_seed(first)
        limits.check_seed(last)
        if last < first:
            raise UserError(f"bad seed range {item!r} in --seeds {text!r}: the end is before the start")
        limits.check_at_most("number of seeds", len(seeds) + last - first + 1, limits.MAX_SEEDS)
        seeds.extend(range(first, last + 1))
    return tuple(seeds)


def parse_choices(raw: str) -> tuple[Any, ...]:
    """The values a sweep's ``--set`` gives one field: ``5e-4,1e-3`` → (0.0005, 0.001). Each value
    reads as ``lengthgen run`` reads one (``config.parse_value``); a comma inside a JSON list or
    object does not split it (``[0.9,0.99],[0.9,0.999]`` is two values), text splits at every
    comma (``id,8x``)."""
    try:
        values = parse_json(f"[{raw}]")
    except ValueError:
        items = [item.strip() for item in raw.split(",")]
        if any(not item for item in items):
            raise UserError(f"bad --set value {raw!r}: an empty item in a comma-separated list") from None
        values = [parse_value(item) for item in items]
    if not values:
        raise UserError("--set needs a value after '='")
    return tuple(values)


def split_settings(choices: dict[str, tuple[Any, ...]]) -> tuple[dict[str, Any], dict[str, tuple[Any, ...]]]:
    """``--set`` fields with one value (shared settings) apart from those with several (the grid)."""
    shared = {key: values[0] for key, values in choices.items() if len(values) == 1}
    return shared, {key: values for key, values in choices.items() if len(values) > 1}


def spec_from_flags(*, tasks: str, attns: str, positions: str | None = None, seeds: str | None = None,
                    preset: str | None = None, param: list[str] | None = None,
                    attn_option: list[str] | None = None, override: list[str] | None = None,
                    **dedicated: Any) -> SweepSpec:
    """The grid ``lengthgen sweep`` flags name: lists as typed (``--task copy,sort``), ``key=value``
    assignments, and the dedicated flags (``steps``, ``max_factor``, … as ``SweepSpec`` fields); a
    ``--set`` field given several values becomes a grid axis."""
    shared, grid = split_settings(parse_assignments(override, "--set", parse=parse_choices))
    return SweepSpec(
        tasks=parse_list(tasks, "task"), attns=parse_list(attns, "attention backend"),
        positions=parse_list(positions or "nape", "position scheme"), seeds=parse_seeds(seeds or "0"),
        preset=preset or "quick", task_params=parse_assignments(param, "--param"), overrides=shared,
        grid=grid, attn_options=parse_assignments(attn_option, "--attn-option"), **dedicated)
