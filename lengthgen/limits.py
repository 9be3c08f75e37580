"""Size limits, stated once: generous (far past the paper's settings) but finite.

A typo such as ``--length 1000000000`` or ``--seeds 0-100000000`` must be refused in a
millisecond with a one-line error, not discovered when the machine runs out of memory. Every
check of a size against these numbers lives here; the task interface and the run configuration
call them before anything is allocated.
"""

from __future__ import annotations

import re

from lengthgen.errors import UserError

#: Control characters (C0, DEL, C1, the Unicode line and paragraph separators): text from someone
#: else's file that reaches a page, a README table, LaTeX or a figure is one line without them.
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")

#: Longest sample, in the task's own length unit (items, symbols, instructions, context tokens).
#: The paper evaluates at 64 × 1024 = 65,536; one sample of 2^20 takes about 0.2 GB to generate.
MAX_LENGTH = 2**20
#: Most length units generated at once (n × length): one evaluation cell, one training batch, one
#: ``lengthgen sample`` call. The paper's largest cell is 1,000 × 65,536; 2^26 units take up to
#: about 11 GB for the task with the heaviest JSON view (flip_flop).
MAX_TOKENS = 2**26
#: Most samples per call, per evaluation length, or for validation.
MAX_SAMPLES = 10**6
#: Seeds are non-negative and fit in 32 bits (every generator downstream accepts them).
MAX_SEED = 2**32 - 1
#: Most seeds in one sweep.
MAX_SEEDS = 10_000
#: Most runs in one sweep (tasks × backends × schemes × settings × seeds).
MAX_RUNS = 100_000
#: Most training steps (far above the paper's longest training, lengthgen/leaderboard/paper.py).
MAX_STEPS = 10**7
#: Most model parameters, estimated from the layer sizes (the paper's largest model has ~13 M).
MAX_PARAMS = 4 * 10**9
#: Most torch threads a row may record (and ``verify`` may start): the largest two-socket servers
#: have 512 hardware threads; a row asking for 10^6 crashes torch, and 4,096 cost 40 s of system time.
MAX_THREADS = 512
#: Deepest nesting of lists and tables in a file or value someone else may have written (a plan,
#: ``source.toml``, ``verify.json``, ``config.json``, ``--set``): a run config nests 4 levels, a
#: plan 5; 100,000 nested brackets would exhaust Python's recursion limit in the parser.
MAX_NESTING = 32
#: Longest file lengthgen reads as text from a folder (plans, source.toml, SOURCE.md, ABOUT.md,
#: config.json, verify.json; the published plan is about 20 KB).
MAX_TEXT_BYTES = 2**20
#: Longest name (a task, backend, position scheme or submission label) shown in a table or figure.
MAX_NAME = 200


def check_at_most(what: str, value: int, limit: int, hint: str = "") -> None:
    """Refuse ``value`` above ``limit`` with a one-line message naming the limit."""
    if value > limit:
        raise UserError(f"{what} {value:,} is over the limit of {limit:,}{f' ({hint})' if hint else ''}")


def check_seed(seed: int, what: str = "seed") -> None:
    if not 0 <= seed <= MAX_SEED:
        raise UserError(f"{what} {seed} is out of range: seeds are integers from 0 to {MAX_SEED:,}")


def check_sample_size(n: int, length: int) -> None:
    """n samples of size ``length`` in one call (positivity is the task's own check)."""
    check_at_most("length", length, MAX_LENGTH)
    check_at_most("n", n, MAX_SAMPLES)
    check_at_most("n × length", n * length, MAX_TOKENS, "fewer or shorter samples per call")


def is_power_of_two(value: int) -> bool:
    """Factors are powers of two everywhere (``eval.max_factor``, ``--min-factor``, ``--factor``, a
    row's ``factor``, a plan's factors): 1, 2, 4, …"""
    return value >= 1 and not value & (value - 1)


def check_power_of_two(what: str, value: int) -> None:
    """:func:`is_power_of_two`, or a one-line ``UserError`` naming ``what``."""
    if not is_power_of_two(value):
        raise UserError(f"{what} must be a power of two (1, 2, 4, …), got {value}")


def nesting_depth(value: object) -> int:
    """How deep lists and dicts nest in ``value`` (0 for a scalar), without recursing: a value
    parsed from someone else's file may nest deeper than Python's recursion limit allows."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, (list, tuple)):
            children = list(item)
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_NESTING:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def too_deep(what: str) -> UserError:
    """The one-line error for data nested deeper than ``MAX_NESTING`` (raised by the caller, also
    when a parser ran out of recursion before the depth could be measured)."""
    return UserError(f"{what} nests lists or tables deeper than {MAX_NESTING} levels")


def check_nesting(what: str, value: object) -> None:
    """Refuse data nested deeper than ``MAX_NESTING``."""
    if nesting_depth(value) > MAX_NESTING:
        raise too_deep(what)


def is_line(text: str, longest: int) -> bool:
    """``text`` is one line of at most ``longest`` characters without control characters."""
    return len(text) <= longest and not CONTROL.search(text)
