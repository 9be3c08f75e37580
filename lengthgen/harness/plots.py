"""Figures as pure functions of result rows: exact match vs length (log2 x-axis, 95% band)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from lengthgen.files import atomic_write  # noqa: E402


def plot_accuracy_vs_length(rows: pd.DataFrame, path: str | Path, title: str | None = None) -> Path:
    """One line per (attn, pos): mean exact match over runs, with the Wilson band (1 run) or
    the min/max of the per-run bands (several runs)."""
    ok = rows[rows["status"] == "ok"].dropna(subset=["factor"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for (attn, pos), group in sorted(ok.groupby(["attn", "pos"]), key=lambda kv: kv[0]):
        by_factor = group.groupby("factor").agg(
            mean=("exact_match", "mean"), lo=("exact_match_lo", "min"), hi=("exact_match_hi", "max")
        ).sort_index()
        x = by_factor.index.to_numpy(dtype=float)
        ax.plot(x, by_factor["mean"], marker="o", ms=3, label=plain_text(f"{attn} ({pos})"))
        ax.fill_between(x, by_factor["lo"], by_factor["hi"], alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length / training length")
    ax.set_ylabel("exact match")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(True, alpha=0.3)
    ax.set_title(plain_text(title or ", ".join(sorted(ok["task"].unique()))))
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", metadata={"Software": None}))
    finally:
        plt.close(fig)


def plain_text(text: str) -> str:
    """A name from data (a run's config, a result row) as matplotlib text: every ``$`` escaped, so
    ``bad $\\frac{$ math`` is shown as it is instead of failing to parse as math; a figure's own
    labels keep math (log-scale ticks)."""
    return text.replace("$", r"\$")
