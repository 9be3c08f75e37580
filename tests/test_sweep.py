"""``lengthgen sweep``: crash-safe resume, failures recorded (and retried on request), name
validation, and the Ray launcher on a local instance. Grids are tiny: a few training steps,
evaluation at 1x and 2x on a handful of samples."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.errors import UserError
from lengthgen.leaderboard import load_rows
from lengthgen.sweeps import (
    SweepSpec,
    data_path,
    parse_choices,
    parse_seeds,
    plan,
    run_key,
    run_state,
    shard_of,
    validate_spec,
)

runner = CliRunner()

#: The tiny run of these sweeps: two steps, evaluated at 1× and 2× on 4 samples.
SWEEP_RUN = {"train.steps": 2, "eval.max_factor": 2, "eval.samples": 4}
#: The fixtures' functions: a sweep in this process, one started in a subprocess, a grid's run keys.
RunSweep = Callable[..., Any]
StartSweep = Callable[..., subprocess.Popen[bytes]]
SweepKeys = Callable[[str, str, str], set[str]]

NAN_PLUGIN = textwrap.dedent(
    """
    import torch

    from lengthgen.attention.backend import AttentionBackend


    class NaNAttention(AttentionBackend):
        name = "nan_attention"
        description = "test backend whose weights are NaN (training diverges)"

        def normalize(self, scores: torch.Tensor) -> torch.Tensor:
            return torch.full_like(scores, float("nan"))
    """
)


@pytest.fixture
def sweep_keys(tiny_settings: Callable[..., dict[str, Any]]) -> SweepKeys:
    """``sweep_keys(tasks, attns, seeds)``: the run keys of the tiny sweep over that grid."""
    model = tiny_settings({})

    def keys(tasks: str, attns: str, seeds: str) -> set[str]:
        spec = SweepSpec(tasks=tuple(tasks.split(",")), attns=tuple(attns.split(",")),
                         seeds=parse_seeds(seeds), steps=2, max_factor=2, eval_samples=4, overrides=model)
        return {run_key(c) for c in spec.configs()}

    return keys


@pytest.fixture
def run_sweep(tiny_flags: Callable[..., list[str]]) -> RunSweep:
    """``run_sweep(out, *args)``: the tiny sweep of ``args`` into ``out``, in this process."""

    def sweep(out: Path, *args: str) -> Any:
        return runner.invoke(app, ["sweep", *args, *tiny_flags(SWEEP_RUN), "--out", str(out)])

    return sweep


@pytest.fixture
def start_sweep(tiny_flags: Callable[..., list[str]]) -> StartSweep:
    """``start_sweep(out, grid, **popen)``: the tiny sweep in a subprocess, returned once its first
    run is recorded (it is still running)."""

    def start(out: Path, grid: list[str], **popen: Any) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "lengthgen.cli", "sweep", *grid, *tiny_flags(SWEEP_RUN), "--out",
               str(out)]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **popen)
        deadline = time.monotonic() + 120
        try:
            while not list((out / "data").glob("*.parquet")):
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
                assert time.monotonic() < deadline, "no data file within 120 s"
                time.sleep(0.02)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return proc

    return start


SWEEP_GRID = ["--task", "copy", "--attn", "softmax", "--seeds", "0-3"]


def test_resume_after_sigkill(
    tmp_path: Path, run_sweep: RunSweep, start_sweep: StartSweep, sweep_keys: SweepKeys
) -> None:
    out = tmp_path / "sweep"
    grid = SWEEP_GRID
    proc = start_sweep(out, grid, start_new_session=True)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    expected = sweep_keys("copy", "softmax", "0-3")
    first = {p.stem for p in (out / "data").glob("*.parquet")}
    assert first and first < expected  # killed mid-sweep: some runs recorded, not all
    # A kill in the middle of a write leaves a dot-prefixed temp file: readers must ignore it.
    (out / "data" / ".copy-softmax-nape-s9-deadbeef.parquet.x1.tmp").write_bytes(b"PAR1 half a file")

    result = run_sweep(out, *grid)
    assert result.exit_code == 0, result.output
    assert f"{len(expected) - len(first)} ok, 0 failed this time" in result.output
    files = sorted((out / "data").glob("*.parquet"))
    assert {p.stem for p in files} == expected
    rows = load_rows(out)
    assert sorted(rows["run_id"].unique()) == sorted(expected)
    assert rows.groupby("run_id")["factor"].apply(sorted).to_dict() == {k: [1, 2] for k in expected}
    assert not rows.duplicated(["run_id", "factor"]).any() and (rows["status"] == "ok").all()

    again = run_sweep(out, *grid)  # everything recorded: nothing runs
    assert again.exit_code == 0 and "0 ok, 0 failed this time; 4 already recorded" in again.output


@pytest.mark.parametrize(("stop", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_and_sigterm_stop_cleanly(
    tmp_path: Path,
    stop: signal.Signals,
    code: int,
    run_sweep: RunSweep,
    start_sweep: StartSweep,
    sweep_keys: SweepKeys,
) -> None:
    """Ctrl-C and SIGTERM (kill, scancel) stop the sweep with a summary; a rerun finishes the grid."""
    out = tmp_path / "sweep"
    grid = SWEEP_GRID

    def default_sigint() -> None:  # a shell's background job would inherit SIGINT ignored
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = start_sweep(out, grid, preexec_fn=default_sigint)
    try:
        proc.send_signal(stop)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    message = stderr.decode()
    assert proc.returncode == code, message
    assert "interrupted:" in message and "run the same command again to resume" in message
    first = {p.stem for p in (out / "data").glob("*.parquet")}
    expected = sweep_keys("copy", "softmax", "0-3")
    assert first and first < expected
    assert all(run_state(data_path(out, key)) == "ok" for key in first)

    result = run_sweep(out, *grid)
    assert result.exit_code == 0, result.output
    assert {p.stem for p in (out / "data").glob("*.parquet")} == expected


def test_failures_recorded_skipped_and_retried(
    tmp_path: Path, run_sweep: RunSweep, sweep_keys: SweepKeys
) -> None:
    plugin = tmp_path / "nanattn.py"
    plugin.write_text(NAN_PLUGIN)
    spec = f"{plugin}:NaNAttention"
    out = tmp_path / "sweep"
    grid = ["--task", "copy", "--attn", f"{spec},softmax", "--seeds", "0"]
    result = run_sweep(out, *grid)
    assert result.exit_code == 0, result.output
    assert "1 ok, 1 failed this time" in result.output
    bad_key, good_key = sorted(sweep_keys("copy", f"{spec},softmax", "0"), key=lambda k: "softmax" in k)
    assert run_state(data_path(out, bad_key)) == "failed"
    assert run_state(data_path(out, good_key)) == "ok"
    bad = pd.read_parquet(data_path(out, bad_key))
    assert list(bad["status"]) == ["failed"] and "TrainingDiverged" in bad["error"].iloc[0]
    assert (out / "runs" / bad_key / "error.txt").is_file()

    before = data_path(out, bad_key).stat().st_mtime_ns
    skipped = run_sweep(out, *grid)
    assert "0 ok, 0 failed this time; 2 already recorded (1 failed" in skipped.output
    assert data_path(out, bad_key).stat().st_mtime_ns == before

    retried = run_sweep(out, *grid, "--retry-failed")
    assert retried.exit_code == 0 and "0 ok, 1 failed this time; 1 already recorded" in retried.output
    assert data_path(out, bad_key).stat().st_mtime_ns != before
    assert len(list((out / "data").glob("*.parquet"))) == 2

    # The leaderboard's README gives the command that rebuilds this grid: it finds every run recorded.
    board = runner.invoke(app, ["leaderboard", str(out), "--out", str(tmp_path / "board")])
    assert board.exit_code == 0, board.output
    readme = (tmp_path / "board" / "README.md").read_text()
    lines = readme.splitlines()
    assert any(line.startswith("| softmax | nape |") for line in lines)
    assert any(spec in line and line.endswith(" | — 0/1 learned |") for line in lines)  # the failed run
    assert any(spec in line and line.endswith(" | 1 | 1 |") for line in lines)  # its settings: 1 seed, failed
    command = next(line for line in readme.splitlines() if line.startswith("lengthgen sweep "))
    rebuilt = runner.invoke(app, shlex.split(command)[1:] + ["--quiet"])
    assert "0 ok, 0 failed this time; 2 already recorded (1 failed" in rebuilt.output, rebuilt.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--task", "copy,nosuchtask", "--attn", "softmax"], "valid tasks: copy"),
        (["--task", "copy", "--attn", "softmax,nosuchattn"], "valid attention backends:"),
        (["--task", "copy", "--attn", "softmax", "--pos", "nape,xyz"], "valid position schemes: nape"),
        (["--task", "copy", "--attn", "softmax", "--preset", "huge"], "valid presets: quick, paper"),
        (["--task", "copy", "--attn", "softmax", "--seeds", "0,a"], "bad seed 'a'"),
        (["--task", "copy", "--attn", "softmax", "--max-factor", "3"], "power of two"),
        (["--task", "copy", "--attn", "softmax", "--launcher", "local", "--ray-address", "x:1"], "needs"),
        (["--task", "copy", "--attn", "softmax", "--set", "train.lr=1e-3,"], "an empty item"),
        (["--task", "copy", "--attn", "softmax", "--set", "train.lr=1e-3,0.001"], "lists a value twice"),
        (["--task", "copy", "--attn", "softmax", "--set", "train.lr=1e-3,fast"], "train.lr"),
        (["--task", "copy", "--attn", "softmax", "--steps", "5", "--set", "train.steps=5,10"], "set twice"),
        (["--task", "copy", "--attn", "entmax,softmax", "--attn-option", "alpha=1.25"],
         "unknown attention option 'alpha' of 'softmax'"),
        (["--task", "copy", "--attn", "entmax", "--attn-option", "alpha=3"], "alpha"),
    ],
)
def test_bad_input_exits_2_before_running(tmp_path: Path, args: list[str], expected: str) -> None:
    result = runner.invoke(app, ["sweep", *args, "--out", str(tmp_path / "s")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("raw", "values"), [
    ("5e-4,1e-3,2e-3", (5e-4, 1e-3, 2e-3)),
    ("id,8x", ("id", "8x")),
    ("[0.9,0.99],[0.9,0.999]", ([0.9, 0.99], [0.9, 0.999])),  # commas inside a list do not split
    ("[0.9,0.99]", ([0.9, 0.99],)),  # one value, as `lengthgen run --set` reads it
    ("true", (True,)),
    ("NaN", ("NaN",)),  # text, which the config refuses
])
def test_set_values_of_a_grid(raw: str, values: tuple[object, ...]) -> None:
    assert parse_choices(raw) == values


def test_grid_points_keep_the_ids_of_runs_made_without_a_grid() -> None:
    """A grid over the learning rate holds the preset's run unchanged, and crosses every axis."""
    base = SweepSpec(tasks=("copy", "sort"), attns=("softmax", "asentmax"), seeds=(0, 1), steps=2)
    plain = {run_key(c) for c in base.configs()}
    preset_lr = base.configs()[0].train.lr  # 2e-3 for both tasks' quick presets
    grid = SweepSpec(tasks=base.tasks, attns=base.attns, seeds=base.seeds, steps=2,
                     grid={"train.lr": (5e-4, preset_lr), "arch.n_layers": (3, 2)})
    configs = validate_spec(grid)
    assert len(configs) == 2 * 2 * 2 * 2 * 2 == grid.size()
    assert plain <= {run_key(c) for c in configs}  # the preset's rate and depth: the same runs as before
    assert len({run_key(c) for c in configs}) == len(configs)
    first = configs[:8]  # copy / softmax / nape: the settings in order (first field slowest), seeds fastest
    assert [(c.train.lr, c.arch.n_layers, c.seed) for c in first] == [
        (5e-4, 3, 0), (5e-4, 3, 1), (5e-4, 2, 0), (5e-4, 2, 1),
        (preset_lr, 3, 0), (preset_lr, 3, 1), (preset_lr, 2, 0), (preset_lr, 2, 1)]


