"""Per-task presets: ``quick`` (a 2-core CPU trains it in minutes), ``paper-tasks`` (the paper's
task protocol with the quick models) and ``paper`` (the paper's model sizes and training recipe,
see ``docs/design.md``).

``quick`` trains copy, sort and reverse at 8..16 symbols and stops MQMTAR at 256x, which made its
numbers incomparable with the paper's; ``paper-tasks`` keeps the paper's training lengths (32..64),
evaluation factors and MQMTAR pair count and shrinks only the model and the step count.

A preset fixes the model size, optimizer, training length and evaluation protocol of a task;
``lengthgen.config.build_run_config`` starts from it and applies the user's overrides. Tasks
without an entry (plugins) get ``DEFAULT``. This module is data only.
"""

from __future__ import annotations

from typing import Any

from lengthgen.registry import UnknownNameError

#: Every preset, with what it is for (the command line's help shows these words).
PRESETS: dict[str, str] = {
    "quick": "CPU minutes",
    "paper-tasks": "the paper's task protocol, quick models",
    "paper": "the paper's models, for GPUs",
}
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)

#: Fallback for tasks without their own preset (e.g. plugins): small and quick.
DEFAULT: dict[str, dict[str, Any]] = {
    "arch": {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256},
    "train": {"steps": 600, "batch_size": 32, "lr": 2e-3, "warmup_steps": 50, "train_length": 16},
    "eval": {"max_factor": 64, "samples": 128},
}

#: The two quick model sizes: a small one, and a wider one (8 heads: 4 ALiBi + 4 NoPE under NAPE)
#: for the tasks that need position matching (copy, reverse).
_SMALL: dict[str, Any] = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256}
_WIDE: dict[str, Any] = {"n_layers": 2, "d_model": 128, "n_heads": 8, "d_ff": 512}
#: The quick optimizer of every task but MQMTAR (which trains at 1e-3 with a longer warm-up).
_QUICK_OPTIMIZER: dict[str, Any] = {"batch_size": 64, "lr": 2e-3, "warmup_steps": 100}
#: Test samples per length: 256, and at long lengths (a token budget) never under 32.
_TESTED: dict[str, Any] = {"samples": 256}
_TESTED_LONG: dict[str, Any] = {"samples": 256, "min_samples": 32, "token_budget": 600_000}


def _quick(arch: dict[str, Any], steps: int, train_length: int, evaluation: dict[str, Any]) -> dict[str, Any]:
    return {"arch": arch, "train": {**_QUICK_OPTIMIZER, "steps": steps, "train_length": train_length},
            "eval": evaluation}


QUICK: dict[str, dict[str, dict[str, Any]]] = {
    "max_retrieval": _quick(_SMALL, 1500, 16, {**_TESTED_LONG, "max_factor": 1024}),
    # MQMTAR stops at 256x (16,384 context tokens) so that 15 runs fit a CPU sitting: 1024x adds
    # about a minute per sample on the softmax-family path; `--max-factor 1024` goes all the way.
    "mqmtar": {
        "arch": {"n_layers": 2, "d_model": 128, "n_heads": 4, "d_ff": 256},
        "train": {"steps": 2000, "batch_size": 64, "lr": 1e-3, "warmup_steps": 200, "train_length": 64},
        "eval": {"max_factor": 256, "samples": 256, "min_samples": 8, "token_budget": 300_000},
    },
    "copy": _quick(_WIDE, 3000, 16, {**_TESTED, "max_factor": 64}),
    "sort": _quick(_SMALL, 4000, 16, {**_TESTED, "max_factor": 8}),
    "reverse": _quick(_WIDE, 3000, 16, {**_TESTED, "max_factor": 8}),
    "flip_flop": _quick(_SMALL, 1500, 32, {**_TESTED, "max_factor": 64}),
}

#: The paper's MQMTAR pair count: 0.8·L/6 pairs of a 2+2-token block, i.e. 8/15 of the context.
#: The alphabet is the paper's 256 (65,536 distinct keys, so even 1024x has no repeated key).
_PAPER_MQMTAR = {"alphabet": 256, "key_len": 2, "value_len": 2, "n_queries": 4, "pair_fraction": 8 / 15}
_PAPER_LENGTHS = {"train_length": 64, "min_train_length": 32}


