"""The task interface: deterministic, vectorized generators of token sequences plus loss masks.

A task turns (length, seed, split) into a batch of equally long sequences. Randomness comes only
from a generator seeded by ``SeedSequence([task_id, split_id, length, *seed])``: no global RNG,
byte-identical data on any machine, and train / eval streams that never share a seed.
"""

from __future__ import annotations

import gc
import zlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lengthgen import limits
from lengthgen.errors import UserError

Split = Literal["train", "eval"]
SPLITS: tuple[str, ...] = ("train", "eval")
_SPLIT_IDS = {"train": 1, "eval": 2}

PAD, BOS, SEP, EOS = 0, 1, 2, 3
SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<sep>", "<eos>")


#: The parameter that names which version of a task's generator made its data (see ``Task.latest_stream``).
STREAM = "stream"


class TaskConfig(BaseModel):
    """Typed task parameters; unknown fields are rejected so a typo never passes silently.

    ``stream`` versions the generator itself: a faster or corrected generator that draws other
    samples is a new stream, so a config recorded before it keeps making its data bit for bit.
    A config without ``stream`` means stream 1, the first; new runs get the task's latest
    (``lengthgen.tasks.new_task_params``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream: int = Field(1, ge=1, strict=True,
                        description="version of the generator's random stream (1: the first; new runs get "
                        "the task's latest)")


class TaskInputError(UserError, ValueError):
    """Bad arguments to a task (length under the minimum or over the limit, n ≤ 0, unknown split)."""


@dataclass(frozen=True)
class Vocab:
    """Token ids ↔ readable strings. Ids 0–3 are always ``<pad> <bos> <sep> <eos>``."""

    tokens: tuple[str, ...]

    @classmethod
    def with_specials(cls, symbols: Sequence[str]) -> Vocab:
        return cls(SPECIALS + tuple(symbols))

    @property
    def size(self) -> int:
        return len(self.tokens)

    def decode(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        return [self.tokens[int(i)] for i in ids]


class TaskBatch:
    """n sequences of one length.

    ``input_ids[b, t]`` is the model input; ``loss_mask[b, t]`` is True where the prediction made
    at position t (of token t + 1) is scored. ``source`` / ``target`` hold the structured,
    JSON-ready view of each sample for inspection and independent checking. A task may pass them
    as zero-argument functions: the view is then built on first use, so training, which reads
    only the arrays, never pays for ~10^4 small Python lists per batch.
    """

    __slots__ = ("input_ids", "loss_mask", "_source", "_target")

    def __init__(self, input_ids: np.ndarray, loss_mask: np.ndarray,
                 source: list[Any] | Callable[[], list[Any]],
                 target: list[Any] | Callable[[], list[Any]]) -> None:
        self.input_ids = input_ids  # (n, T) int64
        self.loss_mask = loss_mask  # (n, T) bool
        self._source, self._target = source, target

    @property
    def source(self) -> list[Any]:
        if callable(self._source):
            self._source = self._source()
        return self._source

    @property
    def target(self) -> list[Any]:
        if callable(self._target):
            self._target = self._target()
        return self._target

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@contextmanager
def _as_task_input() -> Iterator[None]:
    """A limit broken by a task's arguments is a :class:`TaskInputError` (a ``ValueError`` too)."""
    try:
        yield
    except UserError as exc:
        raise TaskInputError(str(exc)) from None


def task_id(name: str) -> int:
    """Stable 32-bit id of a task name (crc32: identical in every process and on every machine)."""
    return zlib.crc32(name.encode("utf-8"))