def test_learning_rate_grid_end_to_end(tmp_path: Path, run_sweep: RunSweep) -> None:
    """A two-value learning-rate grid: the leaderboard names the chosen setting and the runner-up,
    regenerates byte for byte, and its reproduce command rebuilds the grid (everything recorded)."""
    out = tmp_path / "sweep"
    grid = ["--task", "copy", "--attn", "softmax", "--seeds", "0,1", "--set", "train.lr=1e-3,4e-3"]
    result = run_sweep(out, *grid)
    assert result.exit_code == 0, result.output
    assert "4 runs (1 tasks x 1 backends x 1 position schemes x 2 settings x 2 seeds)" in result.output
    rows = load_rows(out)
    assert sorted({json.loads(c)["train"]["lr"] for c in rows["config_json"]}) == [1e-3, 4e-3]
    assert rows["val_exact_id"].notna().all() and rows["val_exact_8x"].notna().all()
    board = tmp_path / "board"
    args = ["leaderboard", str(out), "--out", str(board), "--commit", "abc1234"]
    assert runner.invoke(app, args).exit_code == 0
    first = {p.name: p.read_bytes() for p in board.rglob("*") if p.is_file()}
    assert runner.invoke(app, args).exit_code == 0
    assert first == {p.name: p.read_bytes() for p in board.rglob("*") if p.is_file()}
    readme = first["README.md"].decode()
    row = next(line for line in readme.splitlines() if line.startswith("| softmax | nape | train.lr="))
    cells = [c.strip() for c in row.strip("|").split("|")]
    scores = {}
    for lr in ("0.001", "0.004"):
        per_seed = rows[rows["config_json"].str.contains(f'"lr":{lr}')].drop_duplicates("run_id")
        scores[lr] = per_seed["val_exact_id"].mean()
    chosen, other = sorted(scores, key=lambda lr: (-scores[lr], lr))
    assert cells[2] == f"train.lr={chosen} · val {100 * scores[chosen]:.1f}"
    assert cells[3] == f"train.lr={other} · val {100 * scores[other]:.1f}"
    csv = pd.read_csv(board / "leaderboard.csv")
    assert set(csv.loc[csv["chosen"] & (csv["source"] == "measured"), "runner_up"]) == {f"train.lr={other}"}
    command = next(line for line in readme.splitlines() if line.startswith("lengthgen sweep "))
    assert "--set train.lr=0.001,0.004" in command
    rebuilt = runner.invoke(app, shlex.split(command)[1:] + ["--quiet"])
    assert "0 ok, 0 failed this time; 4 already recorded" in rebuilt.output, rebuilt.output


