"""Sequence-to-sequence tasks over a symbol vocabulary: copy, sort, reverse."""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
from pydantic import Field

from lengthgen.tasks import register_task
from lengthgen.tasks.base import Task, TaskBatch, TaskConfig, Vocab, seq2seq_view


class SymbolConfig(TaskConfig):
    vocab_size: int = Field(32, ge=2, le=4096, description="number of distinct source symbols")


class _SymbolTask(Task):
    """Random source over ``vocab_size`` symbols; the target is a function of the source."""

    Config = SymbolConfig
    config: SymbolConfig
    min_length = 1
    default_train_length = 64

    @property
    def vocab(self) -> Vocab:
        return Vocab.with_specials([str(i) for i in range(self.config.vocab_size)])

    @abstractmethod
    def _transform(self, source: np.ndarray) -> np.ndarray:
        """The target as a function of the (n, L) source."""

    def _generate(self, rng: np.random.Generator, n: int, length: int, split: str) -> TaskBatch:
        source = rng.integers(0, self.config.vocab_size, size=(n, length), dtype=np.int64)
        target = self._transform(source)
        offset = len(self.vocab.tokens) - self.config.vocab_size
        ids, mask = seq2seq_view(source + offset, target + offset)
        return TaskBatch(ids, mask, source.tolist(), target.tolist())


@register_task()
class Copy(_SymbolTask):
    name = "copy"
    description = "Reproduce a random symbol sequence after the separator."

    def _transform(self, source: np.ndarray) -> np.ndarray:
        return source.copy()


@register_task()
class Sort(_SymbolTask):
    name = "sort"
    description = "Output the source symbols (repeats allowed) sorted ascending."

    def _transform(self, source: np.ndarray) -> np.ndarray:
        return np.sort(source, axis=1, kind="stable")


@register_task()
class Reverse(_SymbolTask):
    name = "reverse"
    description = "Output the source symbols in reverse order."

    def _transform(self, source: np.ndarray) -> np.ndarray:
        return source[:, ::-1].copy()
