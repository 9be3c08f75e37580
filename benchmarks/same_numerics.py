"""Whether two checkouts train a recorded run bit for bit alike: the run's recorded config (from a
results file) trained for a few hundred steps by each checkout, in a fresh process each with one
thread and the board's numerics pinned, then the weights and validation histories compared.

`lengthgen verify` compares against recorded rows, which another processor cannot reproduce (its
matrix products round differently); this compares two codes on one machine, so it says whether a
change touched the arithmetic.

    python benchmarks/same_numerics.py leaderboard/data/RUN.parquet --against ../before --steps 300
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The board's numerics pin (leaderboard/plan.toml), so that both sides use the same kernels.
PIN = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2",
       "NUMBA_CPU_NAME": "znver3", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def train(parquet: str, steps: int, out: str) -> None:
    """In this process's lengthgen: the recorded config, ``steps`` steps, validation three times."""
    import pandas as pd
    import torch

    from lengthgen.config import RunConfig
    from lengthgen.harness.run import build
    from lengthgen.harness.train import train as train_model

    torch.set_num_threads(1)
    config = RunConfig.model_validate_json(pd.read_parquet(parquet)["config_json"].iloc[0])
    data = config.model_dump(mode="json")
    data["train"].update(steps=steps, val_every=max(1, steps // 3))
    config = RunConfig.model_validate(data)
    task, model = build(config)
    result = train_model(model, task, config, torch.device("cpu"), progress=False)
    torch.save(model.state_dict(), out + ".pt")
    Path(out + ".json").write_text(json.dumps(result.history))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("parquet", nargs="?", help="a results file of the run to train")
    parser.add_argument("--against", type=Path, help="the other checkout")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        train(args.worker[0], int(args.worker[1]), args.worker[2])
        return
    if not args.parquet or not args.against:
        parser.error("give a results file and --against CHECKOUT")
    import torch

    folder = Path(tempfile.mkdtemp(prefix="same-numerics-"))
    outs = {}
    for side, checkout in (("this", HERE.parent), ("other", args.against.resolve())):
        outs[side] = str(folder / side)
        env = {**os.environ, **PIN, "PYTHONPATH": str(checkout)}
        worker = [sys.executable, __file__, "--worker", str(Path(args.parquet).resolve()), str(args.steps),
                  outs[side]]
        subprocess.run(worker, env=env, check=True, cwd=checkout)
    a, b = (torch.load(outs[s] + ".pt") for s in ("this", "other"))
    weights = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    history = Path(outs["this"] + ".json").read_text() == Path(outs["other"] + ".json").read_text()
    print(f"{Path(args.parquet).stem}, {args.steps} steps: weights {'identical' if weights else 'DIFFER'}, "
          f"validation history {'identical' if history else 'DIFFERS'}")
    if not (weights and history):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