def test_seed_lists_shards_and_unreadable_data_files(tmp_path: Path) -> None:
    assert parse_seeds("0,2,5-7") == (0, 2, 5, 6, 7)
    spec = SweepSpec(tasks=("copy", "sort"), attns=("softmax",), seeds=(0, 1, 2), steps=2)
    configs = spec.configs()
    shards = [shard_of(configs, f"{i}/4") for i in range(4)]
    assert sorted(run_key(c) for s in shards for c in s) == sorted(run_key(c) for c in configs)
    with pytest.raises(UserError, match="bad --shard"):
        shard_of(configs, "4/4")
    garbage = data_path(tmp_path, run_key(configs[0]))
    garbage.parent.mkdir(parents=True)
    garbage.write_bytes(b"not parquet")  # e.g. copied in by hand: redone, not trusted
    todo = plan(configs, tmp_path)
    assert [run_key(c) for c in todo.todo] == [run_key(c) for c in configs] and not todo.done_ok


def test_ray_launcher_on_local_instance(
    tmp_path: Path, run_sweep: RunSweep, sweep_keys: SweepKeys
) -> None:
    pytest.importorskip("ray", reason="Ray is an optional extra: pip install 'lengthgen[ray]'")
    out = tmp_path / "sweep"
    grid = ["--task", "copy", "--attn", "softmax", "--seeds", "0,1"]
    result = run_sweep(out, *grid, "--launcher", "ray", "--jobs", "2")
    assert result.exit_code == 0, result.output
    assert "2 ok, 0 failed this time" in result.output
    expected = sweep_keys("copy", "softmax", "0,1")
    assert {p.stem for p in (out / "data").glob("*.parquet")} == expected
    assert all((out / "runs" / key / "model.pt").is_file() for key in expected)
    rows = load_rows(out)
    assert len(rows) == 4 and (rows["status"] == "ok").all()
    # The same dataset as the local launcher: a local rerun finds everything recorded.
    local = run_sweep(out, *grid)
    assert "0 ok, 0 failed this time; 2 already recorded" in local.output


