"""Generator throughput: tokens/s of ``Task.sample`` per built-in task, for training and at short,
long and huge lengths.

Training: a batch of the task's ``paper-tasks`` preset (its batch size, its training lengths, its
task parameters and the stream new runs get) must cost far less than a training step, hence the
target of >= 5M tokens/s on one core; the timing covers the whole ``sample`` call (training never
reads the structured source/target view, which is built on first use and timed on its own).
Evaluation at 1024x the training length needs samples of ~65k tokens, hence >= 2M tokens/s at
65,536, there with the view built (the default task parameters).

    python benchmarks/generators.py [--repeats 3] [--tasks copy,mqmtar]
"""

from __future__ import annotations

import argparse
import time

from lengthgen.config import build_run_config
from lengthgen.harness.train import train_lengths
from lengthgen.tasks import TASKS, get_task

#: (length, samples per call)
CASES: tuple[tuple[int, int], ...] = ((64, 64), (4096, 16), (65536, 4))
TARGET_TOKENS_PER_S = 2e6
TARGET_TRAINING_TOKENS_PER_S = 5e6


def best_time(task_name: str, length: int, n: int, repeats: int) -> tuple[float, int]:
    """Best wall time of ``repeats`` calls (the least disturbed by other processes) and tokens made,
    structured view included."""
    task = get_task(task_name)
    best, tokens = float("inf"), 0
    for r in range(repeats):
        t0 = time.perf_counter()
        batch = task.sample(n, length, seed=r, split="eval")
        batch.source, batch.target  # noqa: B018 - built on first use: part of this case
        best = min(best, time.perf_counter() - t0)
        tokens = batch.input_ids.size
    return best, tokens


def training_rate(task_name: str, repeats: int, stream: int | None = None) -> tuple[float, float, int, int]:
    """(tokens/s of the batches a paper-tasks run trains on, tokens/s with the structured view
    built too, batch size, longest length): the best of ``repeats`` passes over 20 of the run's
    steps, each at the length the run draws for it."""
    import numpy as np

    config = build_run_config(task_name, "softmax", preset="paper-tasks")
    task = get_task(task_name, **{**config.task_params, **({} if stream is None else {"stream": stream})})
    lengths = train_lengths(task, config)[:20]
    n = config.train.batch_size
    best = best_viewed = float("inf")
    tokens = 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        batches = [task.sample(n, int(length), seed=(0, step)) for step, length in enumerate(lengths)]
        t1 = time.perf_counter()
        for batch in batches:
            batch.source, batch.target  # noqa: B018
        t2 = time.perf_counter()
        best, best_viewed = min(best, t1 - t0), min(best_viewed, t2 - t0)
        tokens = int(np.sum([b.input_ids.size for b in batches]))
    return tokens / best, tokens / best_viewed, n, int(lengths.max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", default="", help="comma-separated names (default: all built-ins)")
    args = parser.parse_args()
    names = args.tasks.split(",") if args.tasks else [e.name for e in TASKS.entries() if e.builtin]

    print("training batches (paper-tasks preset), one core:")
    print(f"{'task':<15}{'batch':>6}{'length':>8}{'tok/s':>12}{'with view':>12}  target")
    failed = []
    for name in names:
        rate, viewed, n, longest = training_rate(name, args.repeats)
        ok = rate >= TARGET_TRAINING_TOKENS_PER_S
        failed += [] if ok else [f"{name} (training)"]
        print(f"{name:<15}{n:>6}{longest:>8}{rate / 1e6:>10.2f} M{viewed / 1e6:>10.2f} M  "
              f"{'ok' if ok else 'MISSED'}")
        for stream in range(1, TASKS.get(name).latest_stream):  # older streams: recorded runs only
            rate, viewed, n, longest = training_rate(name, args.repeats, stream)
            label = f"  stream {stream}"
            print(f"{label:<15}{n:>6}{longest:>8}{rate / 1e6:>10.2f} M{viewed / 1e6:>10.2f} M  "
                  "(recorded runs only)")
    print("\nevaluation lengths (default parameters, structured view built):")
    head = "".join(f"{f'tok/s @ {length}':>16}" for length, _ in CASES)
    print(f"{'task':<15}{head}{'s/sample @ 65536':>18}  target")
    for name in names:
        cells, per_sample, last_rate = [], 0.0, 0.0
        for length, n in CASES:
            seconds, tokens = best_time(name, length, n, args.repeats)
            last_rate = tokens / seconds
            cells.append(f"{last_rate / 1e6:>13.2f} M ")
            per_sample = seconds / n
        ok = last_rate >= TARGET_TOKENS_PER_S
        failed += [] if ok else [f"{name} (65536)"]
        print(f"{name:<15}{''.join(cells)}{per_sample:>18.4f}  {'ok' if ok else 'MISSED'}")
    if failed:
        raise SystemExit(f"under target: {', '.join(failed)}")


if __name__ == "__main__":
    main()
