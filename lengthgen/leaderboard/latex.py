"""The leaderboard's tables for papers: one booktabs LaTeX table per task.

Rendered with pandas' ``Styler.to_latex`` (booktabs rules, caption, label, LaTeX escaping of the
cells) from the same summary as every other table: per backend the chosen setting's mean exact
match with its 95% interval, the best backend of each column in bold, the learned seeds, the
effective length, and the paper's reported numbers below a rule. The caption states the protocol
the numbers come from, so a table copied into a paper carries it.
"""

from __future__ import annotations

import re
import unicodedata

import pandas as pd

from lengthgen.leaderboard.paper import PAPER_TRAIN_LENGTHS
from lengthgen.leaderboard.stats import EFFECTIVE_THRESHOLD, LEARNED_THRESHOLD, is_missing
from lengthgen.leaderboard.tables import effective_label, factor_label, pct

_SPECIAL = {"&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_", "{": r"\{", "}": r"\}",
            "~": r"\textasciitilde{}", "^": r"\textasciicircum{}", "\\": r"\textbackslash{}",
            "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
            "×": r"$\times$", "≥": r"$\geq$", "≤": r"$\leq$", "—": "---", "–": "--", "−": "-",
            "·": r"$\cdot$", "…": r"\ldots{}", "→": r"$\to$", "±": r"$\pm$", "“": "``", "”": "''", "‘": "`",
            "’": "'"}
#: Greek letters as pdflatex typesets them without packages (``α-entmax`` is a backend's name).
_GREEK = {chr(0x3B1 + i): rf"$\{name}$" for i, name in enumerate(
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi o pi rho varsigma sigma tau "
    "upsilon phi chi psi omega".split())}
_GREEK |= {"ο": "o", "ς": r"$\varsigma$", "Γ": r"$\Gamma$", "Δ": r"$\Delta$", "Θ": r"$\Theta$",
           "Λ": r"$\Lambda$", "Ξ": r"$\Xi$", "Π": r"$\Pi$", "Σ": r"$\Sigma$", "Υ": r"$\Upsilon$",
           "Φ": r"$\Phi$", "Ψ": r"$\Psi$", "Ω": r"$\Omega$"}


def _non_ascii(char: str) -> str:
    """A character pdflatex cannot take as it is: a Greek letter in math, else its ASCII letters
    (é → e), else its code point as text (an emoji → ``[U+1F600]``); control characters → a space."""
    if char in _GREEK:
        return _GREEK[char]
    if unicodedata.category(char).startswith("C"):
        return " "
    folded = unicodedata.normalize("NFKD", char).encode("ascii", "ignore").decode()
    return latex_escape(folded) if folded else f"[U+{ord(char):04X}]"


def latex_escape(text: str) -> str:
    """Text as pdflatex typesets it literally, in ASCII (the caption and every cell; names from data
    included: markup is escaped, Greek typeset, other characters transliterated)."""
    special = "|".join(re.escape(k) for k in _SPECIAL)
    return re.sub(f"{special}|[^\x20-\x7e]", lambda m: _SPECIAL.get(m.group(0)) or _non_ascii(m.group(0)),
                  text)


def _cell(row: pd.Series) -> str:
    text = pct(row["exact_match"])
    if row["ci_method"] in ("t", "wilson"):
        text += f" [{pct(row['ci_lo'])}, {pct(row['ci_hi'])}]"
    return text


def task_frame(summary: pd.DataFrame, task: str) -> tuple[pd.DataFrame, list[int]]:
    """The table as text cells (index: backend) and the positions of the paper's rows."""
    part = summary[(summary["task"] == task) & summary["chosen"].astype(bool)]
    factors = sorted(int(f) for f in part["factor"].dropna().unique())
    measured = part[part["source"] == "measured"]
    paper = part[part["source"] == "paper"]
    rows, labels = [], []
    for _, group in measured.groupby(["method", "pos"], sort=True):
        by_factor = {int(r["factor"]): r for _, r in group.iterrows() if not is_missing(r["factor"])}
        first = group.iloc[0]
        label = _label(first, measured)
        cells = {"learned": f"{int(first['learned_seeds'])}/{int(first['runs'])}"}
        cells |= {factor_label(f): _cell(by_factor[f]) if f in by_factor else "" for f in factors}
        cells["eff. length"] = effective_label(first["effective_length"], first["effective_length_capped"])
        rows.append(cells)
        labels.append(label)
    paper_rows = []
    for method, group in paper.groupby("method", sort=True):
        by_factor = {int(r["factor"]): r for _, r in group.iterrows()}
        first = group.iloc[0]
        cells = {"learned": ""} | {factor_label(f): pct(by_factor[f]["exact_match"]) if f in by_factor else ""
                                   for f in factors}
        cells["eff. length"] = effective_label(first["effective_length"], first["effective_length_capped"])
        paper_rows.append(len(rows))
        rows.append(cells)
        labels.append(f"paper: {method}")
    frame = pd.DataFrame(rows)
    frame.insert(0, "backend", labels)
    return frame, paper_rows


