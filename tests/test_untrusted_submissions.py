"""Submitted result folders are input to check: a submission is never labelled as ours, its rows
pass the reader's checks (a mean inside its own interval), its description is typed and bounded
(a 5 MB name costs nothing), no file is read through a link, copies of one run that disagree are
flagged while identical ones merge, a bad submission is skipped, and the README shows data as
literally as the page does."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.errors import UserNotice
from lengthgen.leaderboard import PROTOCOL_LABEL
from lengthgen.leaderboard.sources import COMPARED, load_sources
from tests.hostile import SCRIPT, forged, relabel, result_folder
from tests.leaderboard_rows import ROWS, make_rows

runner = CliRunner()
VAL = {**{("asentmax", s): (1.0, 0.9 - 0.1 * s) for s in range(3)},
       **{("softmax", s): (1.0, 0.5) for s in range(3)}}


folder = result_folder


def board(*folders: Path, out: Path, expect: str | None = None) -> tuple[str, str, list[str]]:
    """``lengthgen leaderboard`` over the folders: (README, page, the warnings' lines)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(app, ["leaderboard", *map(str, folders), "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = [str(w.message) for w in caught if issubclass(w.category, UserNotice)]
    if expect is not None:
        assert any(expect in line for line in lines), lines
    page = (out / "leaderboard.html").read_text(encoding="utf-8")
    return (out / "README.md").read_text(encoding="utf-8"), page, lines


def ours(tmp_path: Path) -> Path:
    return folder(tmp_path, "ours", make_rows(ROWS, val=VAL))


# -- 3: a submission is never labelled as ours --------------------------------------------------------
def test_a_submission_never_appears_in_a_row_of_ours(tmp_path: Path) -> None:
    """Before: a submitted run became "ours, paper protocol: softmax @ tamper"."""
    better = make_rows({("softmax", 7): [1.0, 1.0, 1.0, 1.0]}, val={("softmax", 7): (1.0, 1.0)}, lr=3e-3)
    tamper = folder(tmp_path, "tamper", better, 'name = "tamper"\n')
    readme, page, _ = board(ours(tmp_path), tamper, out=tmp_path / "board")
    protocol_rows = [line for line in readme.splitlines() if PROTOCOL_LABEL in line and line.startswith("|")]
    assert protocol_rows and not any("@ tamper" in line for line in protocol_rows)
    assert not re.search(rf"{re.escape(PROTOCOL_LABEL)}: [^<|]*@ tamper", page)
    assert "| softmax @ tamper |" in readme  # shown, under its own label
    compare = readme[readme.index("The paper's protocol and ours"):]
    learning_rate = next(line for line in compare.splitlines() if line.startswith("| learning rate |"))
    assert "0.003" not in learning_rate  # the "ours" column describes our runs only
    csv = pd.read_csv(tmp_path / "board" / "leaderboard.csv")
    assert not csv.loc[csv["source"] == "protocol", "method"].str.contains("@").any()


# -- 2: a mean outside its own interval -----------------------------------------------------------------
@pytest.mark.parametrize(("edit", "reason"), [
    ({"exact_match": 1.0}, "lies outside its interval"),  # every exact_match set to 1.0, the interval kept
    ({"exact_match": 0.355}, "is no count of its 100 samples"),  # inside both rows' intervals
    ({"exact_match_lo": 0.0, "exact_match_hi": 1.0}, "are not the Wilson interval of"),
])
def test_a_mean_outside_its_interval_is_refused(tmp_path: Path, edit: dict[str, float], reason: str) -> None:
    rows = make_rows({("softmax", 5): [0.4, 0.3]})
    tampered = rows.assign(**edit)
    sub = folder(tmp_path, "sub", tampered, 'name = "tamper"\n')
    readme, _, lines = board(ours(tmp_path), sub, out=tmp_path / "board", expect=reason)
    assert "@ tamper" not in readme.split("## Sources")[0]  # none of its rows reached a table
    assert any("skipped submission" in line and "no usable results" in line for line in lines)


# -- 4, smaller: source.toml typed and bounded, a 5 MB name in normal time ---------------------------
@pytest.mark.parametrize(("toml", "reason"), [
    ("name = 5\n", "name must be text, got int"),
    ('who = ["a", "b"]\n', "who must be text, got list"),
    ('name = "two\\nlines"\n', "name must be one line of at most 64 characters"),
    ('name = "base "\n', "without control characters or surrounding spaces"),
    ('name = "x"\nwebsite = "y"\n', "unknown field 'website'"),
    ("name = " + "[" * 100_000 + "\n", "nests lists or tables deeper than 32 levels"),
    ("name = \n", "not a valid TOML file"),
])
def test_a_refused_source_toml_skips_that_submission_with_one_warning(tmp_path: Path, toml: str,
                                                                    reason: str) -> None:
    sub = folder(tmp_path, "sub", make_rows({("entmax", 4): [1.0, 0.5]}), toml)
    readme, _, lines = board(ours(tmp_path), sub, out=tmp_path / "board", expect=reason)
    assert [line for line in lines if "skipped submission" in line] == [
        next(line for line in lines if reason in line)]
    assert "| entmax @" not in readme and "| softmax |" in readme


@pytest.mark.parametrize(("where", "size", "reason"), [
    ("source.toml", 5_000_000, "over the limit of 1,048,576 for a text file"),
    ("SOURCE.md", 5_000_000, "over the limit of 1,048,576 for a text file"),
    ("source.toml", 100_000, "name must be one line of at most 64 characters"),
    ("SOURCE.md", 100_000, "name must be one line of at most 64 characters"),
])
def test_a_5mb_name_is_refused_in_normal_time(tmp_path: Path, where: str, size: int, reason: str) -> None:
    """Before: 5,000,000 characters of name ran past 120 s and wrote no board (100 KB: 22 s)."""
    sub = folder(tmp_path, "sub", make_rows({("entmax", 4): [1.0, 0.5]}))
    huge = "n" * size
    text = f'name = "{huge}"\n' if where == "source.toml" else f"# {huge}\n\nmy runs\n"
    (sub / where).write_text(text, encoding="utf-8")
    start = time.perf_counter()
    readme, _, _ = board(ours(tmp_path), sub, out=tmp_path / "board", expect=reason)
    assert time.perf_counter() - start < 60  # the board itself takes seconds
    assert huge[:100] not in readme


@pytest.mark.parametrize(("column", "size"), [("torch_version", 5_000_000), ("cpu", 5_000_000),
                                              ("error", 5_000_000)])
def test_a_5mb_text_in_a_row_is_refused_in_normal_time(tmp_path: Path, column: str, size: int) -> None:
    sub = folder(tmp_path, "sub", make_rows({("entmax", 4): [1.0, 0.5]}).assign(**{column: "t" * size}),
                 'name = "sub"\n')
    start = time.perf_counter()
    readme, _, _ = board(ours(tmp_path), sub, out=tmp_path / "board", expect=f"{column} is 5,000,000 chara")
    assert time.perf_counter() - start < 60 and "t" * 1000 not in readme


def test_a_submission_cannot_call_itself_this_board(tmp_path: Path) -> None:
    sub = folder(tmp_path, "sub", make_rows({("entmax", 4): [1.0, 0.5]}), 'name = "ours (This Board)"\n')
    readme, _, _ = board(ours(tmp_path), sub, out=tmp_path / "board", expect="says it is this board's own")
    assert "@ ours" not in readme and "## Sources" not in readme  # skipped: the board is ours alone


# -- 10: no file through a link ----------------------------------------------------------------------
@pytest.mark.parametrize("name", ["SOURCE.md", "source.toml"])
def test_a_symlinked_description_never_leaks(tmp_path: Path, name: str) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text('# TOP-SECRET-TITLE\n\nname = "TOP-SECRET-VALUE"\n', encoding="utf-8")
    sub = folder(tmp_path, "sub", make_rows({("entmax", 4): [1.0, 0.5]}))
    (sub / name).symlink_to(secret)
    readme, page, _ = board(ours(tmp_path), sub, out=tmp_path / "board", expect="is a symbolic link")
    assert "TOP-SECRET" not in readme and "TOP-SECRET" not in page


def test_a_results_file_behind_a_link_is_not_read(tmp_path: Path) -> None:
    outside = folder(tmp_path, "outside", make_rows({("entmax", 9): [1.0, 0.5]}))
    sub = folder(tmp_path, "sub", make_rows({("entmax", 4): [1.0, 0.5]}), 'name = "sub"\n')
    for file in (outside / "data").glob("*.parquet"):
        (sub / "data" / file.name).symlink_to(file)
    readme, _, _ = board(ours(tmp_path), sub, out=tmp_path / "board", expect="a symbolic link")
    assert "entmax @ sub" in readme and "1 |" in readme.split("## Sources")[1].split("| sub |")[1][:200]
    assert readme.count("-s9-") == 0


# -- 2: copies of one run -----------------------------------------------------------------------------
def test_copies_that_disagree_are_flagged_and_identical_copies_merge(tmp_path: Path) -> None:
    own = make_rows(ROWS, val=VAL)
    softmax = own[own["run_id"].str.startswith("copy-softmax-nape-s0-")]
    changed = forged(softmax, softmax["factor"] == 1, hits=50)  # "1.0 → 0.5 at 1×", its interval to match
    b = folder(tmp_path, "B", changed, 'name = "B"\n')
    c = folder(tmp_path, "C", softmax, 'name = "C"\n')  # a faithful reproduction
    readme, page, lines = board(folder(tmp_path, "ours", own), b, c, out=tmp_path / "board")
    run = softmax["run_id"].iloc[0]
    [flag] = [line for line in lines if "disagree" in line]
    assert flag.startswith(f"run {run}: ours and B disagree on exact_match at 1× (1 vs 0.5)")
    assert "lengthgen verify" in flag and not any("C disagree" in line or ": C" in line for line in lines)
    assert "⚠ 1 run held by two folders with different rows" in readme.split("\n")[2]
    assert "⚠ 1 run held by two folders with different rows" in page
    sources = readme[readme.index("## Sources"):readme.index("## Protocol")]
    assert f"| ⚠ {run}: exact_match at 1× differs from the copy in ours |" in sources
    assert "⚠ run " in sources and "| softmax @ B |" in readme and "softmax @ C" not in readme
    assert "1 runs identical to an earlier folder's, shown once" in sources
    copy = readme[readme.index("## copy"):readme.index("The settings behind these rows")]
    assert copy.count("| softmax |") == 1
    rows, sources_found = load_sources([str(tmp_path / "ours"), str(b), str(c)])
    assert {s.label: s.merged for s in sources_found} == {"ours": 0, "B": 0, "C": 1}
    assert set(rows.loc[rows["run_id"] == run, "source"]) == {"", "B"}  # C's copy merged into ours


def test_the_readme_names_the_columns_a_submission_cannot_change_unflagged() -> None:
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("Submitted folders"):]
    assert all(f"`{column}`" in section[:4000] for column in COMPARED)


