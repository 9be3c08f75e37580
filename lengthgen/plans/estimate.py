"""CPU-time estimates for missing work, from the timings that recorded runs carry.

Every run records ``train_seconds`` and, per evaluated length, ``eval_seconds`` and ``n_samples``.
A missing run is estimated from recorded runs of the same task and backend: seconds per training
step at the same model size, batch, task parameters and training length, and seconds per test
sample at each evaluation length it will be tested at. Where nothing comparable was recorded,
fewer keys must match (the same task and backend at any size, then the task alone), and the
recorded seconds are scaled by the arithmetic of the two shapes (`_work_of`: tokens times the
multiply-adds per token of the model's matrices and attention); where nothing matches, the
estimate is unknown and says so. A scaled estimate is rough: small matrices run less efficiently
on a CPU, so it tends to overestimate a larger model (width 128 to 256 on copy: 3.9x predicted,
2.3-2.6x measured) and a much longer sequence (MQMTAR from 8x to 1024x: 2.6x too high).

Where no recorded run of the task is comparable at all (a first run, a new task), a stated cost
model stands in: ``MODEL_STEP_SECONDS`` per unit of training work plus ``MODEL_STEP_OVERHEAD``
(the interpreter's share of a small step), and ``MODEL_SAMPLE_SECONDS`` plus
``MODEL_SAMPLE_OVERHEAD`` per test sample, measured on the 2-core development VM with one thread
(``benchmarks/train_step.py``: a paper-tasks MQMTAR softmax step, 110 ms; the board's MQMTAR
softmax evaluations: 3 ms a sample at 1×, 11 s at 1024×). It is rough by a factor of two either
way, and the listing marks every estimate it makes.

Runs recorded by code that computes as today's does (the rows' ``numerics_version``) come first:
only where none of them matches at any length are older runs used. Older code ran at another
speed: MQMTAR at 1024x took 12-31 s per test sample in rows older than the numerics version
(two threads), 82 s under version 2 with one thread; one median over both hid a 3-6x
underestimate.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

from lengthgen.config import RunConfig
from lengthgen.provenance import NUMERICS_VERSION

#: The cost model where nothing comparable is recorded (see the module docstring): seconds per unit
#: of ``_work_of`` for a training step (forward, backward, optimizer) and for a test sample.
MODEL_STEP_SECONDS = 9e-11
MODEL_STEP_OVERHEAD = 0.01
MODEL_SAMPLE_SECONDS = 5e-12
MODEL_SAMPLE_OVERHEAD = 3e-3

#: (task, backend, shape) -> length -> [(seconds, work)]: the work lets another shape scale them.
Table = dict[tuple[str, str, str], dict[int, list[tuple[float, float]]]]


@dataclass(frozen=True)
class Timings:
    """Per-step training and per-sample evaluation seconds of recorded runs, by (task, backend,
    model size) and length: first those of today's numerics, then all of them."""

    steps: tuple[Table, Table]
    samples: tuple[Table, Table]

    @classmethod
    def from_rows(cls, rows: pd.DataFrame) -> Timings:
        steps: tuple[Table, Table] = ({}, {})
        samples: tuple[Table, Table] = ({}, {})
        if rows.empty:
            return cls(steps, samples)
        ok = rows[rows["status"] == "ok"]
        version = ok["numerics_version"] if "numerics_version" in ok else pd.Series(float("nan"), ok.index)
        frame = ok.assign(arch=[_arch(c) for c in ok["config_json"]], current=version == NUMERICS_VERSION)
        for _, run in frame.drop_duplicates("run_id").iterrows():
            if pd.notna(run["train_seconds"]) and pd.notna(run["steps"]) and run["steps"] > 0:
                length = int(run["train_length"])
                per = float(run["train_seconds"]) / float(run["steps"])
                _add(steps, run, length, per, _recorded_work(run["config_json"], length, per_step=True))
        for _, row in frame.iterrows():
            if pd.notna(row["eval_seconds"]) and pd.notna(row["n_samples"]) and row["n_samples"] > 0:
                length = int(row["eval_length"])
                per = float(row["eval_seconds"]) / float(row["n_samples"])
                _add(samples, row, length, per, _recorded_work(row["config_json"], length, per_step=False))
        return cls(steps, samples)

    @classmethod
    def from_folders(cls, *folders: Path | None) -> Timings:
        """Timings of the runs under sweep folders (their ``data/``), or folders of sweep folders
        (an ablations folder); missing folders are skipped."""
        from lengthgen.harness.storage.results import load_results

        frames = []
        for folder in folders:
            if folder is None or not folder.is_dir():
                continue
            data = [folder / "data"] if (folder / "data").is_dir() else sorted(folder.glob("*/data"))
            frames += [load_results(d) for d in data]
        frames = [f for f in frames if not f.empty]
        return cls.from_rows(pd.concat(frames, ignore_index=True) if frames else pd.DataFrame())

    def train_seconds(self, config: RunConfig) -> float | None:
        dumped = config.model_dump(mode="json")
        length = config.train.train_length
        work = _work_of(dumped, length) * config.train.batch_size
        per = _lookup(self.steps, config.task, config.attn, _shape(dumped), length, work)
        modelled = MODEL_STEP_OVERHEAD + work * MODEL_STEP_SECONDS
        return (modelled if per is None else per) * config.train.steps

    def eval_seconds(self, config: RunConfig, factors: Iterable[int]) -> float | None:
        dumped = config.model_dump(mode="json")
        total = 0.0
        for factor in factors:
            length = config.train.train_length * factor
            work = _work_of(dumped, length)
            per = _lookup(self.samples, config.task, config.attn, _shape(dumped), length, work)
            if per is None:
                per = MODEL_SAMPLE_OVERHEAD + work * MODEL_SAMPLE_SECONDS
            total += per * _samples(config, length)
        return total

    def task_recorded(self, config: RunConfig) -> bool:
        """Whether any run of this task was recorded: if not, the estimate is the cost model's."""
        return (config.task, "", "") in self.steps[1]

    def size_recorded(self, config: RunConfig) -> bool:
        """Whether runs of this task and backend were recorded at this model size and batch: if
        not, the estimate was scaled from another size."""
        return (config.task, config.attn, _shape(config.model_dump(mode="json"))) in self.steps[1]


