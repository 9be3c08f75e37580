"""Adversarial input to the command line: each case exits 2 with one ``error:`` line and writes
nothing, or does what the user asked. Grouped as: sizes past the limits, settings that must be
honoured, settings that must be refused, output paths, click-level errors, bad results files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.errors import UserNotice

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent
COMMITTED = REPO / "leaderboard" / "ablations" / "quick-preset" / "data"  # stable committed rows
# -- sizes past the limits ---------------------------------------------------------------------
MEASURE = textwrap.dedent(
    """
    import resource, subprocess, sys, time
    start = time.perf_counter()
    command = [sys.executable, "-m", "lengthgen.cli", *sys.argv[1:]]
    done = subprocess.run(command, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(done.returncode, round(seconds, 3), peak_kb, repr(done.stdout), repr(done.stderr), sep="\\t")
    """
)


def test_a_billion_tokens_is_refused_at_once_in_little_memory() -> None:
    """The process that runs the command is measured alone (its own child), so its peak resident
    memory is the command's."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-c", MEASURE, "sample", "--task", "copy", "--length", "1000000000"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=60)
    code, seconds, peak_kb, stdout, stderr = done.stdout.strip().split("\t")
    assert int(code) == 2 and eval(stdout) == ""
    assert eval(stderr).strip() == "error: length 1,000,000,000 is over the limit of 1,048,576"
    assert float(seconds) < 2.0, seconds
    assert int(peak_kb) < 500 * 1024, peak_kb


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sample", "--task", "copy", "--length", "8", "--n", "1000000000"], "n 1,000,000,000 is over"),
        (["sample", "--task", "copy", "--length", "100000", "--n", "100000"], "n × length 10,000,000,000"),
        (["sweep", "--task", "copy", "--attn", "softmax", "--seeds", "0-100000000"], "number of seeds"),
        (["sweep", "--task", "copy", "--attn", "softmax", "--seeds", "0-99,5-9999999"], "number of seeds"),
        (["run", "--task", "copy", "--attn", "softmax", "--max-factor", "1073741824"], "max_factor"),
        (["run", "--task", "copy", "--attn", "softmax", "--max-factor", "131072"], "longest evaluation"),
        (["run", "--task", "copy", "--attn", "softmax", "--steps", "1000000000000"], "train.steps"),
        (["run", "--task", "copy", "--attn", "softmax", "--set", "arch.n_layers=100000"], "model size"),
    ],
)
def test_sizes_past_the_limits(
    tmp_path: Path, args: list[str], expected: str, one_line_error: Callable[..., None]
) -> None:
    out = ["--out", str(tmp_path / "out")] if args[0] in ("run", "sweep") else []
    one_line_error(runner.invoke(app, [*args, *out]), expected, silent=True)
    assert not (tmp_path / "out").exists()


