"""Size limits, stated once: generous (far past the paper's settings) but finite.

A typo such as ``--length 1000000000`` or ``--seeds 0-100000000`` must be refused in a
millisecond with a one-line error, not discovered when the machine runs out of memory. Every
check of a size against these numbers lives here; the task interface and the run configuration
call them before anything is allocated.
"""

from __future__ import annotations

from lengthgen.errors import UserError

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