def _keys(task: str, attn: str, arch: str) -> list[tuple[str, str, str]]:
    """From the most to the least specific: what a lookup falls back through."""
    return [(task, attn, arch), (task, attn, ""), (task, "", "")]


def _add(tables: tuple[Table, Table], row: Any, length: int, seconds: float, work: float | None) -> None:
    """Into the table of today's numerics (if the row is of them) and the table of all runs."""
    if work is None:  # a config without a model size: nothing to compare it with
        return
    for table in tables if row["current"] else tables[1:]:
        for key in _keys(str(row["task"]), str(row["attn"]), str(row["arch"])):
            table.setdefault(key, {}).setdefault(length, []).append((seconds, work))


def _lookup(tables: tuple[Table, Table], task: str, attn: str, arch: str, length: int,
            work: float) -> float | None:
    """From the first table with anything comparable: the median at this length, most specific
    key first; failing that, the nearest recorded length of the most specific key. A recorded time
    of another shape or length is scaled by the ratio of the work (a rough guess)."""
    for table in tables:
        found = _lookup_in(table, task, attn, arch, length, work)
        if found is not None:
            return found
    return None


def _lookup_in(table: Table, task: str, attn: str, arch: str, length: int, work: float) -> float | None:
    keys = [k for k in _keys(task, attn, arch) if k in table]
    for key in keys:
        if length in table[key]:
            return _median(table[key][length], work)
    for key in keys:
        nearest = min(table[key], key=lambda recorded: (abs(math.log(recorded / length)), recorded))
        return _median(table[key][nearest], work)
    return None


def _median(entries: list[tuple[float, float]], work: float) -> float:
    """Of the recorded seconds, each scaled to ``work`` (a factor of exactly 1 for the same shape)."""
    return statistics.median(seconds * work / recorded for seconds, recorded in entries)


def _work_of(config: dict[str, Any], length: int) -> float:
    """Multiply-adds per sequence of ``length`` task symbols, in arbitrary units: per token, the
    projections and FFN of every layer (4·d² + 2·d·d_ff) plus attention over the prefix (2·d·length)."""
    arch = config["arch"]
    d, layers, d_ff = int(arch["d_model"]), int(arch["n_layers"]), int(arch["d_ff"])
    return float(length) * layers * (4 * d * d + 2 * d * d_ff + 2 * d * length)


def _recorded_work(config_json: str, length: int, per_step: bool) -> float | None:
    """The work of a recorded sequence (a whole training step: times the batch); None when the
    recorded config cannot be read."""
    try:
        config = json.loads(config_json)
        return _work_of(config, length) * (int(config["train"]["batch_size"]) if per_step else 1)
    except (TypeError, ValueError, KeyError):
        return None


def _shape(config: dict[str, Any]) -> str:
    """What sets the cost of a step besides the length: the model size, the batch and the task's
    parameters (MQMTAR's alphabet sets the vocabulary)."""
    return json.dumps([config["arch"], config["train"]["batch_size"], config.get("task_params", {})],
                      sort_keys=True)


def _arch(config_json: str) -> str:
    try:
        return _shape(json.loads(config_json))
    except (TypeError, ValueError, KeyError):
        return ""


def _samples(config: RunConfig, length: int) -> int:
    params = json.dumps(config.task_params, sort_keys=True)
    return config.eval.samples_at(_sequence_tokens(config.task, params, length))


@lru_cache(maxsize=4096)
def _sequence_tokens(task: str, params: str, length: int) -> int:
    from lengthgen.harness.evaluate import sequence_tokens
    from lengthgen.tasks import get_task

    return sequence_tokens(get_task(task, **json.loads(params)), length)


def total(values: Sequence[float | None]) -> tuple[float, int]:
    """The sum of the known estimates and the number of unknown ones."""
    return sum(v for v in values if v is not None), sum(v is None for v in values)