# -- 7: one bad submission does not stop the board ---------------------------------------------------
def test_a_bad_submission_is_skipped_and_nothing_usable_is_exit_2(tmp_path: Path) -> None:
    own = ours(tmp_path)
    empty = tmp_path / "empty"
    (empty / "data").mkdir(parents=True)
    (empty / "data" / "x.parquet").write_bytes(b"not parquet")
    missing = tmp_path / "missing"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(app, ["leaderboard", str(own), str(empty), str(missing), "--out",
                                     str(tmp_path / "board")])
    assert result.exit_code == 0, result.output
    lines = [str(w.message) for w in caught]
    assert any(f"skipped submission {empty}: no usable results" in line for line in lines)
    assert any(f"skipped submission {missing}: no results under" in line for line in lines)
    nothing = runner.invoke(app, ["leaderboard", str(empty), str(empty), "--out", str(tmp_path / "b2")])
    assert nothing.exit_code == 2 and "no usable results" in nothing.output


# -- 11: the README is escaped like the page ---------------------------------------------------------
def test_the_readme_shows_data_literally(tmp_path: Path) -> None:
    markdown_it = pytest.importorskip("markdown_it")
    injected = "<img src=x onerror=alert(1)>"
    own = relabel(make_rows(ROWS, val=VAL), task=f"copy{injected}")
    base = folder(tmp_path, "ours", own)
    (base / "verify.json").write_text('{"format": 2, "runs": {"' + own["run_id"].iloc[0] + '": {"ok": true, '
                                      '"date": "<b>2026</b>", "commit": "[x](http://evil.example)", '
                                      '"digest": "0"}}}', encoding="utf-8")
    sub = folder(tmp_path, "sub", relabel(make_rows({("entmax", 4): [1.0, 0.5]}), task=f"copy{injected}"),
                 f'name = "sub {injected}"\nwho = "{SCRIPT.replace(chr(34), "")} | # not a heading"\n'
                 'what = "[click](http://evil.example) ![t](http://track.example/x.png) **b** _i_ $x^$"\n')
    readme, _, _ = board(base, sub, out=tmp_path / "board")
    rendered = markdown_it.MarkdownIt("commonmark", {"html": True}).enable("table").render(readme)
    images = re.findall(r"<img [^>]*>", rendered)
    assert images and all(re.match(r'<img src="plots/[^"]+" alt="[^"<]*"', tag) for tag in images), images
    assert "<script" not in rendered and "<b>" not in rendered and "<img src=x" not in rendered
    assert "evil.example" in rendered and 'href="http://evil.example"' not in rendered
    assert "track.example" in rendered and 'src="http://track.example' not in rendered
    assert rendered.count("<h1>") == 1 and "<h1>not a heading" not in rendered
    assert "<strong>b</strong>" not in rendered and "<em>i</em>" not in rendered
    for table in re.findall(r"<table>.*?</table>", rendered, flags=re.S):  # no row broken or widened
        rows = re.findall(r"<tr>(.*?)</tr>", table, flags=re.S)
        assert len({len(re.findall(r"<t[hd][ >]", row)) for row in rows}) == 1


