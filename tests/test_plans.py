"""Leaderboard plans: the plan file is checked like every input, ``sweep --plan`` does exactly the
missing work (screening, the remaining seeds at the point chosen on validation, the evaluation
extended to the full range) and nothing else, and the board built from a plan shows its runs and
its commands. The runs are tiny (a few training steps, a handful of test samples)."""

from __future__ import annotations

import importlib.util
import shutil
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.errors import UserError
from lengthgen.harness.evaluate import wilson_interval
from lengthgen.harness.resume import STATE_FILE, TrainingProgress, save_progress
from lengthgen.harness.storage.results import rows_to_frame, write_parquet_atomic
from lengthgen.leaderboard import load_rows
from lengthgen.leaderboard.rows import prepared, runs, setting_of
from lengthgen.leaderboard.selection import select_settings
from lengthgen.plans.estimate import Timings
from lengthgen.plans.execute import run_plan
from lengthgen.plans.listing import dry_run_lines, missing_run_lines
from lengthgen.plans.plan import (
    BoardPlan,
    blocks,
    board_run_ids,
    configs_at,
    load_plan,
    screening_progress,
    survey,
)
from lengthgen.plans.sweep import sweep_plan
from lengthgen.sweeps import data_path, run_key
from tests.hostile import forged

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()

#: A plan of two tiny sweeps (flip_flop with a screened grid, max_retrieval); ``{ff}`` and ``{mr}``
#: are their settings, the tiny model's with ``FF_RUN`` and ``MR_RUN``.
TINY_PLAN = """
title = "tiny board"
hardware = "test machine"

[[sweep]]
name = "ff"
task = ["flip_flop"]
attn = ["softmax"]
seeds = [0, 1]
grid = {{ "train.lr" = [1e-3, 2e-3] }}
screen = {{ max_factor = {screen} }}
[sweep.set]
{ff}

[[sweep]]
name = "mr"
task = ["max_retrieval"]
attn = ["entmax"]
seeds = [0]
[sweep.set]
{mr}
"""
FF_RUN = {"train.steps": 4, "train.val_every": 2, "eval.samples": 4, "eval.min_samples": 4,
          "eval.max_factor": 4}
MR_RUN = {"train.steps": 2, "eval.samples": 4, "eval.min_samples": 4, "eval.max_factor": 2}


@pytest.fixture
def tiny_plan(tiny_settings: Callable[..., dict[str, Any]]) -> Callable[[int], str]:
    """``tiny_plan(screen)``: the text of ``TINY_PLAN``, its grid screened up to ``screen``×."""

    def toml(run: dict[str, Any]) -> str:
        # the sweep's own settings first, then by section: the board lists them in this order
        settings = {**run, **tiny_settings(run)}
        section = {"train": 0, "arch": 1, "eval": 2}
        ordered = sorted(settings.items(), key=lambda item: section[item[0].split(".")[0]])
        return "\n".join(f'"{k}" = {v}' for k, v in ordered)

    return lambda screen: TINY_PLAN.format(screen=screen, ff=toml(FF_RUN), mr=toml(MR_RUN))


@pytest.fixture
def write_plan(tiny_plan: Callable[[int], str]) -> Callable[..., Path]:
    """``write_plan(folder, screen=1, text=None)``: ``folder/plan.toml`` holding ``text``, or the tiny
    plan screened up to ``screen``×."""

    def write(tmp_path: Path, screen: int = 1, text: str | None = None) -> Path:
        path = tmp_path / "plan.toml"
        path.write_text(textwrap.dedent(text if text is not None else tiny_plan(screen)), encoding="utf-8")
        return path

    return write


@pytest.fixture
def screened(tmp_path: Path, write_plan: Callable[..., Path]) -> tuple[BoardPlan, RunConfig, RunConfig]:
    """The tiny plan screened up to 2×, and its grid's two screening runs (lower lr first)."""
    plan = load_plan(write_plan(tmp_path, screen=2))
    low, high = sorted(blocks(plan)[0].screening, key=lambda c: c.train.lr)
    return plan, low, high


def ok_factors(out: Path, config: RunConfig) -> list[int]:
    rows = pd.read_parquet(data_path(out, run_key(config)))
    return sorted(int(f) for f in rows.loc[rows["status"] == "ok", "factor"])


