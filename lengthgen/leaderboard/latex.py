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

from lengthgen.leaderboard.paper import PAPER_TRAIN_LENGTHS, backend_rank
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


#: Factor columns per block: a task evaluated at more lengths is set as blocks of columns stacked
#: in one float, so that a table fits the text width of a one-column article (``PREAMBLE``).
FACTORS_PER_BLOCK = 4

#: The preamble the tables are written for (and compiled with in the tests).
PREAMBLE = r"\usepackage{booktabs}"
#: The frame's column of typeset backend names (``backend`` keeps the plain label that identifies a row).
NAME = "name (typeset)"


def _cell(row: pd.Series) -> str:
    """The mean, with its interval on a second, smaller line (LaTeX markup; the text is escaped)."""
    text = latex_escape(pct(row["exact_match"]))
    if row["ci_method"] in ("t", "wilson"):
        interval = latex_escape(f"[{pct(row['ci_lo'])}, {pct(row['ci_hi'])}]")
        return rf"\shortstack[r]{{{text}\\{{\scriptsize\mdseries {interval}}}}}"
    return text


def task_frame(summary: pd.DataFrame, task: str) -> tuple[pd.DataFrame, list[int]]:
    """The table as LaTeX cells (names and numbers escaped; the interval cells carry their own
    markup) and the positions of the paper's rows."""
    part = summary[(summary["task"] == task) & summary["chosen"].astype(bool)]
    factors = sorted(int(f) for f in part["factor"].dropna().unique())
    measured = part[part["source"] == "measured"]
    paper = part[part["source"] == "paper"]
    rows, labels, names = [], [], []
    for _, group in measured.groupby(["method", "pos"], sort=True):
        by_factor = {int(r["factor"]): r for _, r in group.iterrows() if not is_missing(r["factor"])}
        first = group.iloc[0]
        label = _label(first, measured)
        names.append(_name_cell(first, measured))
        cells = {"learned": f"{int(first['learned_seeds'])}/{int(first['runs'])}"}
        cells |= {factor_label(f): _cell(by_factor[f]) if f in by_factor else "" for f in factors}
        cells["eff. length"] = latex_escape(effective_label(first["effective_length"],
                                                            first["effective_length_capped"]))
        rows.append(cells)
        labels.append(label)
    paper_rows = []
    for method, group in paper.groupby("method", sort=True):
        by_factor = {int(r["factor"]): r for _, r in group.iterrows()}
        first = group.iloc[0]
        cells = {"learned": ""} | {factor_label(f): latex_escape(pct(by_factor[f]["exact_match"]))
                                   if f in by_factor else "" for f in factors}
        cells["eff. length"] = latex_escape(effective_label(first["effective_length"],
                                                            first["effective_length_capped"]))
        paper_rows.append(len(rows))
        rows.append(cells)
        labels.append(f"paper: {method}")
        names.append(latex_escape(f"paper: {method}"))
    frame = pd.DataFrame(rows)
    frame.insert(0, "backend", labels)
    frame.insert(1, NAME, names)
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
    for factor, group in part.dropna(subset=["factor"]).groupby("factor"):  # our rows: ours to bold
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


def _name_cell(row: pd.Series, part: pd.DataFrame) -> str:
    """The backend's name as typeset; where the task's rows mix position schemes, the scheme goes on
    a second, smaller line, so that naming it does not widen the table past the text."""
    name = latex_escape(str(row["method"]))
    if part["pos"].nunique() == 1:
        return name
    return rf"\shortstack[l]{{{name}\\{{\scriptsize\mdseries {latex_escape(str(row['pos']))}}}}}"


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


