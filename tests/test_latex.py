"""Outputs for papers: booktabs tables that a real TeX engine compiles, PDF figures with embedded
fonts, both byte-identical for the same rows."""

from __future__ import annotations

import io
import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.leaderboard import latex, load_rows, plot_exact_match, render
from lengthgen.leaderboard.latex import PREAMBLE, latex_escape
from tests.leaderboard_rows import ROWS, make_rows

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


def compile_latex(folder: Path, tables: list[str], options: str = "") -> str:
    """pdflatex on an article (``options``: e.g. twocolumn) with the recommended preamble that inputs
    the tables; returns the log. Fails the test on an error and on any overfull box: a table wider
    than the text is broken in a paper."""
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed (Debian: texlive-latex-base texlive-latex-recommended)")
    body = "".join(f"\\input{{{name}}}\n" for name in tables)
    document = (f"\\documentclass[{options}]{{article}}\n{PREAMBLE}\n\\begin{{document}}\n"
                f"{body}\\end{{document}}\n")
    (folder / "doc.tex").write_text(document, encoding="utf-8")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=folder,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:]
    assert (folder / "doc.pdf").stat().st_size > 1000
    log = (folder / "doc.log").read_text(encoding="utf-8", errors="replace")
    assert "Overfull \\hbox" not in log, [line for line in log.splitlines() if "Overfull" in line]
    return log


def test_the_published_tables_compile(tmp_path: Path) -> None:
    """The board's own tables, every task to its longest length (max_retrieval and MQMTAR: 11
    lengths), fit a one-column article; the effective-length matrix spans a two-column one."""
    rows = load_rows(REPO / "leaderboard")
    files = render(rows, latex=True).files
    tasks = sorted(rows["task"].unique())
    for task in tasks:
        (tmp_path / f"{task}.tex").write_bytes(files[f"latex/{task}.tex"])
    log = compile_latex(tmp_path, tasks)
    assert "Undefined control sequence" not in log and "Missing character" not in log
    wide = files["latex/max_retrieval.tex"].decode()
    assert wide.count(r"\toprule") == wide.count(r"\bottomrule") == 3  # 11 lengths: blocks of 4 columns
    assert r"\label{tab:lengthgen-max-retrieval}" in wide and "Protocol: paper-tasks preset" in wide
    # its rows mix position schemes (the baselines run without one): the scheme goes below the name
    assert r"\shortstack[l]{fox\\{\scriptsize\mdseries nope}} & 1/3 &" in wide
    copy = files["latex/copy.tex"].decode()
    softmax = next(line for line in copy.splitlines() if line.startswith("softmax &"))
    assert softmax.split(" & ")[2] == r"\bfseries \shortstack[r]{99.7\\{\scriptsize\mdseries [99.2, 100.0]}}"
    assert "paper: asentmax &  & 100.0" in copy  # the paper's rows below the rule, no interval
    (tmp_path / "effective_length.tex").write_bytes(files["latex/effective_length.tex"])
    compile_latex(tmp_path, ["effective_length"], "twocolumn")
    assert r"\begin{table*}" in files["latex/effective_length.tex"].decode()


def test_the_overfull_check_can_fail(tmp_path: Path) -> None:
    """The compile check catches a table wider than the text (here: every length in one block)."""
    rows = load_rows(REPO / "leaderboard")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(latex, "FACTORS_PER_BLOCK", 11)
        files = render(rows[rows["task"] == "max_retrieval"], latex=True).files
    (tmp_path / "max_retrieval.tex").write_bytes(files["latex/max_retrieval.tex"])
    with pytest.raises(AssertionError, match="Overfull"):
        compile_latex(tmp_path, ["max_retrieval"])


def test_names_from_data_are_escaped(tmp_path: Path) -> None:
    rows = make_rows(ROWS)
    rows.loc[rows["attn"] == "asentmax", "attn"] = "my_attn & 100% {x} #1 ~^\\"
    files = render(rows, latex=True).files
    (tmp_path / "copy.tex").write_bytes(files["latex/copy.tex"])
    compile_latex(tmp_path, ["copy"])
    assert latex_escape("a_b & 50% ≥ 2×") == r"a\_b \& 50\% $\geq$ 2$\times$"


def test_pdf_figures_embed_their_fonts_and_repeat_byte_for_byte() -> None:
    rows = make_rows(ROWS)
    first = plot_exact_match(rows, "copy", io.BytesIO(), fmt="pdf").getvalue()
    shuffled = rows.sample(frac=1.0, random_state=1)
    second = plot_exact_match(shuffled, "copy", io.BytesIO(), fmt="pdf").getvalue()
    assert first.startswith(b"%PDF") and first == second
    assert b"/FontFile2" in first and b"/Type3" not in first  # TrueType, embedded
    assert b"CreationDate" not in first


def test_the_latex_flag_writes_tables_and_pdf_figures(tmp_path: Path) -> None:
    folder = tmp_path / "results"
    folder.mkdir()
    make_rows(ROWS).to_parquet(folder / "rows.parquet")
    result = runner.invoke(app, ["leaderboard", str(folder), "--out", str(tmp_path / "board"), "--latex"])
    assert result.exit_code == 0, result.output
    board = tmp_path / "board"
    written = {p.relative_to(board).as_posix() for p in board.rglob("*") if p.is_file()}
    assert {"latex/copy.tex", "plots/copy_exact_match.pdf", "plots/copy_dispersion.pdf"} <= written
    plain = runner.invoke(app, ["leaderboard", str(folder), "--out", str(tmp_path / "plain")])
    assert plain.exit_code == 0 and not (tmp_path / "plain" / "latex").exists()
