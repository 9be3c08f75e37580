"""Milliseconds per training step of a quick-preset model, α-entmax row kernel on and off, vs softmax.

Side by side in one process, on one fixed batch: a full optimizer step (forward, masked loss,
backward, AdamW) of the task's quick model with ``softmax``, and with an α-entmax backend whose
materialized attention uses the numba row kernel (``kernel``) or the exact torch reference that
sorts every row (``torch``). Reports the median over the repeats and the ratios.

    python benchmarks/train_step.py --task copy --train-length 64 --attn entmax asentmax
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from typing import Any
from unittest import mock

import torch

from lengthgen.config import build_run_config
from lengthgen.harness.batches import ModelBatch, masked_loss
from lengthgen.harness.run import build
from lengthgen.kernels.cpu import entmax_rows
from lengthgen.kernels.cpu.jit import Kernel


def _switched_off() -> None:
    raise RuntimeError("switched off for the comparison")


#: The row solver made unavailable: the engine then takes the torch reference (and would warn).
WITHOUT_KERNEL = Kernel(entmax_rows.KERNEL.what, _switched_off, lambda kernel: None)


def step_ms(task_name: str, attn: str, length: int, repeats: int, preset: str = "quick",
            overrides: dict[str, Any] | None = None) -> float:
    config = build_run_config(task_name, attn, preset=preset,
                              overrides={**(overrides or {}), "train.train_length": length})
    task, model = build(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = ModelBatch.from_task(task.sample(config.train.batch_size, length, seed=0, split="train"), "cpu")

    def step() -> None:
        loss = masked_loss(model(batch.input_ids, batch.query_positions), batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    for _ in range(2):
        step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="copy")
    parser.add_argument("--train-length", type=int, default=64)
    parser.add_argument("--attn", nargs="+", default=["entmax", "asentmax"])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    base = step_ms(args.task, "softmax", args.train_length, args.repeats)
    print(f"{args.task}, L={args.train_length}, {torch.get_num_threads()} threads")
    print(f"{'backend':<12} {'path':<7} {'ms/step':>8} {'/ softmax':>10}")
    print(f"{'softmax':<12} {'-':<7} {base:>8.1f} {1.0:>10.2f}")
    for attn in args.attn:
        fast = step_ms(args.task, attn, args.train_length, args.repeats)
        with mock.patch.object(entmax_rows, "KERNEL", WITHOUT_KERNEL), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            slow = step_ms(args.task, attn, args.train_length, args.repeats)
        print(f"{attn:<12} {'kernel':<7} {fast:>8.1f} {fast / base:>10.2f}")
        print(f"{attn:<12} {'torch':<7} {slow:>8.1f} {slow / base:>10.2f}"
              f"   (kernel: {slow / fast:.2f}x faster)")


if __name__ == "__main__":
    main()