def _tabular(frame: pd.DataFrame, columns: list[str], best: set[tuple[int, str]],
             paper_rows: list[int]) -> str:
    """One block: a booktabs tabular of ``columns`` (the backend first), best cells in bold, a rule
    above the paper's rows."""
    head = " & ".join(latex_escape(c) for c in columns) + r" \\"
    lines = [rf"\begin{{tabular}}{{l{'r' * (len(columns) - 1)}}}", r"\toprule", head, r"\midrule"]
    for i, row in frame.iterrows():
        if i in paper_rows and i == paper_rows[0]:
            lines.append(r"\midrule")
        cells = [str(row[NAME])]
        cells += [rf"\bfseries {row[c]}" if (i, c) in best else str(row[c]) for c in columns[1:]]
        lines.append(" & ".join(cells) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def latex_table(summary: pd.DataFrame, task: str, protocol: dict[str, str]) -> str:
    """One table float for the task: ``FACTORS_PER_BLOCK`` factor columns per block, blocks stacked,
    so that it fits a one-column article's text width with nothing but booktabs (``PREAMBLE``)."""
    frame, paper_rows = task_frame(summary, task)
    best = _best(summary, task, frame, paper_rows)
    runs = _measured(summary, task)["runs"].dropna()
    seeds = int(runs.max()) if not runs.empty else 0
    factors = [c for c in frame.columns if c not in ("backend", NAME, "learned", "eff. length")]
    groups = [factors[i:i + FACTORS_PER_BLOCK] for i in range(0, len(factors), FACTORS_PER_BLOCK)] or [[]]
    blocks = [_tabular(frame, ["backend", *(["learned"] if i == 0 else []), *group,
                               *(["eff. length"] if i == len(groups) - 1 else [])], best, paper_rows)
              for i, group in enumerate(groups)]
    label = f"tab:lengthgen-{re.sub(r'[^a-z0-9]+', '-', task.lower())}"
    return "\n".join([r"\begin{table}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{3pt}",
                      "\n\n\\medskip\n".join(blocks), rf"\caption{{{caption(task, protocol, seeds)}}}",
                      rf"\label{{{label}}}", r"\end{table}", ""])


def latex_effective_table(summary: pd.DataFrame) -> str:
    """The effective-length matrix (a row per backend, a column per task) as a ``table*`` float: it
    spans both columns of a two-column article. Each cell: the effective length of the mean over
    seeds, each seed's own below it, and the paper's where it reports one."""
    from lengthgen.leaderboard.headline import standings

    table = standings(summary)
    tasks = sorted(table)
    methods = sorted({s.method for rows in table.values() for s in rows}, key=backend_rank)
    cells = {(s.task, s.method): s for rows in table.values() for s in rows}
    lines = [r"\begin{table*}[t]", r"\centering", r"\small", r"\setlength{\tabcolsep}{4pt}",
             rf"\begin{{tabular}}{{l{'c' * len(tasks)}}}", r"\toprule",
             " & ".join(["backend", *(latex_escape(t) for t in tasks)]) + r" \\", r"\midrule"]
    for method in methods:
        row = [latex_escape(method)]
        for task in tasks:
            s = cells.get((task, method))
            if s is None:
                row.append("")
                continue
            seeds = "/".join(("$\\geq$" if c else "") + (str(n) if n else "---") for _, n, c in s.seeds)
            parts = [latex_escape(effective_label(s.mean_length, s.mean_capped)), rf"{{\scriptsize {seeds}}}"]
            if s.paper:
                parts.append(rf"{{\scriptsize\itshape paper {latex_escape(s.paper)}}}")
            row.append(r"\shortstack{" + r"\\".join(parts) + "}")
        lines.append(" & ".join(row) + r" \\[2pt]")
    runs = sorted({s.runs for s in cells.values()})
    text = (f"Effective length per task and backend: the largest factor of the training length whose mean "
            f"exact match over seeds ({'/'.join(map(str, runs))} seeds) stays at or above "
            f"{EFFECTIVE_THRESHOLD * 100:.0f}% at every length up to it (≥: even the longest tested length "
            "passes; ---: not even 1×); below it each seed's own, then the paper's reported figure where it "
            f"has one (trained at {PAPER_TRAIN_LENGTHS}, the best of 3 seeds).")
    lines += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{latex_escape(text)}}}",
              r"\label{tab:lengthgen-effective-length}", r"\end{table*}", ""]
    return "\n".join(lines)
