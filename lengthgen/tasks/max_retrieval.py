"""max_retrieval: the class of the highest-priority item (after Veličković et al.).

The pure dispersion test: one item carries the unique maximum priority and another always sits
just below it, so at every length the model must single out one token among near-ties rather than
average over many similar ones.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from pydantic import Field, model_validator

from lengthgen.tasks import register_task
from lengthgen.tasks.base import Task, TaskBatch, TaskConfig, Vocab, gc_paused, seq2seq_view

#: Keeps the vocabulary (one token per (priority, class)) within what an embedding table handles.
MAX_ITEM_TOKENS = 1 << 20


class MaxRetrievalConfig(TaskConfig):
    n_priorities: int = Field(
        32, ge=2, le=65536, description="priorities are 0..n_priorities-1; the maximum is at least 1"
    )
    n_classes: int = Field(8, ge=2, le=4096, description="number of item classes (the answer space)")

    @model_validator(mode="after")
    def _vocab_fits(self) -> MaxRetrievalConfig:
        if self.n_priorities * self.n_classes > MAX_ITEM_TOKENS:
            raise ValueError(
                f"n_priorities * n_classes = {self.n_priorities * self.n_classes} item tokens "
                f"exceeds the limit of {MAX_ITEM_TOKENS}"
            )
        return self


@register_task()
class MaxRetrieval(Task):
    """``bos item_1 .. item_n sep c eos``; each item is one token ``p{priority}c{class}``.

    The maximum priority m is uniform in [1, n_priorities-1] and held by exactly one item at a
    uniform position; every other item has a priority uniform in [0, m-1], and one of them (at a
    uniform other position) is forced to m-1, so a near-maximal distractor exists at every length.
    The answer is a separate ``c{class}`` token so that it cannot be copied from an item token.
    """

    name = "max_retrieval"
    description = "Output the class of the unique highest-priority item; a near-max distractor always exists."
    length_unit = "items"
    Config = MaxRetrievalConfig
    config: MaxRetrievalConfig
    min_length = 2
    default_train_length = 16

    @cached_property
    def vocab(self) -> Vocab:
        p, c = self.config.n_priorities, self.config.n_classes
        items = [f"p{i}c{j}" for i in range(p) for j in range(c)]
        return Vocab.with_specials(items + [f"c{j}" for j in range(c)])

    @property
    def item_offset(self) -> int:
        """Id of token ``p0c0``; item (p, c) is ``item_offset + p * n_classes + c``."""
        return 4

    @property
    def answer_offset(self) -> int:
        """Id of answer token ``c0``."""
        return 4 + self.config.n_priorities * self.config.n_classes

    def _generate(self, rng: np.random.Generator, n: int, length: int, split: str) -> TaskBatch:
        n_pri, n_cls = self.config.n_priorities, self.config.n_classes
        rows = np.arange(n)
        top = rng.integers(1, n_pri, size=n, dtype=np.int64)
        where_max = rng.integers(0, length, size=n, dtype=np.int64)
        # A uniform position other than where_max: draw from length-1 slots and skip the max.
        where_near = rng.integers(0, length - 1, size=n, dtype=np.int64)
        where_near += where_near >= where_max
        # Priorities uniform in [0, top-1] by scaling uniform floats: exact for any top < 2**52 and
        # much faster than per-element bounded integer draws.
        priority = (rng.random((n, length)) * top[:, None]).astype(np.int64)
        np.minimum(priority, (top - 1)[:, None], out=priority)  # guards against rounding up to top
        priority[rows, where_max] = top
        priority[rows, where_near] = top - 1
        klass = rng.integers(0, n_cls, size=(n, length), dtype=np.int64)
        answer = klass[rows, where_max]

        items = priority * n_cls
        items += klass
        items += self.item_offset
        ids, mask = seq2seq_view(items, (answer + self.answer_offset)[:, None])

        def source() -> list:
            with gc_paused():
                return np.stack([priority, klass], axis=-1).tolist()

        return TaskBatch(ids, mask, source, answer[:, None].tolist)

    def key_role(self, ids: np.ndarray, row: int, key: int) -> str | None:
        """The maximum, an item one priority below it (the planted near-tie, and any other drawn
        there) or a lower item, each other item also named by its side of the maximum: "after" is
        nearer the answer. A backend that favours recent keys (a forget gate, stick-breaking's
        nearest-first order) errs on items after the maximum; one that cannot tell near-ties apart
        errs on either side alike."""
        n = len(ids) - 4  # bos, n items, sep, answer, eos
        if not 1 <= key <= n:
            return "start or separator"
        priorities = (np.asarray(ids[1:n + 1]) - self.item_offset) // self.config.n_classes
        top = int(priorities.argmax())
        mine = int(priorities[key - 1])
        if key - 1 == top:
            return "the maximum"
        side = "after" if key - 1 > top else "before"
        kind = "an item one below the maximum" if mine == priorities[top] - 1 else "a lower item"
        return f"{kind}, {side} it"