@pytest.mark.parametrize(("text", "message"), [
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\ncolour = 'red'\n", "colour"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['no_such_backend']\n", "no_such_backend"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\nscreen = { max_factor = 2 }\n",
     "screen needs a grid"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\nseeds = [0, 1]\n"
     "grid = { 'train.lr' = [1e-3, 2e-3] }\nscreen = { seeds = [5] }\n", "not all in seeds"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\ngrid = { 'train.lr' = [1e-3] }\n",
     "two or more distinct values"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\n"
     "[[sweep]]\nname = 'a'\ntask = ['sort']\nattn = ['softmax']\n", "share a name"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\n"
     "[[sweep]]\nname = 'b'\ntask = ['copy']\nattn = ['softmax']\n", "both make run"),
    ("ablations = 'x'\n[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\n"
     "[[reason]]\ntask = 'copy'\nattn = ['ssmax']\nablation = 'x'\ntext = 'y'\n",
     "no sweep of the plan runs it"),
    ("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\n"
     "[[reason]]\ntask = 'copy'\nattn = ['softmax']\nablation = 'x'\ntext = 'y'\n", "no ablations folder"),
    ("[[sweep]\nname = ", "not a valid TOML file"),
    ("title = 'no sweeps'\n", "sweep"),
])
def test_a_bad_plan_is_one_line_and_exit_2(
    tmp_path: Path, text: str, message: str, write_plan: Callable[..., Path]
) -> None:
    path = write_plan(tmp_path, text=text)
    with pytest.raises(UserError, match=message):
        blocks(load_plan(path))
    result = runner.invoke(app, ["sweep", "--plan", str(path), "--out", str(tmp_path / "out"), "--dry-run"])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_plan_flags_that_the_plan_sets_are_refused(tmp_path: Path, write_plan: Callable[..., Path]) -> None:
    path = write_plan(tmp_path)
    result = runner.invoke(app, ["sweep", "--plan", str(path), "--out", str(tmp_path / "o"), "--task", "copy",
                                 "--set", "train.lr=1e-3"])
    assert result.exit_code == 2 and "--task, --set" in result.output
    result = runner.invoke(app, ["sweep", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "--task and --attn (or --plan FILE)" in result.output
    missing = runner.invoke(app, ["sweep", "--plan", str(tmp_path / "nope.toml"), "--out", "o", "--dry-run"])
    assert missing.exit_code == 2 and "no such file" in missing.output


def test_the_plan_does_the_missing_work_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], write_plan: Callable[..., Path]
) -> None:
    """Screening on seed 0 up to 2x, seed 1 only at the chosen point, every chosen run evaluated to
    the full 4x, a single-setting sweep as it is; run again, nothing happens."""
    plan = load_plan(write_plan(tmp_path, screen=2))
    out = tmp_path / "board"
    report = run_plan(plan, out, progress=True)  # stderr is no terminal here: progress as in a log
    assert not report.failed and report.remaining == 0
    ff, mr = blocks(plan)
    assert [c.seed for c in ff.screening] == [0, 0] and {c.eval.max_factor for c in ff.screening} == {2}
    for config in ff.screening:
        assert ok_factors(out, config)[:2] == [1, 2]
    # the point the plan chose is the leaderboard's choice, made on the screening runs alone
    screening_rows = pd.concat([load_rows(data_path(out, run_key(c))) for c in ff.screening])
    table = runs(prepared(screening_rows))
    winner = select_settings(table)[("flip_flop", "softmax", "nape")].ranked[0].setting
    state = survey(plan, out)[0]
    chosen = configs_at(ff, state.chosen, (0, 1))
    assert {setting_of(c.canonical_json()) for c in chosen} == {winner}
    for config in chosen:  # both seeds of the chosen point reach the preset's whole range
        assert ok_factors(out, config) == [1, 2, 4]
    loser = next(c for c in ff.screening if run_key(c) not in {run_key(x) for x in chosen})
    assert ok_factors(out, loser) == [1, 2]  # never tested past the screening factor
    keys = {p.stem for p in (out / "data").glob("*.parquet")}
    assert keys == {run_key(c) for c in [*ff.screening, *chosen, *mr.screening]}
    assert keys == board_run_ids(survey(plan, out))
    # a chosen run is extended as soon as it is trained (its model is on disk), before more training
    kinds = [(d.work.kind, d.work.config.task, d.work.config.seed) for d in report.done]
    assert kinds == [("seed", "max_retrieval", 0), ("screen", "flip_flop", 0), ("screen", "flip_flop", 0),
                     ("extend", "flip_flop", 0), ("seed", "flip_flop", 1), ("extend", "flip_flop", 1)]
    # the log says where each piece stands: its run's training, the lengths an extension evaluated
    log = capsys.readouterr().err
    for done in report.done:
        steps = done.work.config.train.steps
        expected = (f"evaluate {done.work.key}: 4x done, 1/1 lengths" if done.work.kind == "extend"
                    else f"train {done.work.key}: {steps}/{steps} steps (100%)")
        assert expected in log, log
    again = run_plan(plan, out, progress=False)
    assert again.done == [] and again.remaining == 0
    lines = dry_run_lines(survey(plan, out), Timings.from_folders(out))
    assert lines[-1] == "nothing missing: every run of the plan is recorded"


