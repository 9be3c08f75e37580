"""Sequence-to-sequence tasks over a symbol vocabulary: copy, sort, reverse."""

from __future__ import annotations

from abc import abstractmethod

import numpy as np
from pydantic import Field

from lengthgen.tasks import register_task
from lengthgen.tasks.base import Task, TaskBatch, TaskConfig, Vocab, seq2seq_view

#: How many symbols before a source symbol must equal those before the one to copy for copy's
#: ``key_role`` to call it a repeated context: one symbol recurs every ~vocabulary-size symbols at
#: any length, two are rare at training lengths and common at 16x and beyond.
REPEATED_CONTEXT = 2


class SymbolConfig(TaskConfig):
    vocab_size: int = Field(32, ge=2, le=4096, description="number of distinct source symbols")


class CopyConfig(SymbolConfig):
    distinct_pairs: bool = Field(
        False,
        description="draw each source so that no two adjacent symbols occur twice as a pair (a stress "
        "variant: no 2-symbol context repeats; needs length well under vocab_size**2)",
    )


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

    def _draw_sources(self, rng: np.random.Generator, n: int, length: int) -> np.ndarray:
        """(n, length) source symbols, uniform and independent."""
        return rng.integers(0, self.config.vocab_size, size=(n, length), dtype=np.int64)

    def _generate(self, rng: np.random.Generator, n: int, length: int, split: str) -> TaskBatch:
        source = self._draw_sources(rng, n, length)
        target = self._transform(source)
        offset = len(self.vocab.tokens) - self.config.vocab_size
        ids, mask = seq2seq_view(source + offset, target + offset)
        return TaskBatch(ids, mask, source.tolist, target.tolist)  # views built on first use


@register_task()
class Copy(_SymbolTask):
    name = "copy"
    description = "Reproduce a random symbol sequence after the separator."
    Config = CopyConfig
    config: CopyConfig

    def _draw_sources(self, rng: np.random.Generator, n: int, length: int) -> np.ndarray:
        if not self.config.distinct_pairs:
            return super()._draw_sources(rng, n, length)
        return np.stack([_distinct_pair_source(rng, length, self.config.vocab_size) for _ in range(n)])

    def _transform(self, source: np.ndarray) -> np.ndarray:
        return source.copy()

    def key_role(self, ids: np.ndarray, row: int, key: int) -> str | None:
        """The source symbol to copy, its neighbours, or another source symbol named by how many of
        the symbols before it equal those before the one to copy: the model has just written those,
        so a head that finds its place by them alone cannot tell such a symbol from the right one,
        and such repeats grow with length (a 2-symbol context recurs about once per 1,024 source
        symbols at vocabulary 32)."""
        n = (len(ids) - 3) // 2  # bos, n source symbols, sep, n target symbols, eos
        copied = 1 + row - (n + 1)  # position of the source symbol the answer at ``row`` copies
        if not 1 <= key <= n:
            return "start, separator or output"
        if key == copied:
            return "the symbol to copy"
        if abs(key - copied) == 1:
            return "a neighbour of the symbol to copy"
        shared = 0
        while min(key, copied) - shared > 1 and ids[key - 1 - shared] == ids[copied - 1 - shared]:
            shared += 1
        if shared >= REPEATED_CONTEXT:
            return f"a symbol after the same {REPEATED_CONTEXT}+ symbols"
        return "a symbol after the same symbol" if shared else "another source symbol"


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


#: Fresh starts a source with distinct pairs gets before the draw gives up.
DISTINCT_PAIR_ATTEMPTS = 1000


def _distinct_pair_source(rng: np.random.Generator, length: int, vocab_size: int) -> np.ndarray:
    """One source in which every pair of adjacent symbols is new: each symbol after the first is
    uniform over the successors its predecessor has not had yet, and a draw that runs out of them
    starts again (it rarely does while length is well under vocab_size**2)."""
    if length - 1 > vocab_size**2:
        raise ValueError(f"distinct_pairs: {length - 1} adjacent pairs cannot be distinct over "
                         f"vocab_size {vocab_size} ({vocab_size**2} pairs)")
    source = np.empty(length, dtype=np.int64)
    for _ in range(DISTINCT_PAIR_ATTEMPTS):
        used = np.zeros((vocab_size, vocab_size), dtype=bool)
        source[0] = rng.integers(vocab_size)
        for t in range(1, length):
            free = np.flatnonzero(~used[source[t - 1]])
            if not free.size:
                break
            source[t] = free[rng.integers(free.size)]
            used[source[t - 1], source[t]] = True
        else:
            return source
    raise ValueError(f"distinct_pairs: no source of length {length} with distinct pairs over vocab_size "
                     f"{vocab_size} in {DISTINCT_PAIR_ATTEMPTS} draws; use a shorter length")
