"""Milliseconds per training step of the real training loop, split into data / forward / backward /
optimizer, this checkout against another one, side by side in one sitting.

The loop timed is ``lengthgen.harness.train.train`` itself, on its own stream of batches (one
length per step, drawn as a run draws it), not a fixed batch. Its phases are timed by wrapping what
the loop calls, so an older checkout is timed the same way without changing it:

- a step runs from one ``lr_at`` call (the loop's first statement) to the next;
- forward is ``Transformer.forward``, backward ``Tensor.backward``, optimizer ``clip_grad_norm_``
  plus ``AdamW.step``;
- data is the rest of the step: making (or waiting for) the batch, the loss, the bookkeeping.

Each (checkout, task, backend) runs in a fresh process with one torch thread, at the task's
``paper-tasks`` preset; the first ``--skip`` steps (allocator and kernel warm-up) and the last
(validation) are left out, and each phase is the median over the remaining steps. Checkouts
alternate within every repeat, so a busy machine slows both sides alike.

    python benchmarks/train_step.py --against ../baseline --tasks mqmtar --attn softmax asentmax

With softmax among the backends, the last column divides each backend's step by softmax's on the
same task and side: what the backend costs beyond the model (the baselines run without position
embedding on the board: ``--attn softmax fox stickbreaking --pos nope``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
PHASES = ("step", "data", "forward", "backward", "optimizer")
TASKS = ("mqmtar", "copy", "sort", "reverse", "max_retrieval", "flip_flop")


def time_loop(task_name: str, attn: str, steps: int, skip: int, pos: str | None) -> dict[str, Any]:
    """Per-phase median milliseconds of ``steps`` training steps in this process's lengthgen."""
    import torch

    import lengthgen
    from lengthgen.config import build_run_config
    from lengthgen.harness import train as training
    from lengthgen.harness.run import build
    from lengthgen.model import Transformer

    torch.set_num_threads(1)
    config = build_run_config(task_name, attn, preset="paper-tasks", **({"pos": pos} if pos else {}),
                              overrides={"train.steps": steps, "train.val_every": steps})
    task, model = build(config)
    marks: list[float] = []
    spent: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": []}

    def timed(phase: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[phase].append((len(marks), time.perf_counter() - start))
        return wrapper

    real_lr = training.lr_at

    def mark(step: int, cfg: Any) -> float:
        marks.append(time.perf_counter())
        return real_lr(step, cfg)

    patches = [(training, "lr_at", mark), (Transformer, "forward", timed("forward", Transformer.forward)),
               (torch.Tensor, "backward", timed("backward", torch.Tensor.backward)),
               (torch.nn.utils, "clip_grad_norm_", timed("optimizer", torch.nn.utils.clip_grad_norm_)),
               (torch.optim.AdamW, "step", timed("optimizer", torch.optim.AdamW.step))]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, value in patches:
        setattr(owner, name, value)
    try:
        training.train(model, task, config, torch.device("cpu"), progress=False)
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)
    # step i (1-based mark count) spans marks[i-1] .. marks[i]; keep steps skip .. steps-2
    kept = range(skip + 1, len(marks))
    per_step: dict[str, list[float]] = {phase: [] for phase in PHASES}
    for i in kept:
        total = marks[i] - marks[i - 1]
        parts = {phase: sum(t for at, t in spent[phase] if at == i) for phase in spent}
        per_step["step"].append(total)
        per_step["data"].append(total - sum(parts.values()))
        for phase, value in parts.items():
            per_step[phase].append(value)
    return {"task": task_name, "attn": attn, "pos": config.pos,
            "code": str(Path(lengthgen.__file__).parent.parent),
            "steps_timed": len(kept), "torch": torch.__version__,
            **{phase: 1000 * statistics.median(values) for phase, values in per_step.items()}}


def run_side(checkout: Path, task_name: str, attn: str, steps: int, skip: int,
             pos: str | None) -> dict[str, Any]:
    """One measurement in a fresh process that imports ``checkout``'s lengthgen."""
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    args = [sys.executable, __file__, "--worker", task_name, attn, str(steps), str(skip), pos or ""]
    out = subprocess.run(args, env=env, capture_output=True, text=True, check=True, cwd=checkout)
    return json.loads(out.stdout.strip().splitlines()[-1])


def git_label(checkout: Path) -> str:
    done = subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    dirty = subprocess.run(["git", "-C", str(checkout), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return (done.stdout.strip() or checkout.name) + ("+changes" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout to time side by side (the 'before')")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--attn", nargs="+", default=["softmax", "asentmax"])
    parser.add_argument("--steps", type=int, default=40, help="training steps per measurement")
    parser.add_argument("--skip", type=int, default=8, help="first steps left out (warm-up)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--pos", help="position scheme of every backend (default: the preset's)")
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        task_name, attn, steps, skip, pos = args.worker
        print(json.dumps(time_loop(task_name, attn, int(steps), int(skip), pos or None)))
        return

    sides = {"after": HERE.parent}
    if args.against:
        sides = {"before": args.against.resolve(), **sides}
    labels = {side: git_label(path) for side, path in sides.items()}
    print(f"one torch thread, paper-tasks presets{f', pos {args.pos}' if args.pos else ''}, "
          f"{args.steps} steps (first {args.skip} and the last "
          f"left out), medians in ms; load {os.getloadavg()[0]:.2f}; "
          + ", ".join(f"{side} = {label}" for side, label in labels.items()))
    rows: list[dict[str, Any]] = []
    for repeat in range(args.repeats):
        for task_name in args.tasks:
            for attn in args.attn:
                for side, path in sides.items():
                    rows.append({"side": side, "commit": labels[side], "repeat": repeat,
                                 **run_side(path, task_name, attn, args.steps, args.skip, args.pos)})
    print(f"{'task':<14}{'backend':<15}{'side':<8}" + "".join(f"{p:>10}" for p in PHASES)
          + f"{'data %':>8}{'step / before':>15}{'step / softmax':>16}")
    for task_name in args.tasks:
        medians = {(attn, side): _medians(rows, task_name, attn, side)
                   for attn in args.attn for side in sides}
        for attn in args.attn:
            for side in sides:
                m = medians[(attn, side)]
                ratio = m["step"] / medians[(attn, "before")]["step"] if "before" in sides else float("nan")
                softmax = medians.get(("softmax", side))
                relative = m["step"] / softmax["step"] if softmax else float("nan")
                print(f"{task_name:<14}{attn:<15}{side:<8}" + "".join(f"{m[p]:>10.1f}" for p in PHASES)
                      + f"{100 * m['data'] / m['step']:>7.1f}%{ratio:>15.2f}{relative:>16.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"load_before": os.getloadavg(), "sides": labels, "rows": rows},
                                        indent=1) + "\n")


def _medians(rows: list[dict[str, Any]], task_name: str, attn: str, side: str) -> dict[str, float]:
    """Per phase, the median over the repeats of one (task, backend, side)."""
    mine = [r for r in rows if r["side"] == side and r["task"] == task_name and r["attn"] == attn]
    return {p: statistics.median(r[p] for r in mine) for p in PHASES}


if __name__ == "__main__":
    main()