def _fake_run(out: Path, config: RunConfig, val_id: float, test_1x: float, val_8x: float = 0.0,
              factors: tuple[int, ...] | None = None) -> None:
    """A recorded run with a given 1x (and 8x) validation and 1x test exact match (no training),
    tested at its config's factors or at ``factors`` (a run extended since)."""
    rows = _result_rows(config, val_id, test_1x, val_8x, factors)
    write_parquet_atomic(rows, data_path(out, run_key(config)))


def _result_rows(config: RunConfig, val_id: float, test_1x: float, val_8x: float = 0.0,
                 factors: tuple[int, ...] | None = None) -> pd.DataFrame:
    lo, hi = wilson_interval(round(test_1x * 4), 4)
    rows = [{"run_id": run_key(config), "task": config.task, "attn": config.attn, "pos": config.pos,
             "seed": config.seed, "preset": config.preset, "train_length": config.train.train_length,
             "eval_length": config.train.train_length * f, "factor": f, "n_samples": 4,
             "exact_match": test_1x, "exact_match_lo": lo, "exact_match_hi": hi, "steps": config.train.steps,
             "val_exact_id": val_id, "val_exact_8x": val_8x, "train_seconds": 60.0, "eval_seconds": 2.0,
             "config_hash": config.config_hash(), "config_json": config.canonical_json(), "status": "ok",
             "created_at": "2026-01-01T00:00:00+00:00"} for f in factors or config.eval.factors()]
    return rows_to_frame(rows)


def test_the_choice_is_made_on_validation_never_on_test(
    tmp_path: Path, write_plan: Callable[..., Path]
) -> None:
    """lr 1e-3 validates better, lr 2e-3 tests better: the remaining seed runs at 1e-3."""
    plan = load_plan(write_plan(tmp_path, screen=2))
    out = tmp_path / "board"
    ff = blocks(plan)[0]
    low, high = sorted(ff.screening, key=lambda c: c.train.lr)
    _fake_run(out, low, val_id=0.9, test_1x=0.25)
    _fake_run(out, high, val_id=0.5, test_1x=1.0)
    state = survey(plan, out)[0]
    assert state.chosen == {"train.lr": 1e-3}
    # the chosen screening run has no model.pt to extend: it is trained again first
    assert [(w.kind, w.config.seed, w.config.train.lr, w.restore) for w in state.work] == [
        ("extend", 0, 1e-3, True), ("seed", 1, 1e-3, False)]
    lines = dry_run_lines(survey(plan, out), Timings.from_folders(out))
    assert any(line.startswith("ff: flip_flop/softmax/nape (chosen train.lr=0.001)") for line in lines)
    # estimates come from the recorded timings: 60 s of training per 4 steps, 2 s per test length (1x, 2x)
    seed_line = next(line for line in lines if "run flip_flop-softmax-nape-s1" in line)
    assert seed_line.endswith("~64 s")
    # training again is estimated as the run it repeats (trained, tested to 2x), plus the 4x test
    again = next(line for line in lines if run_key(low) in line)
    at_4x = Timings.from_folders(out).eval_seconds(low, (4,))
    assert at_4x is not None and at_4x > 2
    assert "train again (model.pt gone), evaluate at 4x" in again and again.endswith(f"~{64 + at_4x:.0f} s")