class Task(ABC):
    """Base class of every task. Subclasses set the class attributes and implement ``_generate``.

    Subclasses get for free: argument validation, seeding, the training range, and registration
    with the CLI, the harness, results and plots.
    """

    name: ClassVar[str]
    description: ClassVar[str]
    Config: ClassVar[type[TaskConfig]] = TaskConfig
    #: What "length" counts for this task (shown in ``lengthgen tasks --describe``).
    length_unit: ClassVar[str] = "source tokens"
    #: Whether the model view is ``bos source sep target eos`` (False: the task says how).
    has_sep: ClassVar[bool] = True
    #: The newest version of this task's generator stream (``TaskConfig.stream``); a task raises it
    #: when a change of its generator would draw other samples, and keeps the older streams.
    latest_stream: ClassVar[int] = 1

    def __init__(self, config: TaskConfig | None = None, **params: Any) -> None:
        if config is not None and params:
            raise TaskInputError("pass either a config or keyword parameters, not both")
        self.config = config if config is not None else self.Config(**params)
        if self.config.stream > self.latest_stream:
            streams = ", ".join(str(s) for s in range(1, self.latest_stream + 1))
            raise TaskInputError(f"task {self.name!r} has no stream {self.config.stream}; "
                                 f"valid streams: {streams}")

    # -- what every task defines: properties, or plain class attributes for constants -----------
    #: (A ``functools.cached_property`` suits ``vocab``: the config is frozen, and vocabularies can
    #: have ~10^5 entries.)
    @property
    @abstractmethod
    def vocab(self) -> Vocab: ...

    @property
    @abstractmethod
    def min_length(self) -> int: ...

    @property
    @abstractmethod
    def default_train_length(self) -> int: ...

    def train_range(self, train_length: int | None = None,
                    min_train_length: int | None = None) -> tuple[int, int]:
        """The lengths training draws from, uniformly: [min_train_length, L] with L the training
        length (default: the task's), the low end L/2 by default and never under the minimum."""
        top = train_length or self.default_train_length
        low = min_train_length if min_train_length is not None else top // 2
        return max(self.min_length, min(low, top)), top

    # -- sampling ---------------------------------------------------------------------------
    def rng(self, length: int, seed: int | Sequence[int], split: str) -> np.random.Generator:
        seeds = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
        with _as_task_input():
            for part in seeds:
                limits.check_seed(part)
        entropy = [task_id(self.name), _SPLIT_IDS[split], int(length), *seeds]
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy)))

    def check_args(self, n: int, length: int, split: str) -> None:
        if split not in _SPLIT_IDS:
            raise TaskInputError(f"unknown split {split!r}; valid splits: {', '.join(SPLITS)}")
        if n <= 0:
            raise TaskInputError(f"n must be positive, got {n}")
        if length <= 0:
            raise TaskInputError(f"length must be positive, got {length}")
        if length < self.min_length:
            raise TaskInputError(
                f"length {length} is under the minimum of task {self.name!r} "
                f"({self.min_length} {self.length_unit})"
            )
        with _as_task_input():
            limits.check_sample_size(n, length)

    def sample(
        self, n: int, length: int, seed: int | Sequence[int] = 0, split: str = "train"
    ) -> TaskBatch:
        """n samples of size ``length``; a pure function of (task config, n, length, seed, split)."""
        self.check_args(n, length, split)
        batch = self._generate(self.rng(length, seed, split), n, length, split)
        assert batch.input_ids.shape == batch.loss_mask.shape
        return batch

    @abstractmethod
    def _generate(
        self, rng: np.random.Generator, n: int, length: int, split: str
    ) -> TaskBatch: ...

    def key_role(self, ids: np.ndarray, row: int, key: int) -> str | None:
        """What position ``key`` of the sequence ``ids`` is to the answer token predicted at the
        scored position ``row`` ("matching pair", "filler", …), so that `lengthgen heads` can say
        where a head looks when an answer goes wrong; None where the task names no roles."""
        return None

    # -- helpers shared by tasks ---------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Parameters, defaults, vocabulary: what ``lengthgen tasks --describe`` prints."""
        return {
            "name": self.name,
            "description": self.description,
            "length_unit": self.length_unit,
            "min_length": self.min_length,
            "default_train_length": self.default_train_length,
            "train_range": list(self.train_range()),
            "parameters": self.config.model_dump(),
            "vocab_size": self.vocab.size,
            "vocab": list(self.vocab.tokens),
        }


def seq2seq_view(source_ids: np.ndarray, target_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lay out ``bos source sep target eos`` and score the predictions of the target tokens.

    Both inputs are (n, S) / (n, L) arrays of token ids. The prediction of target token k is made
    at the position just before it, so the mask is True on ``sep`` and the target tokens but the
    last one.
    """
    n, s = source_ids.shape
    t = target_ids.shape[1]
    ids = np.empty((n, s + t + 3), dtype=np.int64)
    ids[:, 0] = BOS
    ids[:, 1 : s + 1] = source_ids
    ids[:, s + 1] = SEP
    ids[:, s + 2 : s + 2 + t] = target_ids
    ids[:, -1] = EOS
    mask = np.zeros(ids.shape, dtype=bool)
    mask[:, s + 1 : s + 1 + t] = True
    return ids, mask


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building the JSON-ready source/target lists.

    At 65k items those are ~10^5 small lists, whose allocation triggers repeated collections that
    cost more than the building itself; the lists hold only ints and strings, so no cycle forms.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