# -- 13, 14: math text and non-ASCII names -------------------------------------------------------------
@pytest.mark.parametrize("name", ["bad $\\frac{$ math", "$x^$", "α-entmax", "entmax 😀", "ünïcödé", "x<y>|z"])
def test_names_are_plain_text_to_figures_and_latex(tmp_path: Path, name: str) -> None:
    rows = relabel(make_rows(ROWS, val=VAL), attn=name)
    rows = pd.concat([rows, relabel(make_rows({("softmax", 0): [1.0, 0.5]}), task=f"copy {name}")])
    own = folder(tmp_path, "ours", rows)
    result = runner.invoke(app, ["leaderboard", str(own), "--out", str(tmp_path / "board"), "--latex"])
    assert result.exit_code == 0, result.output
    plot = runner.invoke(app, ["plot", str(own), "--task", f"copy {name}", "-o", str(tmp_path / "p.svg")])
    assert plot.exit_code == 0, plot.output
    for tex in (tmp_path / "board" / "latex").glob("*.tex"):
        text = tex.read_bytes()
        assert text.isascii(), tex
        assert b"<" not in text and b">" not in text  # pdflatex's OT1 font prints them as ¡ and ¿
    if shutil.which("pdflatex") is None:
        return
    document = tmp_path / "board" / "latex" / "doc.tex"
    inputs = "".join(f"\\input{{{p.name}}}\n" for p in sorted(document.parent.glob("*.tex")))
    document.write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n" + inputs
                        + "\\end{document}\n", encoding="ascii")
    done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error", "doc.tex"],
                          cwd=document.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]


def test_a_control_character_in_a_name_is_one_warning(tmp_path: Path) -> None:
    rows = relabel(make_rows({("softmax", 0): [1.0, 0.5]}), attn="soft\x01max")
    own = folder(tmp_path, "ours", pd.concat([rows, make_rows(ROWS)]))
    readme, _, lines = board(own, out=tmp_path / "board", expect="is not a name (one line of at most 200")
    assert "soft\x01max" not in readme and len([line for line in lines if "skipped" in line]) == 1