def test_the_paper_protocol_pick_is_evaluated_over_the_whole_range_once_every_run_is_trained(
        tmp_path: Path, write_plan: Callable[..., Path]) -> None:
    """The runner-up point's screening run validates best at 8x: it is the backend's paper-protocol
    pick, so once seed 1 is recorded it is evaluated to 4x like the chosen runs; a seed 1 that
    validates better at 8x takes the pick, and the runner-up stays at the screening factor."""
    plan = load_plan(write_plan(tmp_path, screen=2))
    out = tmp_path / "board"
    ff = blocks(plan)[0]
    low, high = sorted(ff.screening, key=lambda c: c.train.lr)
    _fake_run(out, low, val_id=0.9, test_1x=1.0, val_8x=0.1)
    _fake_run(out, high, val_id=0.5, test_1x=1.0, val_8x=0.8)
    assert [(w.kind, w.protocol) for w in survey(plan, out)[0].work] == [("extend", False), ("seed", False)]
    seed_1 = next(w.config for w in survey(plan, out)[0].work if w.kind == "seed")
    _fake_run(out, low, val_id=0.9, test_1x=1.0, val_8x=0.1, factors=(1, 2, 4))  # the chosen runs reach 4x
    _fake_run(out, seed_1, val_id=0.9, test_1x=1.0, val_8x=0.2, factors=(1, 2, 4))
    [work] = survey(plan, out)[0].work
    assert (work.kind, work.key, work.factors, work.restore, work.protocol) == (
        "extend", run_key(high), (4,), True, True)
    lines = dry_run_lines(survey(plan, out), Timings.from_folders(out))
    assert any(f"evaluate the paper-protocol pick at 4x {run_key(high)}" in line for line in lines), lines
    summary = "missing: 1 run and 1 evaluation now, 0 more after a choice;"  # the run: sweep mr's
    assert lines[-1].startswith(summary), lines[-1]
    _fake_run(out, seed_1, val_id=0.9, test_1x=1.0, val_8x=0.9, factors=(1, 2, 4))
    assert survey(plan, out)[0].work == []


def _stopped_at(out: Path, folder_of: RunConfig, state_of: RunConfig, step: int) -> None:
    """A training state of ``state_of`` after ``step`` steps, in the run folder of ``folder_of``."""
    import torch

    model = torch.nn.Linear(2, 2)
    folder = out / "runs" / run_key(folder_of)
    folder.mkdir(parents=True, exist_ok=True)
    save_progress(folder / STATE_FILE, state_of, model, torch.optim.AdamW(model.parameters()),
                  TrainingProgress(step=step))


def test_a_missing_run_whose_training_was_stopped_is_listed_with_the_steps_left(
    tmp_path: Path, screened: tuple[BoardPlan, RunConfig, RunConfig]
) -> None:
    plan, low, high = screened
    out = tmp_path / "board"
    _fake_run(out, low, val_id=0.9, test_1x=0.25)
    _fake_run(out, high, val_id=0.5, test_1x=1.0)
    seed_1 = next(w.config for w in survey(plan, out)[0].work if w.kind == "seed")
    _stopped_at(out, seed_1, seed_1, step=2)
    assert [(w.kind, w.resumes_at) for w in survey(plan, out)[0].work] == [("extend", None), ("seed", 2)]
    timings = Timings.from_folders(out)
    line = next(line for line in dry_run_lines(survey(plan, out), timings) if run_key(seed_1) in line)
    # half the training left (60 s recorded for 4 steps) and the whole evaluation (2 s per length)
    assert line.endswith("~34 s, resumes its saved training at step 2")
    seed_2 = seed_1.model_copy(update={"seed": 2})
    plain = missing_run_lines([seed_1, seed_2], str(out), timings)
    assert plain[0].endswith("~34 s, resumes its saved training at step 2")
    assert plain[1].endswith("~64 s") and plain[2] == "missing: 2 of 2 runs; estimated CPU time 2 min"
    _stopped_at(out, seed_1, seed_1, step=seed_1.train.steps)  # trained, stopped while it evaluated
    line = next(line for line in dry_run_lines(survey(plan, out), timings) if run_key(seed_1) in line)
    assert line.endswith("~4 s, trained: evaluates 1x, 2x")
    # it had evaluated 1x: only 2x is left (a 2x row of another config is not the run's own)
    other = seed_1.model_copy(update={"train": seed_1.train.model_copy(update={"lr": 0.5})})
    write_parquet_atomic(pd.concat([_result_rows(seed_1, 0.9, 1.0, factors=(1,)),
                                    _result_rows(other, 0.9, 1.0, factors=(2,))], ignore_index=True),
                         out / "runs" / run_key(seed_1) / "results.parquet")
    assert [w.kept for w in survey(plan, out)[0].work if w.kind == "seed"] == [(1,)]
    line = next(line for line in dry_run_lines(survey(plan, out), timings) if run_key(seed_1) in line)
    assert line.endswith("~2 s, trained: evaluates 2x")
    assert missing_run_lines([seed_1], str(out), timings)[0].endswith("~2 s, trained: evaluates 2x")


def test_a_state_the_run_would_not_resume_is_not_listed_as_resuming(
    tmp_path: Path, screened: tuple[BoardPlan, RunConfig, RunConfig]
) -> None:
    """Another config's state, or an unreadable file, trains from step 0: listed with the whole run."""
    plan, low, high = screened
    out = tmp_path / "board"
    _stopped_at(out, low, high, step=2)
    (out / "runs" / run_key(high)).mkdir(parents=True)
    (out / "runs" / run_key(high) / STATE_FILE).write_bytes(b"not a training state")
    assert [(w.kind, w.resumes_at) for w in survey(plan, out)[0].work] == [("screen", None), ("screen", None)]
    listed = missing_run_lines([low, high], str(out), Timings.from_folders(out))
    assert len(listed) == 3 and not any("resumes" in line for line in listed)