# -- settings that must be honoured ---------------------------------------------------------------
def test_run_honours_set_like_sweep(tmp_path: Path, tiny_flags: Callable[..., list[str]]) -> None:
    sets = ["--set", "train.steps=7", "--set", "eval.max_factor=4", "--set", "train.train_length=8"]
    result = runner.invoke(app, ["run", "--task", "copy", "--attn", "softmax", *sets,
                                 *tiny_flags({"eval.samples": 4}),
                                 "--out", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output
    (run_dir,) = (tmp_path / "runs").iterdir()
    config = RunConfig.model_validate_json((run_dir / "config.json").read_text())
    assert (config.train.steps, config.eval.max_factor, config.train.train_length) == (7, 4, 8)
    assert (config.arch.d_model, config.train.batch_size, config.eval.samples) == (32, 8, 4)
    rows = pd.read_parquet(run_dir / "results.parquet")
    assert list(rows["eval_length"]) == [8, 16, 32] and set(rows["steps"]) == {7}
    swept = runner.invoke(app, ["sweep", "--task", "copy", "--attn", "softmax", *sets,
                                *tiny_flags({"eval.samples": 4}),
                                "--out", str(tmp_path / "sweep")])
    assert swept.exit_code == 0, swept.output
    assert [p.stem for p in (tmp_path / "sweep" / "data").glob("*.parquet")] == [run_dir.name]


# -- settings that must be refused ------------------------------------------------------------------
REFUSED = {
    "not a number": (["--set", "train.steps=abc"], "train.steps: Input should be a valid integer"),
    "fewest over most": (["--set", "eval.samples=4", "--set", "eval.min_samples=100"],
                         "min_samples 100 is over samples 4"),
    "low end over L": (["--set", "train.min_train_length=100"], "min_train_length 100 is over train_length"),
    "unknown field": (["--set", "eval.maxfactor=4"], "eval.maxfactor: Extra inputs are not permitted"),
    "set twice": (["--steps", "5", "--set", "train.steps=7"], "train.steps is set twice"),
    "negative seed": (["--seed", "-1"], "seed -1 is out of range"),
    "huge seed": (["--seed", "99999999999999999999999"], "is out of range"),
    "NaN option": (["--attn", "asentmax", "--attn-option", "delta=NaN"], "delta=nan: must be a finite"),
    "infinite option": (["--attn", "asentmax", "--attn-option", "beta_init=Infinity"], "must be a finite"),
    "option of another backend": (["--attn-option", "delta=1"], "valid options: (none)"),
    "NaN learning rate": (["--set", "train.lr=NaN"], "train.lr: Input should be a finite number"),
    "empty out": (["--out", ""], "--out is empty"),
    "unknown tracker": (["--log", "mlflow"], "Invalid value for '--log'"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_run_refuses(tmp_path: Path, case: str, one_line_error: Callable[..., None]) -> None:
    extra, expected = REFUSED[case]
    args = ["run", "--task", "copy", "--attn", "softmax", "--out", str(tmp_path / "runs"), *extra]
    if "--attn" in extra:  # the case picks the backend
        index = args.index("--attn")
        del args[index:index + 2]
    one_line_error(runner.invoke(app, args), expected, silent=True)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sample", "--task", "copy", "--length", "8", "--seed", "-1"], "seed -1 is out of range"),
        (["sample", "--task", "copy", "--length", "8", "--seed", "99999999999999999999"], "out of range"),
        (["sweep", "--task", "copy", "--attn", "softmax", "--seeds", "0,99999999999999999999", "--out", "s"],
         "out of range"),
        (["sweep", "--task", "copy", "--attn", "softmax", "--seeds", "5-2", "--out", "s"], "end is before"),
        (["sweep", "--task", "copy", "--attn", "asentmax", "--set", "train.lr=Infinity", "--out", "s"],
         "train.lr: Input should be a finite number"),
    ],
)
def test_seeds_and_numbers_elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str],
                                     expected: str, one_line_error: Callable[..., None]) -> None:
    monkeypatch.chdir(tmp_path)
    one_line_error(runner.invoke(app, args), expected, silent=True)
    assert not (tmp_path / "s").exists()


# -- output paths -------------------------------------------------------------------------------------
def test_output_paths(tmp_path: Path, one_line_error: Callable[..., None]) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("not a folder")
    run = ["run", "--task", "copy", "--attn", "softmax"]
    one_line_error(runner.invoke(app, [*run, "--out", str(a_file)]), "is a file, not a folder", silent=True)
    one_line_error(runner.invoke(app, [*run, "--out", str(a_file / "runs")]), "is a file, not a folder",
                   silent=True)
    sweep = ["sweep", "--task", "copy", "--attn", "softmax"]
    one_line_error(runner.invoke(app, [*sweep, "--out", str(a_file)]), "is a file, not a folder", silent=True)
    one_line_error(runner.invoke(app, ["leaderboard", str(COMMITTED), "--out", str(a_file)]),
                   "is a file, not a folder", silent=True)
    one_line_error(runner.invoke(app, ["plot", str(COMMITTED), "--task", "copy", "-o", str(tmp_path)]),
                   "is a folder: give a file name", silent=True)
    one_line_error(runner.invoke(app, ["plot", str(COMMITTED), "--task", "copy", "-o", ""]), "-o is empty",
                   silent=True)
    assert a_file.read_text() == "not a folder" and sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]


def test_run_prints_where_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_flags: Callable[..., list[str]]
) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", "--task", "copy", "--attn", "softmax", "--steps", "2", "--max-factor",
                                 "1", *tiny_flags({"eval.samples": 4}), "--out", "."])
    assert result.exit_code == 0, result.output
    (printed,) = [line for line in result.stdout.splitlines() if line.startswith("results: ")]
    assert Path(printed.removeprefix("results: ")).is_file() and not printed.startswith("results: /")


