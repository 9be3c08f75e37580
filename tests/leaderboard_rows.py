"""Hand-made result rows for the leaderboard tests (shared by the table and the browser tests)."""

from __future__ import annotations

import pandas as pd

from lengthgen.config import build_run_config
from lengthgen.harness.evaluate import wilson_interval
from lengthgen.harness.storage.results import rows_to_frame
from lengthgen.leaderboard.copy_budget import recipe


def make_rows(exact: dict[tuple[str, int], list[float]], task: str = "copy", n: int = 100,
              failed: tuple[tuple[str, int], ...] = (), pos: str = "nape", lr: float | None = None,
              val: dict[tuple[str, int], tuple[float, float]] | None = None) -> pd.DataFrame:
    """Rows for runs (attn, seed) with the given exact match at factors 1, 2, 4, … (one value each);
    ``val`` gives a run's (1×, 8×) validation exact match (absent: rows that predate those columns)."""
    rows = []
    for (attn, seed), values in sorted(exact.items()):
        settings = {"train.steps": 10, "eval.max_factor": 2 ** (len(values) - 1), "eval.samples": n}
        config = build_run_config(task, attn, pos=pos, seed=seed,
                                  overrides={**settings, **({"train.lr": lr} if lr else {})})
        run_id = f"{task}-{attn}-{pos}-s{seed}-{config.config_hash()[:8]}"
        val_id, val_8x = (val or {}).get((attn, seed), (None, None))
        base = {"run_id": run_id, "task": task, "attn": attn, "pos": pos, "seed": seed, "preset": "quick",
                "train_length": 16, "steps": 10, "val_exact_id": val_id, "val_exact_8x": val_8x,
                "selection": "id", "device": "cpu", "lengthgen_version": "0.1.0", "torch_version": "2.x",
                "config_hash": config.config_hash(), "config_json": config.canonical_json(),
                "train_seconds": 30.0, "created_at": f"2026-01-0{seed + 1}T00:00:00+00:00"}
        for i, value in enumerate(values):
            hits = round(value * n)
            lo, hi = wilson_interval(hits, n)
            rows.append({**base, "factor": 2 ** i, "eval_length": 16 * 2 ** i, "n_samples": n,
                         "exact_match": hits / n, "exact_match_lo": lo, "exact_match_hi": hi,
                         "token_accuracy": value, "attn_entropy": 0.2 + 0.1 * i + 0.01 * seed,
                         "attn_support": 2.0 ** (i + 1), "eval_seconds": 1.0, "status": "ok", "error": None})
        if (attn, seed) in failed:
            rows.append({**base, "status": "failed", "error": "OutOfMemoryError: at the next length"})
    return rows_to_frame(rows)


ROWS = {
    ("asentmax", 0): [1.0, 0.98, 0.95, 0.80],
    ("asentmax", 1): [1.0, 0.96, 0.93, 0.70],
    ("asentmax", 2): [1.0, 0.97, 0.91, 0.75],
    ("softmax", 0): [1.0, 0.90, 0.40, 0.00],
    ("softmax", 1): [0.99, 0.86, 0.30, 0.00],
    ("softmax", 2): [1.0, 0.88, 0.35, 0.01],
}


def study_rows(scores: dict[tuple[str, int, int], dict[int, float]],
               planted: float | None = 0.5, width: int | None = None) -> pd.DataFrame:
    """Rows of MQMTAR runs (attn, steps, seed) with exact match per factor (64 samples each), plus
    a row with 8 near misses planted at 8× scoring ``planted``; ``width``: another model width."""
    rows = []
    wider = {"arch.d_model": width, "arch.n_heads": width // 32, "arch.d_ff": 2 * width} if width else {}
    for (attn, steps, seed), by_factor in sorted(scores.items()):
        config = build_run_config("mqmtar", attn, preset="paper-tasks", seed=seed,
                                  overrides={"train.steps": steps, "eval.min_samples": 64, **wider})
        base = {"run_id": f"mqmtar-{attn}-nape-s{seed}-{config.config_hash()[:8]}", "task": "mqmtar",
                "attn": attn, "pos": "nape", "seed": seed, "preset": "paper-tasks", "train_length": 64,
                "steps": steps, "config_hash": config.config_hash(), "config_json": config.canonical_json(),
                "status": "ok", "n_samples": 64}
        for factor, value in by_factor.items():
            rows.append({**base, "factor": factor, "eval_length": 64 * factor, "exact_match": value,
                         "exact_match_lo": value, "exact_match_hi": value})
        if planted is not None:
            rows.append({**base, "factor": 8, "eval_length": 512, "exact_match": planted,
                         "exact_match_lo": planted, "exact_match_hi": planted,
                         "eval_variant": "near_misses=8"})
    return rows_to_frame(rows)


#: The board's copy model at the paper-tasks preset (leaderboard/plan.toml's copy sweep).
COPY_MODEL = {"arch.d_model": 256, "arch.n_heads": 16, "arch.d_ff": 1024, "train.warmup_steps": 200}


def planned_recipe(attn: str, lr: float) -> str:
    """The recipe of a copy study's runs of ``attn`` at ``lr`` (any seed, any step count)."""
    config = build_run_config("copy", attn, preset="paper-tasks", seed=0,
                              overrides={**COPY_MODEL, "train.lr": lr})
    return recipe(config.canonical_json())


def copy_study_rows(scores: dict[tuple[str, int, int], dict[int, float]], lr: float = 2e-3,
                    max_factor: int = 64) -> pd.DataFrame:
    """Rows of copy runs (attn, steps, seed) of the board's copy model at learning rate ``lr``, with
    exact match per factor (256 samples each); ``max_factor``: the run's evaluation setting."""
    rows = []
    for (attn, steps, seed), by_factor in sorted(scores.items()):
        config = build_run_config("copy", attn, preset="paper-tasks", seed=seed,
                                  overrides={**COPY_MODEL, "train.lr": lr, "train.steps": steps,
                                             "eval.max_factor": max_factor})
        base = {"run_id": f"copy-{attn}-nape-s{seed}-{config.config_hash()[:8]}", "task": "copy",
                "attn": attn, "pos": "nape", "seed": seed, "preset": "paper-tasks", "train_length": 64,
                "steps": steps, "config_hash": config.config_hash(), "config_json": config.canonical_json(),
                "status": "ok", "n_samples": 256}
        rows += [{**base, "factor": factor, "eval_length": 64 * factor, "exact_match": value,
                  "exact_match_lo": value, "exact_match_hi": value} for factor, value in by_factor.items()]
    return rows_to_frame(rows)