def _drop_factor(out: Path, config: RunConfig, factor: int) -> pd.DataFrame:
    """Remove one length's row from a recorded run's data file; returns the row."""
    path = data_path(out, run_key(config))
    rows = pd.read_parquet(path)
    write_parquet_atomic(rows[rows["factor"] != factor].reset_index(drop=True), path)
    return rows[rows["factor"] == factor].reset_index(drop=True)


def test_a_run_whose_model_is_gone_is_trained_again_checked_and_extended(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], write_plan: Callable[..., Path]) -> None:
    """A fresh clone holds data/, not model.pt: the plan retrains the run, extends it only when
    the retrained model reproduces the recorded rows, and the new length is the one it had."""
    plan = load_plan(write_plan(tmp_path, screen=2))
    out = tmp_path / "board"
    run_plan(plan, out, progress=False)
    config = configs_at(blocks(plan)[0], survey(plan, out)[0].chosen, (1,))[0]
    key = run_key(config)
    first = _drop_factor(out, config, 4)
    shutil.rmtree(out / "runs" / key)
    [work] = [w for s in survey(plan, out) for w in s.work]
    assert (work.kind, work.key, work.factors, work.restore) == ("extend", key, (4,), True)
    capsys.readouterr()
    report = run_plan(plan, out, progress=True)  # stderr is no terminal here: progress as in a log
    assert not report.failed and report.remaining == 0
    log = capsys.readouterr().err  # the retraining's lines, then the length it evaluated
    steps = config.train.steps
    assert log.index(f"train {key}: {steps}/{steps} steps") < log.index(f"evaluate {key}: 4x done")
    assert (out / "runs" / key / "model.pt").is_file()
    assert not list((out / "runs").glob(".restore-*"))  # the scratch folder is gone
    assert ok_factors(out, config) == [1, 2, 4]
    redone = pd.read_parquet(data_path(out, run_key(config)))
    redone = redone[redone["factor"] == 4].reset_index(drop=True)
    for column in ("exact_match", "token_accuracy", "attn_entropy", "n_samples", "best_step"):
        assert redone.loc[0, column] == first.loc[0, column], column
    # a recorded row the retrained model does not reproduce: nothing is restored or extended
    _drop_factor(out, config, 4)
    shutil.rmtree(out / "runs" / key)
    path = data_path(out, key)
    rows = pd.read_parquet(path)
    forgery = forged(rows, rows["factor"] == 1)  # consistent with its interval: the reader takes it
    write_parquet_atomic(forgery, path)
    report = run_plan(plan, out, progress=False)
    [failed] = report.failed
    published = float(forgery.loc[forgery["factor"] == 1, "exact_match"].iloc[0])
    assert f"not reproduce its recorded rows (1×: exact_match published {published!r}" in (failed.error or "")
    assert not (out / "runs" / key).exists() and ok_factors(out, config) == [1, 2]
    assert not list((out / "runs").glob(".restore-*"))


