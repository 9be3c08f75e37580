"""Generator throughput: tokens/s of ``Task.sample`` per built-in task at short, long and huge lengths.

Evaluation at 1024x the training length needs samples of ~65k tokens; generation must stay far
cheaper than the forward pass, hence the target of >= 2M tokens/s at 65,536 on one core. The
timing covers the whole ``sample`` call, including the structured source/target lists.

    python benchmarks/generators.py [--repeats 3] [--tasks copy,mqmtar]
"""

from __future__ import annotations

import argparse
import time

from lengthgen.tasks import TASKS, get_task

#: (length, samples per call)
CASES: tuple[tuple[int, int], ...] = ((64, 64), (4096, 16), (65536, 4))
TARGET_TOKENS_PER_S = 2e6


def best_time(task_name: str, length: int, n: int, repeats: int) -> tuple[float, int]:
    """Best wall time of ``repeats`` calls (the least disturbed by other processes) and tokens made."""
    task = get_task(task_name)
    best, tokens = float("inf"), 0
    for r in range(repeats):
        t0 = time.perf_counter()
        batch = task.sample(n, length, seed=r, split="eval")
        best = min(best, time.perf_counter() - t0)
        tokens = batch.input_ids.size
    return best, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tasks", default="", help="comma-separated names (default: all built-ins)")
    args = parser.parse_args()
    names = args.tasks.split(",") if args.tasks else [e.name for e in TASKS.entries() if e.builtin]

    head = "".join(f"{f'tok/s @ {length}':>16}" for length, _ in CASES)
    print(f"{'task':<15}{head}{'s/sample @ 65536':>18}  target")
    failed = []
    for name in names:
        cells, per_sample, last_rate = [], 0.0, 0.0
        for length, n in CASES:
            seconds, tokens = best_time(name, length, n, args.repeats)
            last_rate = tokens / seconds
            cells.append(f"{last_rate / 1e6:>13.2f} M ")
            per_sample = seconds / n
        ok = last_rate >= TARGET_TOKENS_PER_S
        failed += [] if ok else [name]
        print(f"{name:<15}{''.join(cells)}{per_sample:>18.4f}  {'ok' if ok else 'MISSED'}")
    if failed:
        raise SystemExit(f"under {TARGET_TOKENS_PER_S / 1e6:.0f}M tokens/s at 65536: {', '.join(failed)}")


if __name__ == "__main__":
    main()
