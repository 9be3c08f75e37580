"""What a valid results row is: the checks every row read from disk passes before anything uses it.

Result folders may come from someone else (a colleague's sweep, a submission), so a row is data
to check, never to trust: its types, its ranges (fractions in [0, 1], factors positive integers
equal to ``eval_length / train_length``), its enumerations (``status``, ``selection``), a parseable
``created_at``, and a ``config_json`` that is a lengthgen run config. The row must also say what
that config ran: its ``task``, ``attn``, ``pos``, ``seed`` and ``preset`` are the config's, its
``config_hash`` is the hash of the recorded JSON and its ``run_id`` is the id that hash gives.
Validating a config never imports anything: backends and tasks are names here, not code.

:func:`row_problems` gives the reason of every bad row; ``lengthgen.harness.storage.results`` skips those
rows with one warning per file.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
from pydantic import ValidationError

from lengthgen import limits
from lengthgen.choices import SELECTIONS
from lengthgen.config import RunConfig, config_hash_of, validation_message
from lengthgen.harness.storage.identity import run_id_of

STATUSES: tuple[str, ...] = ("ok", "failed")
#: Columns holding a fraction (a rate or a normalized entropy) when present.
FRACTIONS: tuple[str, ...] = ("exact_match", "exact_match_lo", "exact_match_hi", "token_accuracy",
                              "attn_entropy", "val_exact_id", "val_exact_8x")
#: Rounding slack for fractions computed in floating point (a normalized entropy of a uniform row).
SLACK = 1e-6
#: Columns holding a count (non-negative integer) when present.
COUNTS: tuple[str, ...] = ("steps", "best_step", "params", "numerics_version", "torch_threads")
#: Columns holding a non-negative finite number when present.
AMOUNTS: tuple[str, ...] = ("attn_support", "train_seconds", "eval_seconds")
#: Text columns that may be empty.
TEXTS: tuple[str, ...] = ("pos", "preset", "eval_variant", "device", "lengthgen_version", "torch_version",
                          "error", "numpy_version", "numba_version", "git_commit", "cpu", "cpu_isa",
                          "attn_package")
#: Columns holding a yes/no when present.
FLAGS: tuple[str, ...] = ("git_dirty",)


def wilson_interval(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """95% Wilson score interval for a binomial proportion (sane at 0 and n, unlike Wald)."""
    if n == 0:
        return float("nan"), float("nan")
    p = successes / n
    denom = 1.0 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, center - half), min(1.0, center + half)


#: How far a recorded interval may be from the Wilson interval of its count (float rounding).
INTERVAL_SLACK = 1e-9
#: The longest text a column may hold (others: 1,000 characters); a run config is about 1 KB, so
#: a longer one is no config, and a 5 MB text would only slow every page it reaches.
LONGEST: dict[str, int] = {"config_json": 2**16, "error": 10_000}
#: Names a row holds (what tables, figures and file names show): at most this long, one line.
NAMES: tuple[str, ...] = ("task", "attn", "pos", "preset")


class BadRow(ValueError):
    """Why one row is not usable (the message names the column and the value)."""


def _missing(value: Any) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    return isinstance(value, float) and math.isnan(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(row: dict[str, Any], column: str) -> float | None:
    """The value as a finite real number, None when missing; bool, text and infinities are refused."""
    value = row.get(column)
    if _missing(value):
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) \
            or not math.isfinite(float(value)):
        raise BadRow(f"{column} {_show(value)} is not a finite number")
    return float(value)


def _integer(row: dict[str, Any], column: str, minimum: int) -> int | None:
    value = _number(row, column)
    if value is None:
        return None
    if not value.is_integer() or value < minimum:
        raise BadRow(f"{column} {_show(row[column])} is not an integer ≥ {minimum}")
    return int(value)


def _text(row: dict[str, Any], column: str, required: bool = False) -> str | None:
    value = row.get(column)
    if _missing(value):
        if required:
            raise BadRow(f"{column} is empty")
        return None
    if not isinstance(value, str):
        raise BadRow(f"{column} {_show(value)} is not text")
    if required and not value:
        raise BadRow(f"{column} is empty")
    return value


def _choice(row: dict[str, Any], column: str, choices: tuple[str, ...], required: bool) -> None:
    value = _text(row, column, required)
    if value is not None and value not in choices:
        raise BadRow(f"{column} {_show(value)} is not one of {', '.join(choices)}")


@lru_cache(maxsize=4096)
def recorded_config(config_json: str) -> RunConfig:
    """The run config a row records (cached: a run's rows share one), or :class:`BadRow`."""
    try:
        return RunConfig.model_validate_json(config_json)
    except ValidationError as exc:
        raise BadRow(validation_message(exc, "config_json is not a lengthgen run config")) from None


def _identity(row: dict[str, Any]) -> None:
    """The row names the run its config describes."""
    text = _text(row, "config_json", required=True)
    assert text is not None
    config = recorded_config(text)
    for column in ("task", "attn", "pos", "preset"):
        value = row.get(column)
        if not _missing(value) and value != getattr(config, column):
            raise BadRow(f"{column} {_show(value)} is not its config's {getattr(config, column)!r}")
    if _integer(row, "seed", 0) != config.seed:
        raise BadRow(f"seed {_show(row.get('seed'))} is not its config's {config.seed}")
    digest = config_hash_of(text)
    recorded = _text(row, "config_hash")
    if recorded is not None and recorded != digest:
        raise BadRow(f"config_hash {_show(recorded)} is not the hash of its config_json ({digest})")
    if row["run_id"] != run_id_of(config, digest):
        raise BadRow(f"run_id {_show(row['run_id'])} is not its config's {run_id_of(config, digest)!r}")


def _created_at(row: dict[str, Any]) -> None:
    value = _text(row, "created_at")
    if value is None:
        return
    try:
        stamp = pd.Timestamp(value)
    except (ValueError, TypeError, OverflowError):
        stamp = None
    if stamp is None or pd.isna(stamp) or stamp.tzinfo is None:
        raise BadRow(f"created_at {_show(value)} is not a time with a UTC offset (ISO 8601)")


def _measurements(row: dict[str, Any]) -> None:
    """Lengths, factor and the fractions of an evaluation row."""
    factor = _integer(row, "factor", 1)
    length = _integer(row, "eval_length", 1)
    train_length = _integer(row, "train_length", 1)
    if row["status"] == "ok":
        present = {"factor": factor, "eval_length": length, "exact_match": row.get("exact_match")}
        for column, value in present.items():
            if _missing(value):
                raise BadRow(f"an ok row has no {column}")
    if factor is not None and (not limits.is_power_of_two(factor) or factor > limits.MAX_LENGTH):
        raise BadRow(f"factor {factor} is not a power of two up to {limits.MAX_LENGTH:,}")
    for column, value in (("eval_length", length), ("train_length", train_length)):
        if value is not None and value > limits.MAX_LENGTH:
            raise BadRow(f"{column} {value} is over the limit of {limits.MAX_LENGTH:,}")
    if None not in (factor, length, train_length) and factor * train_length != length:  # type: ignore[operator]
        raise BadRow(f"factor {factor} is not eval_length / train_length ({length} / {train_length})")
    n = _integer(row, "n_samples", 1)
    if n is not None and n > limits.MAX_SAMPLES:
        raise BadRow(f"n_samples {n} is over the limit of {limits.MAX_SAMPLES:,}")
    limits_of = {column: 1 + (SLACK if column == "attn_entropy" else 0) for column in FRACTIONS}
    for column, top in limits_of.items():
        value = _number(row, column)
        if value is not None and not 0 <= value <= top:
            raise BadRow(f"{column} {_show(row[column])} is not a fraction in [0, 1]")
    _interval(row, n)
    for column in COUNTS:
        value = _integer(row, column, 0)
        if column in UPPER and value is not None and value > UPPER[column]:
            raise BadRow(f"{column} {value} is over the limit of {UPPER[column]:,}")
    for column in AMOUNTS:
        value = _number(row, column)
        if value is not None and value < 0:
            raise BadRow(f"{column} {_show(row[column])} is negative")


#: Counts the code acts on, with their largest value (``torch_threads``: verify starts that many).
UPPER: dict[str, int] = {"torch_threads": limits.MAX_THREADS, "steps": limits.MAX_STEPS,
                         "best_step": limits.MAX_STEPS, "params": limits.MAX_PARAMS}


def _interval(row: dict[str, Any], n: int | None) -> None:
    """``exact_match_lo ≤ exact_match ≤ exact_match_hi``, and with the sample count: the mean is a
    count of ``n`` samples and the interval its Wilson interval (an edited mean or interval is
    refused, not published as ``100.0 [24.8, 55.1]``)."""
    mean, lo, hi = (_number(row, c) for c in ("exact_match", "exact_match_lo", "exact_match_hi"))
    if mean is None or lo is None or hi is None:
        return
    if not lo - INTERVAL_SLACK <= mean <= hi + INTERVAL_SLACK:  # a Wilson bound of 1 is 1 - 1e-16
        raise BadRow(f"exact_match {mean!r} lies outside its interval [{lo!r}, {hi!r}]")
    if n is None:
        return
    hits = round(mean * n)
    if abs(mean * n - hits) > 1e-6 * n:
        raise BadRow(f"exact_match {mean!r} is no count of its {n} samples")
    want = wilson_interval(hits, n)
    if abs(lo - want[0]) > INTERVAL_SLACK or abs(hi - want[1]) > INTERVAL_SLACK:
        raise BadRow(f"exact_match_lo, exact_match_hi [{lo!r}, {hi!r}] are not the Wilson interval of "
                     f"{hits} of {n} samples ({want[0]!r}, {want[1]!r})")


def _labels(row: dict[str, Any]) -> None:
    """Text columns are text, the enumerations hold one of their values, the seed is a seed."""
    for column in ("run_id", "task", "attn"):
        _text(row, column, required=True)
    _choice(row, "status", STATUSES, True)
    for column in (*TEXTS, "config_json"):
        value = _text(row, column)
        if value is not None and len(value) > LONGEST.get(column, 1000):
            raise BadRow(f"{column} is {len(value):,} characters long, over the limit of "
                         f"{LONGEST.get(column, 1000):,}")
    for column, longest in ((*((c, limits.MAX_NAME) for c in NAMES), ("eval_variant", 1000))):
        value = _text(row, column)
        if value is not None and not limits.is_line(value, longest):
            raise BadRow(f"{column} {_show(value)} is not a name (one line of at most {longest} characters)")
    _choice(row, "selection", SELECTIONS, False)
    for column in FLAGS:
        value = row.get(column)
        if not _missing(value) and not isinstance(value, (bool, np.bool_)):
            raise BadRow(f"{column} {_show(value)} is not true or false")
    seed = _integer(row, "seed", 0)
    if seed is None:
        raise BadRow("seed is empty")
    if seed > limits.MAX_SEED:
        raise BadRow(f"seed {seed} is not a seed (an integer from 0 to {limits.MAX_SEED:,})")


#: The checks, in the order their reasons are reported.
CHECKS: tuple[Callable[[dict[str, Any]], None], ...] = (_labels, _measurements, _created_at, _identity)


def row_problem(row: dict[str, Any]) -> str | None:
    """Why ``row`` (column → value) is not a usable results row; None when it is."""
    for check in CHECKS:
        try:
            check(row)
        except BadRow as exc:
            return str(exc)
    return None


def row_problems(frame: pd.DataFrame) -> list[str | None]:
    """:func:`row_problem` of every row of ``frame``, in order."""
    columns = list(frame.columns)
    return [row_problem(dict(zip(columns, values, strict=True)))
            for values in frame.itertuples(index=False, name=None)]
