"""Seconds per evaluated sample at long lengths for a trained run, fused vs chunked entmax paths.

Usage:
    python benchmarks/end_to_end.py RUN_DIR --lengths 16384,65536 [--chunked-up-to 16384] [--n 2]

RUN_DIR is a ``lengthgen run`` folder (its ``model.pt`` and ``config.json``). "chunked" is the
portable torch path (what evaluation used before the fused CPU kernel); "fused" is the default
CPU path now. Both are measured in this one process, side by side, on the same samples.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lengthgen.config import RunConfig
from lengthgen.harness.evaluate import evaluate_length
from lengthgen.harness.run import build
from lengthgen.kernels import cpu_entmax


def load(run_dir: Path) -> tuple[RunConfig, object, torch.nn.Module]:
    config = RunConfig.model_validate(json.loads((run_dir / "config.json").read_text()))
    task, model = build(config)
    state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict(state)
    return config, task, model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--lengths", default="16384,65536")
    parser.add_argument("--chunked-up-to", type=int, default=16384, help="skip the slow path above this")
    parser.add_argument("--n", type=int, default=2, help="samples per length")
    args = parser.parse_args()
    config, task, model = load(args.run_dir)
    real_available = cpu_entmax.fused_available
    print(f"run {args.run_dir.name}: {config.task}/{config.attn}, threads={torch.get_num_threads()}")
    print(f"{'length':>8} {'path':>8} {'s/sample':>10} {'exact':>6}")
    for length in (int(x) for x in args.lengths.split(",")):
        for path in ("fused", "chunked"):
            if path == "chunked" and length > args.chunked_up_to:
                print(f"{length:>8} {path:>8} {'skipped':>10}")
                continue
            cpu_entmax.fused_available = real_available if path == "fused" else (lambda: False)
            start = time.perf_counter()
            result = evaluate_length(model, task, length, length // config.train.train_length,
                                     config.eval, torch.device("cpu"), n_samples=args.n, progress=False)
            per_sample = (time.perf_counter() - start) / args.n
            print(f"{length:>8} {path:>8} {per_sample:>10.2f} {result.exact_match:>6.2f}", flush=True)
    cpu_entmax.fused_available = real_available


if __name__ == "__main__":
    main()