def _paper_tasks(quick: dict[str, Any], steps: int, evaluation: dict[str, Any]) -> dict[str, Any]:
    """A quick model and optimizer at the paper's training lengths."""
    return {"arch": quick["arch"], "train": {**quick["train"], "steps": steps, **_PAPER_LENGTHS},
            "eval": evaluation}


PAPER_TASKS: dict[str, dict[str, dict[str, Any]]] = {
    "max_retrieval": {**QUICK["max_retrieval"],  # the quick preset already has the paper's lengths
                      "train": {**QUICK["max_retrieval"]["train"], "min_train_length": 8}},
    "mqmtar": {
        # 1e-3: at 2e-3 softmax and SSMax stayed on MQMTAR's loss plateau for all 3,000 steps
        # (seed 0); at 1e-3 softmax leaves it near step 2,000.
        **_paper_tasks(QUICK["mqmtar"], 3000,
                       # at least 32 test samples at every length, 1024x (65,536 tokens) included: with 8
                       # a run's Wilson interval at 0% reached 32%, too wide to tell backends apart
                       {"max_factor": 1024, "samples": 256, "min_samples": 32, "token_budget": 300_000}),
        "task_params": _PAPER_MQMTAR,
    },
    "copy": _paper_tasks(QUICK["copy"], 4000, {**_TESTED_LONG, "max_factor": 64}),
    "sort": _paper_tasks(QUICK["sort"], 4000, {**_TESTED, "max_factor": 8}),
    "reverse": _paper_tasks(QUICK["reverse"], 4000, {**_TESTED, "max_factor": 8}),
    "flip_flop": _paper_tasks(QUICK["flip_flop"], 1500, {**_TESTED_LONG, "max_factor": 64}),
}

#: The paper's recipe (a GPU's): its optimizer, batch, training lengths and 1,000 test samples at
#: every length. Its step counts are shorter than the paper's (one epoch of its training file,
#: ``lengthgen/leaderboard/paper.py``).
_PAPER_TRAIN = {"batch_size": 128, "warmup_steps": 1000, "betas": (0.9, 0.99), "weight_decay": 0.0,
                "grad_clip": 1.0, "train_length": 64, "min_train_length": 32, "selection": "id"}
_PAPER_TESTED = {"samples": 1000, "min_samples": 1000, "token_budget": 10**12}


def _paper(layers: int, width: int, heads: int, steps: int, lr: float, max_factor: int,
           **train: Any) -> dict[str, Any]:
    return {"arch": {"n_layers": layers, "d_model": width, "n_heads": heads, "d_ff": 1024},
            "train": {**_PAPER_TRAIN, "steps": steps, "lr": lr, **train},
            "eval": {**_PAPER_TESTED, "max_factor": max_factor}}


PAPER: dict[str, dict[str, dict[str, Any]]] = {
    "mqmtar": {**_paper(4, 512, 16, 50_000, 2e-4, 1024), "task_params": _PAPER_MQMTAR},
    "sort": _paper(2, 256, 8, 20_000, 4e-4, 8),
    "copy": _paper(2, 256, 16, 20_000, 1e-3, 64),
    "reverse": _paper(6, 256, 8, 20_000, 4e-4, 8),
    "max_retrieval": _paper(2, 256, 8, 20_000, 4e-4, 1024, train_length=16, min_train_length=8),
    "flip_flop": _paper(2, 256, 8, 20_000, 4e-4, 64),
}


def preset_sections(task: str, preset: str) -> dict[str, dict[str, Any]]:
    """The sections (``arch``, ``train``, ``eval``, ``task_params``) of a task's preset."""
    if preset not in PRESET_NAMES:
        raise UnknownNameError(f"unknown preset {preset!r}; valid presets: {', '.join(PRESET_NAMES)}")
    table = {"quick": QUICK, "paper-tasks": PAPER_TASKS, "paper": PAPER}[preset]
    return table.get(task, DEFAULT)