def test_leaderboard_from_a_plan_shows_its_runs_and_its_commands(
    tmp_path: Path, write_plan: Callable[..., Path]
) -> None:
    path = write_plan(tmp_path, screen=2)
    out = tmp_path / "board"
    run_plan(load_plan(path), out, progress=False)
    # a valid run of another seed in the same folder: not a run of the plan, so not on its board
    mr = blocks(load_plan(path))[1].screening[0]
    other = mr.model_copy(update={"seed": 9})
    stray = load_rows(data_path(out, run_key(mr))).assign(
        run_id=run_key(other), seed=9, config_json=other.canonical_json(), config_hash=other.config_hash())
    write_parquet_atomic(stray, data_path(out, run_key(other)))
    page = tmp_path / "page"
    result = runner.invoke(app, ["leaderboard", str(out), "--plan", str(path), "--out", str(page)])
    assert result.exit_code == 0, result.output
    readme = (page / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# tiny board") and "hardware: test machine" in readme
    assert "s9=" not in (page / "leaderboard.csv").read_text(encoding="utf-8")  # not a run of the plan
    assert load_rows(out)["run_id"].nunique() == 5  # the stray run is valid, just not the plan's
    reproduce = readme[readme.index("## Reproduce"):]
    assert "the plan command trains a run whose model is gone again" in reproduce
    assert f"lengthgen sweep --plan {path} --out {out}\n" in reproduce
    assert f"lengthgen leaderboard {out} --plan {path} --out {page}\n" in reproduce
    assert "--max-factor 4" in reproduce  # the step-by-step commands extend the chosen runs
    assert "Two-stage grids." in readme and "train.lr {0.001, 0.002} on seed 0, tested only to 2×" in readme
    html = (page / "leaderboard.html").read_text(encoding="utf-8")
    assert "train.lr {0.001, 0.002} on seed 0" in html and "{{" not in html  # the same text on the page
    fixed = "Fixed beyond the preset, for every run of a sweep: ff: train.steps = 4, train.val_every = 2"
    assert fixed in readme
    assert "; mr: train.steps = 2, train.batch_size = 8" in readme
    conflict = runner.invoke(app, ["leaderboard", str(out), "--plan", str(path), "--out", str(page),
                                   "--title", "x"])
    assert conflict.exit_code == 2 and "--title" in conflict.output


def test_the_board_names_the_reason_of_every_cell_where_not_every_seed_learned(
    tmp_path: Path, write_plan: Callable[..., Path], tiny_plan: Callable[[int], str]
) -> None:
    """A reason from the plan, linked to its ablation; a cell without one says so; a reason naming
    an ablation the board does not publish is refused before anything is written."""
    ablation = tmp_path / "ablations" / "why-ff"
    (ablation / "data").mkdir(parents=True)
    (ablation / "ABOUT.md").write_text("# Why flip-flop fails here\n\nBecause of `four steps`.\n",
                                       encoding="utf-8")
    text = tiny_plan(2).replace('hardware = "test machine"', 'hardware = "test machine"\n'
                                         'ablations = "ablations"')
    text += ('\n[[reason]]\ntask = "flip_flop"\nattn = ["softmax"]\nablation = "why-ff"\n'
             'text = "four steps are too few (`train.steps = 4`)"\n')
    path = write_plan(tmp_path, text=text)
    plan = load_plan(path)
    out = tmp_path / "board"
    ff, mr = blocks(plan)
    for config, val in zip(ff.screening, (0.5, 0.4), strict=True):  # neither point learned (25% at 1x)
        _fake_run(out, config, val_id=val, test_1x=0.25)
    _fake_run(ablation, ff.screening[0], val_id=0.5, test_1x=0.25)
    _fake_run(out, mr.screening[0], val_id=0.2, test_1x=0.5)
    page = tmp_path / "page"
    result = runner.invoke(app, ["leaderboard", str(out), "--plan", str(path), "--out", str(page)])
    assert result.exit_code == 0, result.output
    readme = (page / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### Cells where not every seed learned"):readme.index("## flip_flop")]
    assert ("- **flip_flop · softmax · nape**: 0/1 learned; four steps are too few (`train.steps = 4`) "
            "(ablation: *Why flip-flop fails here*, below)") in section
    assert "- **max_retrieval · entmax · nape**: 0/1 learned; no reason recorded in the plan yet." in section
    html = (page / "leaderboard.html").read_text(encoding="utf-8")
    assert ('four steps are too few (<code>train.steps = 4</code>) (ablation: '
            '<a href="#ablation-why-ff">Why flip-flop fails here</a>)') in html
    assert 'id="ablation-why-ff"' in html  # the link's target
    wrong = path.read_text(encoding="utf-8").replace('ablation = "why-ff"', 'ablation = "why-not"')
    path.write_text(wrong, encoding="utf-8")
    refused = runner.invoke(app, ["leaderboard", str(out), "--plan", str(path),
                                  "--out", str(tmp_path / "p2")])
    assert refused.exit_code == 2 and len(refused.output.strip().splitlines()) == 1
    assert "names ablation 'why-not', not one of the board's: why-ff" in refused.output
    assert not (tmp_path / "p2").exists()


def test_a_grid_screened_in_part_shows_its_best_point_so_far_as_provisional(
    tmp_path: Path, write_plan: Callable[..., Path]
) -> None:
    """One of two screening runs recorded: the row is not the "only setting" it would be without
    the plan, but provisional, until the other point is recorded and the rule can choose."""
    path = write_plan(tmp_path, screen=2)
    out = tmp_path / "board"
    ff, mr = blocks(load_plan(path))
    low, high = sorted(ff.screening, key=lambda c: c.train.lr)
    _fake_run(out, low, val_id=0.5, test_1x=0.5)
    _fake_run(out, mr.screening[0], val_id=0.5, test_1x=0.5)
    assert screening_progress(survey(load_plan(path), out)) == {("flip_flop", "softmax", "nape"): (1, 2)}

    def selections(page: Path) -> dict[str, str]:
        result = runner.invoke(app, ["leaderboard", str(out), "--plan", str(path), "--out", str(page)])
        assert result.exit_code == 0, result.output
        table = pd.read_csv(page / "leaderboard.csv")
        chosen = table[(table["source"] == "measured") & table["chosen"]]
        return {str(t): str(s) for t, s in chosen.groupby("task")["selection"].first().items()}

    partial = selections(tmp_path / "page")
    assert partial == {"flip_flop": "provisional: 1 of 2 screening runs of the plan's grid recorded; "
                                    "the rule chooses once every one is",
                       "max_retrieval": "only setting"}  # a one-setting sweep has nothing to wait for
    html = (tmp_path / "page" / "leaderboard.html").read_text(encoding="utf-8")
    assert "still to be screened" in html and "no other setting was run" in html
    _fake_run(out, high, val_id=0.9, test_1x=0.5)
    assert screening_progress(survey(load_plan(path), out)) == {}
    assert selections(tmp_path / "page2")["flip_flop"] == "best mean 1× validation of 2 settings on seed 0"


#: The backends of lengthgen-baselines, planned on the board and not yet run.
BASELINES = {"fox", "stickbreaking"}
needs_baselines = pytest.mark.skipif(
    importlib.util.find_spec("lengthgen_baselines") is None,
    reason="the published plan names lengthgen-baselines' backends: pip install -e baselines")


@needs_baselines
def test_the_published_plan_builds_and_the_board_holds_only_its_runs() -> None:
    """leaderboard/plan.toml is valid, and every committed board run is one of its runs: the board
    compares the plan's settings (grids chosen per backend on validation), not hand-tuned runs."""
    plan = load_plan(REPO / "leaderboard" / "plan.toml")
    possible: set[str] = set()
    for block in blocks(plan):
        possible.update(run_key(c) for c in block.screening)
        for point in block.sweep.points() or [{}]:
            possible.update(run_key(c) for c in configs_at(block, point, block.sweep.seeds))
    committed = {p.stem for p in (REPO / "leaderboard" / "data").glob("*.parquet")}
    assert committed, "leaderboard/data holds no runs: nothing would be checked"
    assert committed <= possible, sorted(committed - possible)[:3]
    assert {b.task for b in blocks(plan)} == {"mqmtar", "copy", "sort", "max_retrieval", "flip_flop"}
    assert all(len(b.sweep.seeds) == 3 for b in blocks(plan))


VARIANTS = """
title = "variants"

[[sweep]]
name = "mq"
task = ["mqmtar"]
attn = ["softmax"]
seeds = [0]
variants = [{ param = { near_misses = 1 }, min_factor = 2, max_factor = 2 }]
[sweep.set]
"train.steps" = 2
"train.batch_size" = 4
"train.val_samples" = 4
"arch.d_model" = 32
"arch.d_ff" = 64
"eval.samples" = 4
"eval.min_samples" = 4
"eval.max_factor" = 2
"""


def test_a_sweep_evaluates_every_recorded_run_on_its_task_variants(
    tmp_path: Path, write_plan: Callable[..., Path]
) -> None:
    """``variants`` evaluates each recorded run on a task variant at its factors (as ``lengthgen
    eval --param``), rows named by the variant; the dry run lists it while missing; run again,
    nothing happens."""
    plan = load_plan(write_plan(tmp_path, text=VARIANTS))
    out = tmp_path / "board"
    listed = "\n".join(dry_run_lines(survey(plan, out), Timings.from_folders(out)))
    assert "run mqmtar-softmax" in listed and "near_misses" not in listed  # the run comes first
    report = run_plan(plan, out, progress=False)
    assert not report.failed and report.remaining == 0
    assert [d.work.kind for d in report.done] == ["seed", "variant"]
    (config,) = blocks(plan)[0].screening
    rows = pd.read_parquet(data_path(out, run_key(config)))
    variant = rows[rows["eval_variant"] == "near_misses=1"]
    assert list(variant["factor"]) == [2] and (variant["status"] == "ok").all()
    assert sorted(rows.loc[rows["eval_variant"] == "", "factor"]) == [1, 2]
    assert run_plan(plan, out, progress=False).done == []
    # a variant row removed is missing work again, listed as such
    rows[rows["eval_variant"] == ""].to_parquet(data_path(out, run_key(config)))
    listed = dry_run_lines(survey(plan, out), Timings.from_folders(out))
    assert any("evaluate on near_misses=1 at 2x" in line for line in listed), listed


@pytest.mark.parametrize(("variant", "message"), [
    ("{ param = {}, min_factor = 2 }", "param"),
    ("{ param = { near_misses = 1 }, min_factor = 3 }", "power of two"),
    ("{ param = { near_misses = 1 }, min_factor = 4, max_factor = 2 }", "under min_factor"),
])
def test_a_bad_variant_is_one_line(
    tmp_path: Path, variant: str, message: str, write_plan: Callable[..., Path]
) -> None:
    text = VARIANTS.replace("variants = [{ param = { near_misses = 1 }, min_factor = 2, max_factor = 2 }]",
                            f"variants = [{variant}]")
    with pytest.raises(UserError, match=message):
        load_plan(write_plan(tmp_path, text=text))


@needs_baselines
def test_the_baselines_are_planned_on_every_grid_of_the_board() -> None:
    """Every sweep of the published plan has a twin running FoX and stick-breaking at pos nope (the
    papers' setting) with the same task, preset, seeds, task parameters, settings, grid and
    screening."""
    plan = load_plan(REPO / "leaderboard" / "plan.toml")
    others = [s for s in plan.sweep if not BASELINES & set(s.attn)]
    twins = [s for s in plan.sweep if BASELINES & set(s.attn)]
    assert others and len(twins) == len(others)
    for sweep in others:
        twin = next(t for t in twins if t.task == sweep.task)
        assert set(twin.attn) == BASELINES and twin.pos == ("nope",), twin.name
        same = ("preset", "seeds", "set", "grid", "param", "attn_option", "screen")
        assert {f: getattr(twin, f) for f in same} == {f: getattr(sweep, f) for f in same}, twin.name


@needs_baselines
def test_the_committed_board_misses_nothing_but_the_baselines_runs() -> None:
    """The published board is complete for the paper's five backends; what ``--dry-run`` lists is the
    baselines' runs, until the campaign records them: a baseline block is either still missing runs
    (of its own backend only) or recorded on all three seeds of the plan."""
    from lengthgen.leaderboard import load_rows

    states = survey(load_plan(REPO / "leaderboard" / "plan.toml"), REPO / "leaderboard")
    complete = [st for st in states if st.block.attn not in BASELINES]
    planned = [st for st in states if st.block.attn in BASELINES]
    assert complete and all(not st.work and not st.waiting for st in complete), \
        [st.block.label for st in complete if st.work or st.waiting]
    assert {st.block.attn for st in planned} == BASELINES
    assert {st.block.task for st in planned} == {st.block.task for st in complete}
    assert all(w.config.attn == st.block.attn for st in planned for w in st.work)
    rows = load_rows(REPO / "leaderboard")
    for st in planned:
        if not st.work and not st.waiting:
            mine = rows[(rows["task"] == st.block.task) & (rows["attn"] == st.block.attn)]
            assert set(mine["pos"]) == {"nope"} and set(mine["seed"]) == {0, 1, 2}, st.block.label
    assert any(not st.work and not st.waiting for st in planned)  # max_retrieval's, recorded


def test_a_plan_s_timings_folders_inform_its_estimates(tmp_path: Path) -> None:
    """A study that repeats a board's recipe with more steps is estimated from the board's recorded
    runs when its plan names the board's folder in ``timings``; without it, from the cost model."""
    def plan_file(extra: str) -> Path:
        path = tmp_path / f"study{len(extra)}.toml"
        path.write_text(f'{extra}\n[[sweep]]\nname = "longer"\ntask = ["max_retrieval"]\n'
                        'attn = ["softmax"]\nset = { "train.steps" = 40 }\n')
        return path

    with_board, without = plan_file('timings = ["board"]'), plan_file("")
    study = blocks(load_plan(with_board))[0].screening[0]
    board_run = study.model_copy(update={"seed": 7, "train": study.train.model_copy(update={"steps": 20})})
    _fake_run(tmp_path / "board", board_run, val_id=1.0, test_1x=1.0)  # 60 s for 20 steps
    said: list[str] = []
    sweep_plan(str(with_board), str(tmp_path / "out"), dry_run=True, say=said.append)
    run_line = next(line for line in said if line.strip().startswith("run "))
    assert "cost model" not in run_line, said
    assert Timings.from_folders(tmp_path / "board").train_seconds(study) == pytest.approx(120.0)  # 3 s a step
    said.clear()
    sweep_plan(str(without), str(tmp_path / "out"), dry_run=True, say=said.append)
    assert "cost model" in next(line for line in said if line.strip().startswith("run "))
    with pytest.raises(UserError, match="not a folder inside the plan's folder"):
        load_plan(plan_file('timings = ["../elsewhere"]'))
