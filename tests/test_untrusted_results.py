"""Result folders are untrusted input (reading them): every row is checked before use, strings
from rows never become markup, paths or spreadsheet formulas, and the leaderboard is published
whole or not at all."""

from __future__ import annotations

import csv
import math
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen import files
from lengthgen.cli import app
from lengthgen.errors import UserNotice
from lengthgen.harness.storage.results import load_results, read_results_file, write_parquet_atomic
from lengthgen.harness.storage.schema import row_problem
from lengthgen.leaderboard import write_leaderboard
from lengthgen.leaderboard.safe import neutralise, slug
from tests.hostile import FORMULAS, SCRIPT, TRAVERSAL, relabel
from tests.leaderboard_rows import ROWS, make_rows

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


def cli(*args: str, env: dict[str, str] | None = None,
        timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lengthgen.cli", *args], capture_output=True, text=True,
                          env=env or ENV, timeout=timeout)


def good_rows() -> pd.DataFrame:
    return make_rows({("softmax", 0): [1.0, 0.5], ("softmax", 1): [0.9, 0.4]})


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# -- row 5: every row is checked against the results schema ----------------------------------------
#: (what a folder written by someone else holds, the reason the reader gives)
BAD_ROWS = {
    "config_json not JSON": ({"config_json": "{not json"}, "config_json is not a lengthgen run config"),
    "config_json a list": ({"config_json": "[1, 2]"}, "config_json is not a lengthgen run config"),
    "config_json {}": ({"config_json": "{}"}, "task: Field required"),
    "config_json null": ({"config_json": None}, "config_json is empty"),
    "exact_match as text": ({"exact_match": "0.5"}, "exact_match '0.5' is not a finite number"),
    "exact_match 5.0": ({"exact_match": 5.0}, "exact_match 5.0 is not a fraction in [0, 1]"),
    "seed NaN": ({"seed": math.nan}, "seed is empty"),
    "task an integer": ({"task": 3}, "task 3 is not text"),
    "bad created_at": ({"created_at": "last tuesday"}, "created_at 'last tuesday' is not a time"),
    "naive created_at": ({"created_at": "2026-01-01T00:00:00"}, "is not a time with a UTC offset"),
    "factor 0": ({"factor": 0}, "factor 0 is not an integer ≥ 1"),
    "factor -1": ({"factor": -1}, "factor -1 is not an integer ≥ 1"),
    "factor 1.5": ({"factor": 1.5}, "factor 1.5 is not an integer ≥ 1"),
    "factor not the length ratio": ({"factor": 4}, "factor 4 is not eval_length / train_length"),
    "unknown status": ({"status": "great"}, "status 'great' is not one of ok, failed"),
    "unknown selection": ({"selection": "best"}, "selection 'best' is not one of id, 8x"),
    "negative support": ({"attn_support": -1.0}, "attn_support -1.0 is negative"),
    "task not the config's": ({"task": "sort"}, "task 'sort' is not its config's 'copy'"),
    "run_id not the config's": ({"run_id": "zzz"}, "run_id 'zzz' is not its config's"),
    "config_hash not the config's": ({"config_hash": "0" * 16}, "is not the hash of its config_json"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_each_bad_row_is_named_with_its_reason(case: str) -> None:
    change, reason = BAD_ROWS[case]
    row = good_rows().iloc[1].to_dict()
    assert row_problem(row) is None
    assert reason in (row_problem({**row, **change}) or ""), row_problem({**row, **change})


def test_bad_rows_and_files_are_skipped_with_one_warning_each(tmp_path: Path) -> None:
    """Every bad file next to a good one: leaderboard and plot succeed on the good rows, naming
    each bad file once; a file with a few bad rows keeps its good ones."""
    folder = tmp_path / "results"
    good = good_rows()
    write_parquet_atomic(good, folder / "good.parquet")
    bad = {}
    for i, (change, _) in enumerate(BAD_ROWS.values()):
        frame = good.copy()
        for column, value in change.items():
            frame[column] = pd.Series([value] * len(frame), index=frame.index, dtype=object)
        bad[i] = folder / f"bad{i}.parquet"
        frame.to_parquet(bad[i])
    mixed = good.copy()
    mixed.loc[0, "exact_match"] = 7.0
    mixed.to_parquet(folder / "mixed.parquet")
    with pytest.warns(UserNotice) as caught:
        board = runner.invoke(app, ["leaderboard", str(folder), "--out", str(tmp_path / "board")])
        plot = runner.invoke(app, ["plot", str(folder), "--task", "copy", "-o", str(tmp_path / "p.svg")])
    assert board.exit_code == 0 and plot.exit_code == 0, board.output + plot.output
    messages = [str(w.message) for w in caught]
    for path in bad.values():
        assert sum(str(path) in m for m in messages) == 2, (path, messages)  # once per command
    assert sum("mixed.parquet: 1 of 4 rows are unusable (row 0: exact_match 7.0" in m for m in messages) == 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mixed_rows = read_results_file(folder / "mixed.parquet")
    assert mixed_rows is not None and len(mixed_rows) == 3
    assert mixed_rows["exact_match"].dtype == float


def test_load_results_on_a_missing_path_raises(tmp_path: Path) -> None:
    from lengthgen.errors import UserError

    with pytest.raises(UserError, match="no results under .*: no such file or folder"):
        load_results(tmp_path / "nothing")


# -- rows 1-3: strings from rows never become markup, paths or formulas ----------------------------
def test_slugs_are_names_for_plain_names_and_safe_otherwise() -> None:
    assert slug("copy") == "copy" and slug("flip_flop") == "flip_flop" and slug("a-b_1") == "a-b_1"
    for name in (TRAVERSAL, SCRIPT, "", ".", "..", "a/b", "a\\b", "é", "x" * 65, "a.b"):
        made = slug(name)
        assert "/" not in made and "\\" not in made and not made.startswith(".") and ".." not in made
        assert made.replace(".", "").replace("_", "").replace("-", "").isalnum(), made
    assert slug("a/b") != slug("a_b") and slug("a/b") != slug("a:b")  # the hash tells them apart


def test_a_task_name_cannot_write_outside_out(tmp_path: Path) -> None:
    rows = relabel(good_rows(), task=TRAVERSAL)
    write_parquet_atomic(rows, tmp_path / "in" / "rows.parquet")
    before = set(Path("/tmp").glob("x/PWNED*"))
    result = runner.invoke(app, ["leaderboard", str(tmp_path / "in"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    written = sorted(p for p in tmp_path.rglob("*") if p.is_file())
    assert all(p.is_relative_to(tmp_path / "out") or p.is_relative_to(tmp_path / "in") for p in written)
    assert set(Path("/tmp").glob("x/PWNED*")) == before
    plots = sorted(p.name for p in (tmp_path / "out" / "plots").iterdir())
    name = slug(TRAVERSAL)
    assert plots == ["overview.svg", f"{name}_dispersion.svg", f"{name}_exact_match.svg"]
    assert f"plots/{slug(TRAVERSAL)}_exact_match.svg" in (tmp_path / "out" / "README.md").read_text()


def test_strings_from_rows_are_escaped_in_the_page(tmp_path: Path) -> None:
    rows = relabel(good_rows(), task=SCRIPT, attn=SCRIPT + "a", pos=SCRIPT + "p", preset=SCRIPT + "q")
    write_leaderboard(rows, tmp_path, source=str(tmp_path), commit="c", title=SCRIPT, hardware=SCRIPT)
    page = (tmp_path / "leaderboard.html").read_text()
    assert "<script>window" not in page and "<img src=x" not in page and 'onerror="' not in page
    assert page.count("<script>") == 1  # the page's own sorting script
    assert f'id="task-{slug(SCRIPT)}"' in page and f'href="#task-{slug(SCRIPT)}"' in page


def test_csv_cells_are_never_formulas(tmp_path: Path) -> None:
    frames = [relabel(make_rows({("softmax", seed): [1.0, 0.5]}), task=formula, attn=formula)
              for seed, formula in enumerate(FORMULAS)]
    write_leaderboard(pd.concat(frames, ignore_index=True), tmp_path, source=str(tmp_path), commit="c")
    with open(tmp_path / "leaderboard.csv", newline="", encoding="utf-8") as handle:
        cells = [cell for row in csv.reader(handle) for cell in row]
    assert {f"'{f}" for f in FORMULAS} <= set(cells)
    risky = [c for c in cells if c[:1] in ("=", "+", "-", "@") and not _is_number(c)]
    assert risky == []
    assert neutralise("-0.5") == "-0.5" and neutralise("+1e-3") == "+1e-3" and neutralise(1) == 1


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# -- rows 10, 11: the board is published whole, or not at all --------------------------------------
def board_rows(tmp_path: Path) -> Path:
    rows = make_rows(ROWS)
    write_parquet_atomic(rows, tmp_path / "in" / "rows.parquet")
    return tmp_path / "in"


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize("existing", [False, True])
def test_an_interrupted_leaderboard_leaves_the_previous_board_or_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, existing: bool) -> None:
    source, out = board_rows(tmp_path), tmp_path / "out"
    if existing:
        made = runner.invoke(app, ["leaderboard", str(source), "--out", str(out), "--title", "old"])
        assert made.exit_code == 0, made.output
    before = tree(out) if existing else None
    real, calls = files.atomic_write, {"n": 0}

    def interrupted(path: object, data: object) -> Path:
        calls["n"] += 1
        if calls["n"] == 3:  # after two of the five files
            raise KeyboardInterrupt
        return real(path, data)  # type: ignore[arg-type]

    monkeypatch.setattr(files, "atomic_write", interrupted)
    result = runner.invoke(app, ["leaderboard", str(source), "--out", str(out), "--title", "new"])
    assert result.exit_code in (1, 130), result.output  # aborted
    assert (tree(out) == before) if existing else not out.exists()
    assert leftovers(tmp_path) == []


def test_sigint_during_leaderboard_leaves_a_whole_board(tmp_path: Path) -> None:
    """A real Ctrl-C at several moments: the folder always holds one whole board (every figure
    the pages name exists), old or new, and no temporary folder."""
    source, out = board_rows(tmp_path), tmp_path / "out"
    assert cli("leaderboard", str(source), "--out", str(out), "--title", "old").returncode == 0
    old = tree(out)
    for delay in (1.0, 2.5, 4.0):
        command = [sys.executable, "-m", "lengthgen.cli", "leaderboard", str(source), "--out", str(out),
                   "--title", f"new {delay}"]
        process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        process.send_signal(signal.SIGINT)
        process.wait(timeout=300)
        now = tree(out)
        readme = now["README.md"].decode()
        assert now == old or f"# new {delay}" in readme, delay
        figures = [line.split("](")[1].rstrip(")") for line in readme.splitlines() if line.startswith("![")]
        assert figures and all(name in now for name in figures), (delay, figures)
        assert leftovers(tmp_path) == []


def test_unusable_output_paths_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    source, out = board_rows(tmp_path), tmp_path / "out"
    out.mkdir()
    (out / "plots").write_text("a file where the figures go")
    result = runner.invoke(app, ["leaderboard", str(source), "--out", str(out)])
    assert result.exit_code == 2 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot write ")
    assert "is a file, not a folder" in lines[0]
    assert sorted(p.name for p in out.iterdir()) == ["plots"] and leftovers(tmp_path) == []


# -- row 15: a long legal output name stays legal -------------------------------------------------
def test_a_long_legal_figure_name_is_written(tmp_path: Path) -> None:
    source = board_rows(tmp_path)
    target = tmp_path / ("f" * 249 + ".svg")
    result = runner.invoke(app, ["plot", str(source), "--task", "copy", "-o", str(target)])
    assert result.exit_code == 0, result.output
    assert target.stat().st_size > 0 and leftovers(tmp_path) == []
    long_name = tmp_path / ("é" * 125 + "x.txt")  # 255 bytes in UTF-8
    files.atomic_write(long_name, b"ok")
    assert long_name.read_bytes() == b"ok"


# -- row 16: library warnings print as one line, once -----------------------------------------------
def stderr_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.strip()]


def test_library_warnings_are_one_line_each_and_shown_once(tmp_path: Path) -> None:
    home = tmp_path / "home-is-a-file"
    home.write_text("")
    rows = relabel(good_rows(), task="co\rpy")  # a carriage return: matplotlib has no glyph for it
    variant = good_rows().assign(eval_variant="attn=entmax")  # rows of a variant only
    write_parquet_atomic(pd.concat([rows, variant], ignore_index=True), tmp_path / "in" / "rows.parquet")
    (tmp_path / "in" / "corrupt.parquet").write_bytes(b"PAR1 not really")
    env = {k: v for k, v in ENV.items() if not k.startswith(("XDG_", "MPLCONFIGDIR"))}
    done = cli("leaderboard", str(tmp_path / "in"), "--out", str(tmp_path / "out"),
               env={**env, "HOME": str(home)})
    assert done.returncode == 0, done.stderr
    lines = stderr_lines(done)
    assert lines and all(line.startswith("warning: ") for line in lines), lines
    assert len(lines) == len(set(lines))
    assert sum("corrupt.parquet" in line for line in lines) == 1
    assert any("matplotlib" in line.lower() for line in lines), lines  # HOME unusable: said, in one line


def test_the_results_warning_of_an_ablation_is_shown_once(tmp_path: Path) -> None:
    source = board_rows(tmp_path)
    ablation = tmp_path / "abl" / "one"
    write_parquet_atomic(make_rows({("softmax", 0): [1.0, 0.5]}), ablation / "data" / "r.parquet")
    (ablation / "data" / "corrupt.parquet").write_bytes(b"")
    (ablation / "ABOUT.md").write_text("# One\n\nText.\n")
    done = cli("leaderboard", str(source), "--out", str(tmp_path / "out"), "--ablations",
               str(tmp_path / "abl"))
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in stderr_lines(done) if "corrupt.parquet" in line]
    assert line.startswith(f"warning: skipped {ablation / 'data' / 'corrupt.parquet'}: unreadable")


def test_a_symlink_loop_as_out_is_named(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    result = runner.invoke(app, ["leaderboard", str(board_rows(tmp_path)), "--out", str(loop / "board")])
    assert result.exit_code == 2
    assert "is a symbolic link that leads nowhere" in result.stderr and len(result.stderr.splitlines()) == 1