def _measured(summary: pd.DataFrame, task: str) -> pd.DataFrame:
    chosen = summary["chosen"].astype(bool)
    return summary[(summary["task"] == task) & chosen & (summary["source"] == "measured")]


def _best(summary: pd.DataFrame, task: str, frame: pd.DataFrame,
          paper_rows: list[int]) -> set[tuple[int, str]]:
    """(row, column) of the best measured mean in each factor column (ties: all of them; a column
    where every backend scores 0 has no best)."""
    part = _measured(summary, task)
    best: set[tuple[int, str]] = set()
    labels = list(frame["backend"])
    for factor, group in part.dropna(subset=["factor"]).groupby("factor"):
        top = group["exact_match"].max()
        if is_missing(top) or top <= 0:
            continue
        for _, row in group[group["exact_match"] == top].iterrows():
            label = _label(row, part)
            best.update((i, factor_label(int(factor))) for i, name in enumerate(labels)
                        if name == label and i not in paper_rows)
    return best


def _label(row: pd.Series, part: pd.DataFrame) -> str:
    return str(row["method"]) if part["pos"].nunique() == 1 else f"{row['method']} ({row['pos']})"


def caption(task: str, protocol: dict[str, str], seeds: int) -> str:
    keys = ("preset", "train lengths", "steps", "learning rate", "warm-up")
    field = {k: protocol.get(k, "?") for k in keys}
    text = (f"{task}: exact match (%) by evaluation length, as a multiple of the training length; mean over "
            f"{seeds} seeds with its 95% interval (Student t over seeds). Protocol: {field['preset']} "
            "preset, "
            f"training lengths {field['train lengths']}, {field['steps']} steps, learning rate "
            f"{field['learning rate']}, warm-up {field['warm-up']}; checkpoint and setting chosen on "
            f"in-distribution validation. learned: seeds with at least {LEARNED_THRESHOLD * 100:.0f}% at 1×; "
            f"eff. length: the longest factor with a mean of at least {EFFECTIVE_THRESHOLD * 100:.0f}% at "
            "every factor up to it. Bold: the best backend per column. Paper rows: the paper's reported "
            f"numbers (trained at {PAPER_TRAIN_LENGTHS}, the best of 3 seeds and several learning rates, "
            "selected on 8× validation).")
    return latex_escape(text)


def latex_table(summary: pd.DataFrame, task: str, protocol: dict[str, str]) -> str:
    """One booktabs table (``table`` float with caption and label) for the task."""
    frame, paper_rows = task_frame(summary, task)
    best = _best(summary, task, frame, paper_rows)
    runs = _measured(summary, task)["runs"].dropna()
    seeds = int(runs.max()) if not runs.empty else 0
    escaped = frame.map(lambda text: latex_escape(str(text)))  # ours: it also spells ×, ≥ and — for pdflatex
    escaped.columns = [latex_escape(str(c)) for c in frame.columns]
    by_name = dict(zip(escaped.columns, frame.columns, strict=True))

    def bold(column: pd.Series) -> list[str]:
        return ["font-weight: bold" if (i, by_name[column.name]) in best else "" for i in range(len(column))]

    styler = escaped.style.apply(bold, axis=0).hide(axis="index")
    text = styler.to_latex(hrules=True, convert_css=True, caption=caption(task, protocol, seeds),
                           label=f"tab:lengthgen-{re.sub(r'[^a-z0-9]+', '-', task.lower())}",
                           column_format="l" + "r" * (len(frame.columns) - 1), position="t")
    if paper_rows:  # a rule between our rows and the paper's
        lines = text.splitlines()
        first = next(i for i, line in enumerate(lines) if line.startswith("paper: "))
        lines.insert(first, r"\midrule")
        text = "\n".join(lines) + "\n"
    return text
