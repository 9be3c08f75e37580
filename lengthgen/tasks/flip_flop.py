"""flip_flop: recall the most recently written bit at every read (Liu et al., "Exposing attention
glitches with flip-flop language modeling").

The sparse (rare writes and reads, long gaps) and dense (few ignores) evaluation variants probe
whether attention stays sharp when the distance to the relevant write changes.
"""

from __future__ import annotations

from functools import cached_property
from typing import Literal

import numpy as np
from pydantic import Field

from lengthgen.tasks import register_task
from lengthgen.tasks.base import BOS, EOS, Task, TaskBatch, TaskConfig, Vocab, gc_paused

#: p(ignore) on the eval split for each variant (None: the configured p_ignore).
EVAL_P_IGNORE: dict[str, float | None] = {"same": None, "sparse": 0.98, "dense": 0.1}

W, I, R, ZERO = 4, 5, 6, 7  # token ids: "w", "i", "r", "0" ("1" is ZERO + 1)
_OP_NAMES = np.array(["w", "i", "r"], dtype=object)


class FlipFlopConfig(TaskConfig):
    p_ignore: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="probability of an ignore instruction (writes and reads split the rest)",
    )
    eval_variant: Literal["same", "sparse", "dense"] = Field(
        "same", description="on split 'eval': same p_ignore, sparse (p_ignore 0.98) or dense (0.1)"
    )


@register_task()
class FlipFlop(Task):
    """``bos op_1 bit_1 .. op_n bit_n eos``; the bit after each ``r`` is scored.

    Instructions are write/ignore/read with p(ignore) = p_i and writes and reads sharing the rest
    equally; the first instruction is a write and the last a read, so every read has an answer and
    every sample has at least one scored token. Bits after ``w`` and ``i`` are uniform; the bit
    after ``r`` is the most recently written one.
    """

    name = "flip_flop"
    description = "At each read, output the most recently written bit; ignores carry distracting bits."
    length_unit = "instructions"
    has_sep = False
    Config = FlipFlopConfig
    config: FlipFlopConfig
    min_length = 2
    default_train_length = 64

    @cached_property
    def vocab(self) -> Vocab:
        return Vocab.with_specials(["w", "i", "r", "0", "1"])

    def p_ignore(self, split: str) -> float:
        """p(ignore) used for ``split``: the variant only changes the eval stream."""
        override = EVAL_P_IGNORE[self.config.eval_variant]
        return override if split == "eval" and override is not None else self.config.p_ignore

    def _generate(self, rng: np.random.Generator, n: int, length: int, split: str) -> TaskBatch:
        p_i = self.p_ignore(split)
        u = rng.random((n, length))
        bits = rng.integers(0, 2, size=(n, length), dtype=np.int64)
        # op codes 0 = w, 1 = i, 2 = r
        op = np.where(u < p_i, 1, np.where(u < p_i + (1.0 - p_i) / 2.0, 0, 2)).astype(np.int64)
        op[:, 0] = 0
        op[:, -1] = 2
        is_write = op == 0
        is_read = op == 2
        # Index of the latest write at or before each position (position 0 is always a write).
        last_write = np.where(is_write, np.arange(length), 0)
        np.maximum.accumulate(last_write, axis=1, out=last_write)
        recalled = np.take_along_axis(bits, last_write, axis=1)
        bits = np.where(is_read, recalled, bits)

        ids = np.empty((n, 2 * length + 2), dtype=np.int64)
        ids[:, 0] = BOS
        ids[:, 1:-1:2] = op + W
        ids[:, 2:-1:2] = bits + ZERO
        ids[:, -1] = EOS
        mask = np.zeros(ids.shape, dtype=bool)
        mask[:, 1:-1:2] = is_read


        def source() -> list:
            pairs = np.empty((n, length, 2), dtype=object)
            pairs[:, :, 0] = _OP_NAMES[op]
            pairs[:, :, 1] = bits
            with gc_paused():
                return pairs.tolist()

        def target() -> list:
            return [bits[b][is_read[b]].tolist() for b in range(n)]

        return TaskBatch(ids, mask, source, target)
