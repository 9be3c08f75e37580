"""mqmtar: multi-query multi-token associative recall.

Key→value pairs, each key and value a few tokens, sit among filler in the context; after the
separator come several queried keys, each followed by its value. A sample is right only if every
value token is, so the model must bind multi-token keys and retrieve multi-token values from a
context whose number of pairs grows with length.
"""

from __future__ import annotations

from functools import cached_property

import numpy as np
from pydantic import Field, model_validator

from lengthgen.tasks import register_task
from lengthgen.tasks.base import BOS, EOS, SEP, Task, TaskBatch, TaskConfig, TaskInputError, Vocab, gc_paused

#: Key ids must fit comfortably in int64.
MAX_KEY_SPACE = 1 << 62
#: Stream 1 draws keys by a partial shuffle of the whole key space up to this many keys (or 8 x the
#: number of pairs), above it by rejection of duplicates. At the paper's 256^2 = 65,536 keys that
#: shuffles 65,536 floats to pick the ~8 keys of a training sample: 60 K tokens/s on one core.
DENSE_KEY_SPACE = 1 << 16
#: Stream 2 shuffles the key space only when the sample needs more than this fraction of it
#: (the birthday bound makes rejection cost several rounds there); otherwise it rejects duplicates.
DENSE_FRACTION = 1 / 8


class MqmtarConfig(TaskConfig):
    alphabet: int = Field(32, ge=2, le=4096, description="symbols per key/value token range")
    key_len: int = Field(2, ge=1, le=16, description="tokens per key")
    value_len: int = Field(2, ge=1, le=16, description="tokens per value")
    n_queries: int = Field(4, ge=1, le=256, description="queried keys after the separator")
    pair_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="fraction of the context occupied by key-value pairs"
    )
    near_misses: int = Field(
        0, ge=0, le=4096,
        description="per queried key, at least this many other pairs whose key shares only its "
        "token at near_miss_token (a stress variant; 0: keys as drawn)",
    )
    near_miss_token: int = Field(2, ge=1, le=16, description="the key token near misses share (1-based)")

    @model_validator(mode="after")
    def _enough_keys(self) -> MqmtarConfig:
        space = self.alphabet**self.key_len
        if space > MAX_KEY_SPACE:
            raise ValueError(f"alphabet**key_len = {self.alphabet}**{self.key_len} is over 2**62 keys")
        if space < self.n_queries:
            raise ValueError(
                f"n_queries {self.n_queries} needs that many distinct keys, "
                f"but alphabet**key_len is only {space}"
            )
        if self.near_misses:
            if not 2 <= self.key_len or self.near_miss_token > self.key_len:
                raise ValueError(f"near misses share one key token of several: need key_len >= 2 and "
                                 f"near_miss_token <= key_len, got {self.key_len} and {self.near_miss_token}")
            if (self.alphabet - 1) ** (self.key_len - 1) < self.n_queries * self.near_misses:
                raise ValueError(f"{self.near_misses} near misses for each of {self.n_queries} queries need "
                                 f"that many keys sharing one token, but alphabet {self.alphabet} and "
                                 f"key_len {self.key_len} allow {(self.alphabet - 1) ** (self.key_len - 1)}")
        return self


