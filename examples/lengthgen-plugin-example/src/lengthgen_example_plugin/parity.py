"""parity: after a random bit string, output its parity (or, with ``running``, every prefix parity).

Parity needs every input bit, so it is the opposite of retrieval: attention must spread, not focus.
Vectorized and deterministic: all randomness comes from the ``rng`` lengthgen seeds per
(task, split, length, seed).
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from lengthgen.api import Task, TaskBatch, TaskConfig, Vocab, seq2seq_view
from pydantic import Field

ZERO = 4  # token id of "0": ids 0-3 are always <pad> <bos> <sep> <eos>, then our symbols


class ParityConfig(TaskConfig):
    running: bool = Field(False, description="target every prefix parity instead of only the last")


class Parity(Task):
    name = "parity"
    description = "Output the parity of a random bit string (running=true: every prefix parity)."
    length_unit = "bits"
    Config = ParityConfig
    config: ParityConfig

    @cached_property
    def vocab(self) -> Vocab:
        return Vocab.with_specials(["0", "1"])

    @property
    def min_length(self) -> int:
        return 1

    @property
    def default_train_length(self) -> int:
        return 16

    def _generate(self, rng: np.random.Generator, n: int, length: int, split: str) -> TaskBatch:
        bits = rng.integers(0, 2, size=(n, length), dtype=np.int64)
        prefix = np.cumsum(bits, axis=1) % 2
        target = prefix if self.config.running else prefix[:, -1:]
        ids, mask = seq2seq_view(bits + ZERO, target + ZERO)
        return TaskBatch(ids, mask, bits.tolist(), target.tolist())
