"""Seconds per evaluated sample of a trained run at long lengths, against one SDPA call of the same shape.

Usage:
    python benchmarks/end_to_end.py RUN_DIR --lengths 16384,65536 [--chunked-up-to 16384] [--n 2]

RUN_DIR is a ``lengthgen run`` folder (its ``model.pt`` and ``config.json``). For each length, in
this one process on the same samples: ``engine`` is the evaluation as it runs (the attention
engine's default paths), ``chunked`` forces the generic chunked path (what evaluation of the
softmax family used before the fused CPU kernels), and ``sdpa`` is one causal
``scaled_dot_product_attention`` call of the model's shape (B=1, its heads and head size, the
sample's token count): the cost of a single dense attention layer, the yardstick of the target.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from lengthgen.config import RunConfig
from lengthgen.harness.evaluate import evaluate_length, sequence_tokens
from lengthgen.harness.run import build
from lengthgen.kernels import engine


def load(run_dir: Path) -> tuple[RunConfig, object, torch.nn.Module]:
    config = RunConfig.model_validate(json.loads((run_dir / "config.json").read_text()))
    task, model = build(config)
    state = torch.load(run_dir / "model.pt", map_location="cpu", weights_only=False)["state_dict"]
    model.load_state_dict(state)
    return config, task, model.eval()


def sdpa_seconds(tokens: int, heads: int, d_head: int) -> float:
    """Best of two causal SDPA calls of shape (1, heads, tokens, d_head)."""
    g = torch.Generator().manual_seed(tokens)
    q, k, v = (torch.randn(1, heads, tokens, d_head, generator=g) for _ in range(3))
    best = float("inf")
    with torch.no_grad():
        for _ in range(2):
            start = time.perf_counter()
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--lengths", default="16384,65536", help="evaluation lengths (task units)")
    parser.add_argument("--chunked-up-to", type=int, default=16384, help="skip the slow path above this")
    parser.add_argument("--n", type=int, default=2, help="samples per length")
    args = parser.parse_args()
    config, task, model = load(args.run_dir)
    real_choice = engine._fused_or_chunked
    heads, d_head = model.config.n_heads, model.config.d_head
    print(f"run {args.run_dir.name}: {config.task}/{config.attn}, threads={torch.get_num_threads()}")
    print(f"{'length':>8} {'tokens':>8} {'path':>8} {'s/sample':>10} {'/SDPA':>7} {'exact':>6}")
    for length in (int(x) for x in args.lengths.split(",")):
        tokens = sequence_tokens(task, length)
        base = sdpa_seconds(tokens, heads, d_head)
        print(f"{length:>8} {tokens:>8} {'sdpa':>8} {base:>10.2f} {1.0:>7.2f}", flush=True)
        for path in ("engine", "chunked"):
            if path == "chunked" and length > args.chunked_up_to:
                print(f"{length:>8} {tokens:>8} {path:>8} {'skipped':>10}")
                continue
            engine._fused_or_chunked = real_choice if path == "engine" else (lambda *_: "chunked")  # type: ignore[assignment]
            try:
                start = time.perf_counter()
                result = evaluate_length(model, task, length, length // config.train.train_length,
                                         config.eval, torch.device("cpu"), n_samples=args.n, progress=False)
                per_sample = (time.perf_counter() - start) / args.n
            finally:
                engine._fused_or_chunked = real_choice  # type: ignore[assignment]
            print(f"{length:>8} {tokens:>8} {path:>8} {per_sample:>10.2f} {per_sample / base:>7.2f} "
                  f"{result.exact_match:>6.2f}", flush=True)


if __name__ == "__main__":
    main()
