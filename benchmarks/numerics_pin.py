"""Milliseconds per training step under a plan's numerics pin against the host's own instruction
sets, side by side: what pinning a board (``numerics`` in the plan) costs in speed.

The pins are read when torch and numba load, so every measurement runs in a fresh process, the two
modes alternating round by round (one thread each, the same fixed batch as ``train_step.py``).
Each line: the median over rounds of each mode's per-process median, their ratio, and the
instruction sets each process reported (``cpu_isa``, as result rows record it).

    python benchmarks/numerics_pin.py --plan leaderboard/plan.toml --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

#: (task, backend, preset, settings): the board's costliest training steps (MQMTAR, width-256 copy).
CASES = (
    ("mqmtar", "softmax", "paper-tasks", {}),
    ("mqmtar", "asentmax", "paper-tasks", {}),
    ("copy", "softmax", "paper-tasks", {"arch.d_model": 256, "arch.n_heads": 16, "arch.d_ff": 1024}),
    ("copy", "entmax", "paper-tasks", {"arch.d_model": 256, "arch.n_heads": 16, "arch.d_ff": 1024}),
)


def child(case: int, length: int, repeats: int) -> None:
    """One measurement in this process: print its milliseconds per step and instruction sets."""
    from train_step import step_ms

    from lengthgen.provenance import cpu_isa

    task, attn, preset, settings = CASES[case]
    ms = step_ms(task, attn, length, repeats, preset=preset, overrides=settings)
    print(json.dumps({"ms": ms, "isa": cpu_isa()}))


def measure(case: int, pins: dict[str, str], pinned: bool, length: int, repeats: int) -> tuple[float, str]:
    """(ms per step, instruction sets) of one fresh process, pinned or with the host's own."""
    env = {k: v for k, v in os.environ.items() if k not in pins}
    env.update({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(pins if pinned else {})})
    done = subprocess.run([sys.executable, __file__, "--child", str(case), "--train-length", str(length),
                           "--repeats", str(repeats)], env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return float(result["ms"]), str(result["isa"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="leaderboard/plan.toml", help="plan file whose numerics to pin")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-length", type=int, default=64)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.train_length, args.repeats)
        return
    from lengthgen.plans.plan import load_plan

    pins = load_plan(Path(args.plan)).numerics
    print(f"pins: {' '.join(f'{k}={v}' for k, v in pins.items())}; L={args.train_length}, 1 thread, "
          f"{args.rounds} rounds of {args.repeats} steps; load average {os.getloadavg()[0]:.2f}")
    print(f"{'task':<7} {'backend':<9} {'host ms':>8} {'pinned ms':>10} {'pinned/host':>12}  "
          "instruction sets (host; pinned)")
    for case, (task, attn, _, _) in enumerate(CASES):
        runs: dict[bool, list[tuple[float, str]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for pinned in (False, True):
                runs[pinned].append(measure(case, pins, pinned, args.train_length, args.repeats))
        host, pin = (statistics.median(ms for ms, _ in runs[mode]) for mode in (False, True))
        isas = "; ".join(", ".join(sorted({isa for _, isa in runs[mode]})) for mode in (False, True))
        print(f"{task:<7} {attn:<9} {host:>8.1f} {pin:>10.1f} {pin / host:>12.2f}  {isas}")

if __name__ == "__main__":
    main()