@register_task()
class Mqmtar(Task):
    """``bos context sep (key value)*n_queries eos``; the value tokens after each key are scored.

    Context = P pair blocks (key tokens ``k*`` then value tokens ``v*``) and filler ``.`` in a
    uniformly random arrangement, with P = min(max(n_queries, floor(pair_fraction * L / (K + V))),
    alphabet**key_len). Keys are distinct within a sample; values are arbitrary; the queries are
    n_queries distinct keys among the present pairs, in random order. With ``near_misses`` = m > 0,
    m randomly chosen other pairs per query get a key equal to the query's at ``near_miss_token``
    and different at every other position: the confusions a long context brings by chance (about
    P / alphabet per query and token), planted at a short length to test them apart from length.
    """

    name = "mqmtar"
    #: 2: keys by rejection of duplicates unless a sample needs over 1/8 of the key space (stream 1
    #: shuffled the whole space of up to 65,536 keys for every sample).
    latest_stream = 2
    description = "Multi-query multi-token associative recall: give the value of each queried key."
    length_unit = "context tokens"
    Config = MqmtarConfig
    config: MqmtarConfig

    @cached_property
    def vocab(self) -> Vocab:
        a = self.config.alphabet
        return Vocab.with_specials([f"k{i}" for i in range(a)] + [f"v{i}" for i in range(a)] + ["."])

    @property
    def block(self) -> int:
        return self.config.key_len + self.config.value_len

    @property
    def min_length(self) -> int:
        return self.config.n_queries * self.block

    @property
    def default_train_length(self) -> int:
        return max(64, self.min_length)

    @property
    def key_offset(self) -> int:
        return 4

    @property
    def value_offset(self) -> int:
        return 4 + self.config.alphabet

    @property
    def filler(self) -> int:
        return 4 + 2 * self.config.alphabet

    def key_role(self, ids: np.ndarray, row: int, key: int) -> str | None:
        """The queried key's own pair, a pair that shares some of its key tokens (the near misses
        that multiply with length), another pair, filler, or the start, separator and queries."""
        c = self.config
        length = len(ids) - 3 - c.n_queries * self.block
        if key == 0 or key > length:
            return "start, separator or queries"
        if ids[key] == self.filler:
            return "filler"
        start = self._block_start(ids, key)
        query = length + 2 + (row - length - 2) // self.block * self.block
        shared = [i + 1 for i in range(c.key_len) if ids[start + i] == ids[query + i]]
        if len(shared) == c.key_len:
            return "matching pair"
        if shared:
            return f"pair sharing key token {', '.join(map(str, shared))}"
        return "other pair"

    def _block_start(self, ids: np.ndarray, position: int) -> int:
        """The first key token of the context block holding ``position``: keys and values use
        separate symbols and every block is its key tokens then its value tokens."""
        is_value = ids[position] >= self.value_offset
        lo = self.value_offset if is_value else self.key_offset
        first = position
        while ids[first - 1] >= lo and ids[first - 1] < lo + self.config.alphabet:
            first -= 1
        return first - self.config.key_len if is_value else first

    def n_pairs(self, length: int) -> int:
        """Number of pairs in a context of ``length`` tokens (grows with length, capped by the keys)."""
        c = self.config
        grown = int(c.pair_fraction * length + 1e-9) // self.block  # 1e-9: 0.57 * 100 is 56.99...
        return min(max(c.n_queries, grown), c.alphabet**c.key_len)

    def _distinct_keys(self, rng: np.random.Generator, n: int, count: int) -> np.ndarray:
        """(n, count) key ids, distinct within each row, uniformly random ordered draws. Both
        streams draw the same distribution; they differ in when they shuffle the whole space."""
        space = self.config.alphabet**self.config.key_len
        dense = max(DENSE_KEY_SPACE, 8 * count) if self.config.stream == 1 else count / DENSE_FRACTION
        if space <= dense:
            return _random_ordered_subset(rng, n, space, count)
        keys = rng.integers(0, space, size=(n, count), dtype=np.int64)
        while True:  # rounds, not items: each round redraws only the repeated occurrences
            order = np.argsort(keys, axis=1, kind="stable")
            ranked = np.take_along_axis(keys, order, axis=1)
            repeat = np.zeros(keys.shape, dtype=bool)
            repeat[:, 1:] = ranked[:, 1:] == ranked[:, :-1]
            if not repeat.any():
                return keys
            rows, cols = np.nonzero(repeat)
            where = order[rows, cols]
            keys[rows, where] = rng.integers(0, space, size=rows.size, dtype=np.int64)

    def _plant_near_misses(self, rng: np.random.Generator, keys: np.ndarray, asked: np.ndarray) -> np.ndarray:
        """``keys`` (n, P, K) with ``near_misses`` other pairs per query rewritten to share only the
        query's token at ``near_miss_token``; redrawn until the keys of each sample are distinct."""
        c = self.config
        n, pairs, _ = keys.shape
        m, q = c.near_misses, c.n_queries
        if pairs < q * (m + 1):
            raise TaskInputError(f"near_misses={m} needs {q * (m + 1)} pairs, but a context of this "
                                 f"length holds {pairs}: evaluate at a longer length or plant fewer")
        rows = np.arange(n)[:, None]
        draw = rng.random((n, pairs))
        draw[rows, asked] = 2.0  # queried pairs sort last and are never rewritten
        hosts = np.argsort(draw, axis=1, kind="stable")[:, : q * m].reshape(n, q, m)
        queried = np.repeat(keys[rows, asked][:, :, None, :], m, axis=2)  # (n, Q, m, K)
        free = np.arange(c.key_len) != c.near_miss_token - 1
        powers = c.alphabet ** np.arange(c.key_len - 1, -1, -1, dtype=np.int64)
        keys = keys.copy()
        redo = np.ones((n, q, m), dtype=bool)
        for _ in range(1000):
            where = np.nonzero(redo)
            base = queried[where]
            other = rng.integers(0, c.alphabet - 1, size=base.shape, dtype=np.int64)
            keys[where[0], hosts[where]] = np.where(free, other + (other >= base), base)
            ids = keys @ powers
            order = np.argsort(ids, axis=1, kind="stable")
            ranked = np.take_along_axis(ids, order, axis=1)
            same = ranked[:, 1:] == ranked[:, :-1]
            repeated = np.zeros(ids.shape, dtype=bool)
            repeated[:, 1:] |= same
            repeated[:, :-1] |= same
            clash = np.zeros(ids.shape, dtype=bool)
            clash[rows, order] = repeated
            redo = clash[rows[:, :, None], hosts]
            if not redo.any():
                return keys
        raise TaskInputError(f"could not plant {m} near misses per query with distinct keys: too few keys "
                             f"share one token with a query at this alphabet and number of pairs")

    def _generate(self, rng: np.random.Generator, n: int, length: int, split: str) -> TaskBatch:
        c = self.config
        k, v, q, block = c.key_len, c.value_len, c.n_queries, self.block
        pairs = self.n_pairs(length)
        fill = length - pairs * block
        rows = np.arange(n)[:, None]

        key_ids = self._distinct_keys(rng, n, pairs)
        powers = c.alphabet ** np.arange(k - 1, -1, -1, dtype=np.int64)
        keys = (key_ids[:, :, None] // powers) % c.alphabet  # (n, P, K), most significant first
        values = rng.integers(0, c.alphabet, size=(n, pairs, v), dtype=np.int64)

        # Arrange P blocks and F filler tokens: choose which of the P + F slots hold blocks.
        slots = pairs + fill
        chosen = np.argpartition(rng.random((n, slots)), pairs - 1, axis=1)[:, :pairs]
        is_block = np.zeros((n, slots), dtype=bool)
        is_block[rows, chosen] = True
        width = np.where(is_block, block, 1)
        start = np.cumsum(width, axis=1) - width
        block_start = start[is_block].reshape(n, pairs)  # ascending: blocks in context order

        asked = _random_ordered_subset(rng, n, pairs, q)  # (n, Q) indices of queried pairs
        if c.near_misses:
            keys = self._plant_near_misses(rng, keys, asked)

        context = np.full((n, length), self.filler, dtype=np.int64)
        span = block_start[:, :, None] + np.arange(block)
        context[rows[:, :, None], span] = np.concatenate(
            [keys + self.key_offset, values + self.value_offset], axis=2
        )
        q_keys = keys[rows, asked]  # (n, Q, K)
        q_values = values[rows, asked]  # (n, Q, V)

        total = length + 2 + q * block + 1
        ids = np.empty((n, total), dtype=np.int64)
        ids[:, 0] = BOS
        ids[:, 1 : length + 1] = context
        ids[:, length + 1] = SEP
        queries = ids[:, length + 2 : length + 2 + q * block].reshape(n, q, block)
        queries[:, :, :k] = q_keys + self.key_offset
        queries[:, :, k:] = q_values + self.value_offset
        ids[:, -1] = EOS
        mask = np.zeros((n, total), dtype=bool)
        # The prediction of value token j of query i is made at the position just before it.
        scored = length + 2 + np.arange(q)[:, None] * block + np.arange(k - 1, block - 1)
        mask[:, scored.ravel()] = True


        def source() -> list:
            with gc_paused():
                keys_l, values_l = keys.tolist(), values.tolist()
                return [
                    {
                        "pairs": [list(kv) for kv in zip(keys_l[b], values_l[b], strict=True)],
                        "queries": q_keys[b].tolist(),
                    }
                    for b in range(n)
                ]

        return TaskBatch(ids, mask, source, q_values.tolist)


def _random_ordered_subset(rng: np.random.Generator, n: int, size: int, count: int) -> np.ndarray:
    """(n, count) distinct draws from range(size) per row, in uniformly random order.

    The ``count`` smallest of ``size`` uniform floats form a uniform subset; sorting them by their
    float gives a uniform order. Cost O(size) per row plus O(count log count).
    """
    u = rng.random((n, size))
    if count < size:
        idx = np.argpartition(u, count - 1, axis=1)[:, :count]
    else:
        idx = np.broadcast_to(np.arange(size), (n, size))
    order = np.argsort(np.take_along_axis(u, idx, axis=1), axis=1)
    return np.take_along_axis(idx, order, axis=1)