def test_backend_options_of_a_sweep_and_their_reproduce_command() -> None:
    """``--attn-option`` sets the option in every config; the leaderboard's command says so again."""
    from lengthgen.leaderboard.reproduce import sweep_commands
    from tests.leaderboard_rows import make_rows

    spec = SweepSpec(tasks=("copy",), attns=("entmax", "asentmax"), seeds=(0, 1), steps=2,
                     attn_options={"alpha": 1.25})
    configs = validate_spec(spec)
    assert [c.attn_options["alpha"] for c in configs] == [1.25] * 4
    assert configs[2].attn_options["beta_init"] == 0.05  # the other options keep their defaults
    rows = make_rows({("entmax", 0): [1.0]})
    rows["config_json"] = configs[0].canonical_json()
    (command,) = sweep_commands(rows, "S")
    assert "--attn entmax" in command and "--attn-option alpha=1.25" in command and "--steps 2" in command
    plain = make_rows({("entmax", 0): [1.0]})
    assert "--attn-option" not in sweep_commands(plain, "S")[0]


def _runs_built_by(command: str) -> set[tuple[str, int]]:
    """(backend, seed) of every run a `lengthgen sweep` command line builds: its --attn × --seeds."""
    words = command.split()
    attns = words[words.index("--attn") + 1].split(",")
    seeds = [int(s) for s in words[words.index("--seeds") + 1].split(",")]
    return {(a, s) for a in attns for s in seeds}


@pytest.mark.parametrize("runs", [
    {("entmax", 1), ("entmax", 2), ("ssmax", 0)},  # backends with different seeds: no cross product
    {("asentmax", s) for s in range(3)} | {("softmax", s) for s in range(3)},  # a full grid
    {("entmax", 0), ("entmax", 1), ("softmax", 1), ("ssmax", 2)},
])
def test_reproduce_commands_build_exactly_the_recorded_runs(runs: set[tuple[str, int]]) -> None:
    from lengthgen.leaderboard.reproduce import sweep_commands
    from tests.leaderboard_rows import make_rows

    commands = sweep_commands(make_rows({run: [1.0] for run in runs}), "S")
    built = [_runs_built_by(command) for command in commands]
    assert set().union(*built) == runs and sum(map(len, built)) == len(runs)
    assert len(commands) == len({attn for attn, _ in runs}) or len(commands) == 1