# -- click-level errors -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["sample", "--task", "copy", "--length", "1.5"], "Invalid value for '--length'"),
        (["sample", "--task", "copy", "--length", "8", "--format", "xml"], "'xml' is not one of 'jsonl'"),
        (["sample", "--task", "copy"], "Missing option '--length'"),
        (["sample", "--task", "copy", "--length", "8", "--colour"], "No such option: --colour"),
        (["run", "--task", "copy", "--attn", "softmax", "--device", "tpu"], "'tpu' is not one of"),
        (["eval", "runs/x", "--precision", "fp16"], "'fp16' is not one of 'fp32', 'bf16'"),
        (["smaple"], "No such command 'smaple'"),
    ],
)
def test_click_errors_are_one_line(
    args: list[str], expected: str, one_line_error: Callable[..., None]
) -> None:
    one_line_error(runner.invoke(app, args), expected, silent=True)


@pytest.mark.parametrize("command, defaults", [
    ("sweep", ["[default: nape]", "[default: 0]", "[default: quick]"]),
    ("leaderboard", ["[default: lengthgen leaderboard]"]),
    ("verify", ["[default: all]"]),
])
def test_help_shows_the_defaults_an_option_fills_in_later(command: str, defaults: list[str]) -> None:
    """Options that default to None name their effective default in the help, which the help's
    markup would take for a tag unless escaped."""
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "250"})
    assert result.exit_code == 0
    for default in defaults:
        assert default in result.output, result.output


# -- results files that cannot be used ------------------------------------------------------------
def bad_results_folder(root: Path) -> dict[str, Path]:
    """One good results file and five bad ones next to it."""
    root.mkdir()
    good = sorted(COMMITTED.glob("copy-softmax-*.parquet"))[0]
    shutil.copy(good, root / good.name)
    frame = pd.read_parquet(good)
    bad = {"truncated": root / "truncated.parquet", "empty": root / "empty.parquet",
           "not parquet": root / "notes.parquet", "no exact_match": root / "foreign.parquet",
           "null task": root / "nulltask.parquet"}
    bad["truncated"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    bad["empty"].write_bytes(b"")
    bad["not parquet"].write_text("exact_match,factor\n1,1\n")
    frame.drop(columns=["exact_match"]).to_parquet(bad["no exact_match"])
    frame.assign(task=None).to_parquet(bad["null task"])
    return bad


def test_bad_results_files_are_skipped_by_name(tmp_path: Path) -> None:
    bad = bad_results_folder(tmp_path / "results")
    with pytest.warns(UserNotice) as caught:
        board = runner.invoke(app, ["leaderboard", str(tmp_path / "results"), "--out",
                                    str(tmp_path / "board")])
    assert board.exit_code == 0, board.output
    messages = [str(w.message) for w in caught]
    for path in bad.values():
        assert sum(str(path) in m for m in messages) == 1, (path, messages)
    lines = (tmp_path / "board" / "README.md").read_text().splitlines()
    assert any(line.startswith("| softmax | nape | ") for line in lines)
    with pytest.warns(UserNotice):
        plot = runner.invoke(app, ["plot", str(tmp_path / "results"), "--task", "copy", "-o",
                                   str(tmp_path / "p.png")])
    assert plot.exit_code == 0 and (tmp_path / "p.png").stat().st_size > 0


def test_only_bad_results_files_exit_2_with_one_line_warnings(tmp_path: Path) -> None:
    """In a real process: one ``warning:`` line per skipped file, then one ``error:`` line."""
    bad = bad_results_folder(tmp_path / "results")
    for good in (tmp_path / "results").glob("copy-*.parquet"):
        good.unlink()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for args in (["leaderboard", str(tmp_path / "results"), "--out", str(tmp_path / "board")],
                 ["plot", str(tmp_path / "results"), "--task", "copy", "-o", str(tmp_path / "p.png")]):
        done = subprocess.run([sys.executable, "-m", "lengthgen.cli", *args], capture_output=True, text=True,
                              env=env, timeout=120)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert len(lines) == len(bad) + 1 and "Traceback" not in done.stderr
        assert all(line.startswith("warning: skipped ") for line in lines[:-1])
        assert lines[-1].startswith("error: no usable results under")
    assert not (tmp_path / "board").exists() and not (tmp_path / "p.png").exists()
