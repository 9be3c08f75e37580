"""Run folders are untrusted input (evaluating them): a config never imports the code it names,
a folder must be what its name says, broken runs of a sweep are skipped, and no writer loses
another's rows."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.errors import UserNotice
from lengthgen.harness import run as harness_run
from lengthgen.harness.run import config_text, execute, save_training_rows
from lengthgen.harness.storage.identity import run_key
from lengthgen.harness.storage.results import read_parquet_file
from lengthgen.harness.storage.store import run_lock, save_rows
from lengthgen.kernels.engine import attend
from lengthgen.kernels.normalizers import Custom
from lengthgen.model import Transformer
from lengthgen.tasks import get_task
from tests.hostile import payload_plugin

runner = CliRunner()
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """The command in a fresh process (nothing imported before it)."""
    return subprocess.run([sys.executable, "-m", "lengthgen.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=300)


def evaluate(*args: str) -> object:
    return runner.invoke(app, ["eval", *args, "--quiet"])


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_config: Callable[..., RunConfig]) -> Path:
    """One tiny trained run (copy, softmax, evaluated at 1x and 2x); tests tamper with copies."""
    out = tmp_path_factory.mktemp("trained")
    frame = execute(tiny_config(), out, progress=False)
    return out / frame["run_id"].iloc[0]


@pytest.fixture
def run_dir(trained: Path, tmp_path: Path) -> Path:
    copy = tmp_path / trained.name
    shutil.copytree(trained, copy)
    return copy


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


# -- row 4: a config that names a payload file never executes it ---------------------------------
def test_a_config_naming_a_payload_file_never_executes_it(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    marker = tmp_path / "payload-ran"
    spec = payload_plugin(tmp_path, marker)
    frame = execute(tiny_config(attn=spec), tmp_path / "runs", progress=False)  # the author's machine
    run = tmp_path / "runs" / frame["run_id"].iloc[0]
    assert marker.is_file() and (frame["status"] == "ok").all()
    marker.unlink()
    # someone else evaluates the folder, or publishes its rows: in fresh processes
    done = cli("eval", str(run), "--max-factor", "4")
    assert done.returncode == 2 and not marker.exists(), done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: attention backend") and "--trust-plugins" in line
    board = cli("leaderboard", str(run), "--out", str(tmp_path / "board"))
    assert board.returncode == 0 and not marker.exists(), board.stderr
    verified = cli("verify", str(run), "--report", str(tmp_path / "verify.json"))  # it would import it
    assert verified.returncode == 1 and not marker.exists(), verified.stderr
    assert "--trust-plugins" in next(line for line in verified.stdout.splitlines() if line.startswith("✗"))
    # the user who trusts the folder says so
    trusted = cli("eval", str(run), "--max-factor", "4", "--trust-plugins", "--quiet")
    assert trusted.returncode == 0 and marker.is_file(), trusted.stderr
    assert sorted(pd.read_parquet(run / "results.parquet")["factor"]) == [1, 2, 4]


# -- third round, 5: every command that loads a run folder goes through the same gate ---------------
def test_every_command_that_takes_a_run_folder_never_imports_its_payload(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """Before: ``positions`` and ``heads`` imported the plugin a folder's config names (``eval``
    refused it)."""
    marker = tmp_path / "payload-ran"
    spec = payload_plugin(tmp_path, marker)
    sweep = tmp_path / "sweep"
    frame = execute(tiny_config(attn=spec), sweep / "runs", progress=False)
    run_id = frame["run_id"].iloc[0]
    (sweep / "data").mkdir()
    shutil.copyfile(sweep / "runs" / run_id / "results.parquet", sweep / "data" / f"{run_id}.parquet")
    run = sweep / "runs" / run_id
    marker.unlink()
    commands = {
        "eval": ["eval", str(run), "--max-factor", "4"],
        "positions": ["positions", str(run), "--samples", "2"],
        "heads": ["heads", str(run), "--samples", "2"],
        "verify": ["verify", str(sweep), "--report", str(tmp_path / "verify.json")],
    }
    for name, args in commands.items():
        done = cli(*args)
        assert not marker.exists(), (name, done.stderr)
        said = done.stdout + done.stderr
        assert done.returncode in (1, 2) and "--trust-plugins" in said, (name, done.stderr)
    shutil.rmtree(sweep / "runs")  # a clone: data, no models; eval --restore would train it again
    done = cli("eval", str(sweep), "--restore", "--quiet")
    assert done.returncode == 2 and not marker.exists() and "--trust-plugins" in done.stderr, done.stderr


def test_a_module_named_by_a_folder_is_not_imported_either(run_dir: Path) -> None:
    """``attn: "this:Foo"`` printed the Zen of Python from ``positions`` and ``heads``."""
    recorded = json.loads((run_dir / "config.json").read_text())
    config = RunConfig.model_validate({**recorded, "attn": "this:Foo"})
    text, run_id = config_text(config), run_key(config)  # the folder named as its run would name it
    folder = run_dir.parent / run_id
    run_dir.rename(folder)
    (folder / "config.json").write_text(text)
    (folder / "results.parquet").unlink()  # rows of the honest run: a folder of config and weights
    for command in ("positions", "heads"):
        done = cli(command, str(folder), "--samples", "2")
        assert done.returncode == 2 and "Beautiful is better than ugly" not in done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert "'this:Foo' is named by a recorded config" in line and "--trust-plugins" in line


def test_a_lock_file_that_is_a_link_is_not_followed(run_dir: Path, tmp_path: Path) -> None:
    """Before: ``.lock`` linked to a path outside the folder made eval create that file."""
    target = tmp_path / "elsewhere" / "created-by-the-lock"
    target.parent.mkdir()
    (run_dir / ".lock").unlink(missing_ok=True)  # the run's own lock, left by its training
    (run_dir / ".lock").symlink_to(target)
    result = evaluate(str(run_dir), "--max-factor", "4")
    assert result.exit_code == 2 and not target.exists()
    assert "error: " in result.stderr and ".lock" in result.stderr


def test_a_config_behind_a_link_is_refused(
    run_dir: Path, tmp_path: Path, one_line_error: Callable[..., None]
) -> None:
    elsewhere = tmp_path / "config-elsewhere.json"
    (run_dir / "config.json").rename(elsewhere)
    (run_dir / "config.json").symlink_to(elsewhere)
    for args in (["eval", str(run_dir)], ["positions", str(run_dir), "--samples", "2"]):
        one_line_error(runner.invoke(app, args), "config.json is a symbolic link")


def test_positions_takes_a_power_of_two(run_dir: Path, one_line_error: Callable[..., None]) -> None:
    result = runner.invoke(app, ["positions", str(run_dir), "--factor", "3", "--samples", "2"])
    one_line_error(result, "factor must be a power of two (1, 2, 4, …), got 3")


@pytest.mark.parametrize("text", ["[" * 100_000, '{"a": ' * 50 + "1" + "}" * 50])
def test_a_deeply_nested_config_is_one_line_and_a_sweep_skips_it(
    run_dir: Path, text: str, one_line_error: Callable[..., None]
) -> None:
    (run_dir / "config.json").write_text(text)
    one_line_error(evaluate(str(run_dir)), "nests lists or tables deeper than 32 levels")
    for command in ("positions", "heads"):
        one_line_error(runner.invoke(app, [command, str(run_dir), "--samples", "2"]), "deeper than 32")
    sweep = run_dir.parent / "sweep"
    (sweep / "runs").mkdir(parents=True)
    run_dir.rename(sweep / "runs" / run_dir.name)
    with pytest.warns(UserNotice, match="deeper than 32 levels"):
        result = evaluate(str(sweep))
    assert result.exit_code == 2 and "no trained runs" in result.output  # skipped, not a traceback


# -- row 6: a row says what was evaluated ----------------------------------------------------------
EDITS = {
    "task": lambda c: {**c, "task": "sort"},
    "pos": lambda c: {**c, "pos": "rope"},
    "heads": lambda c: {**c, "arch": {**c["arch"], "n_heads": 2 * c["arch"]["n_heads"]}},
    "attn": lambda c: {**c, "attn": "entmax", "attn_options": {"alpha": 1.5}},
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edited_config_is_refused(run_dir: Path, edit: str, one_line_error: Callable[..., None]) -> None:
    path = run_dir / "config.json"
    path.write_text(json.dumps(EDITS[edit](json.loads(path.read_text())), indent=2))
    before = (run_dir / "results.parquet").read_bytes()
    one_line_error(evaluate(str(run_dir), "--max-factor", "4"), "was edited, or the folder renamed")
    assert (run_dir / "results.parquet").read_bytes() == before


def test_results_of_another_run_are_refused(run_dir: Path, one_line_error: Callable[..., None]) -> None:
    rows = pd.read_parquet(run_dir / "results.parquet").assign(run_id="zzz")
    rows.to_parquet(run_dir / "results.parquet")
    one_line_error(evaluate(str(run_dir), "--max-factor", "4"), "holds rows of run 'zzz'")
    assert set(pd.read_parquet(run_dir / "results.parquet")["run_id"]) == {"zzz"}  # untouched


# -- row 7: weights must fit the config ------------------------------------------------------------
def test_weights_of_other_shapes_are_refused(
    run_dir: Path, tiny_config: Callable[..., RunConfig], one_line_error: Callable[..., None]
) -> None:
    saved = torch.load(run_dir / "model.pt", weights_only=True)
    vocab = get_task("copy").vocab.size
    wider = Transformer(tiny_config(**{"arch.d_model": 64}).model(vocab), seed=0).state_dict()
    assert set(wider) == set(saved["state_dict"])  # the same names: only the shapes differ
    torch.save({**saved, "state_dict": wider}, run_dir / "model.pt")
    one_line_error(evaluate(str(run_dir), "--max-factor", "4"), "has shape")
    torch.save({**saved, "state_dict": {k: 1 for k in saved["state_dict"]}}, run_dir / "model.pt")
    one_line_error(evaluate(str(run_dir), "--max-factor", "4"), "is a int, not a tensor")
    other = tiny_config(**{"train.lr": 5e-4}).model_dump(mode="json")
    torch.save({**saved, "config": other}, run_dir / "model.pt")
    one_line_error(evaluate(str(run_dir), "--max-factor", "4"), "was saved for another config")


# -- row 8: one broken run of a sweep does not stop the others -------------------------------------
def test_a_broken_run_of_a_sweep_is_skipped(
    tmp_path: Path, one_line_error: Callable[..., None], tiny_flags: Callable[..., list[str]]
) -> None:
    sweep = tmp_path / "sweep"
    flags = tiny_flags({"train.steps": 4, "eval.max_factor": 2, "train.train_length": 6, "eval.samples": 4})
    made = runner.invoke(app, ["sweep", "--task", "copy", "--attn", "softmax", "--seeds", "0,1,2", *flags,
                               "--out", str(sweep)])
    assert made.exit_code == 0, made.output
    runs = sorted((sweep / "runs").iterdir())
    broken = runs[0] / "model.pt"
    broken.write_bytes(broken.read_bytes()[:100])  # truncated
    with pytest.warns(UserNotice) as caught:
        result = evaluate(str(sweep), "--max-factor", "4")
    assert result.exit_code == 0, result.output
    (warning,) = [str(w.message) for w in caught]
    assert warning.startswith(f"skipped {runs[0]}: cannot load {broken}")
    for run in runs[1:]:  # the runs after the broken one are evaluated
        assert sorted(pd.read_parquet(run / "results.parquet")["factor"]) == [1, 2, 4]
        assert sorted(pd.read_parquet(sweep / "data" / f"{run.name}.parquet")["factor"]) == [1, 2, 4]
    assert sorted(pd.read_parquet(runs[0] / "results.parquet")["factor"]) == [1, 2]
    one_line_error(evaluate(str(sweep), "--max-factor", "6"), "power of two")  # a bad setting: one line
    for run in runs:  # nothing usable left: exit 2
        (run / "model.pt").unlink()
    with pytest.warns(UserNotice):
        one_line_error(evaluate(str(sweep), "--max-factor", "8"), "no trained runs under")


# -- row 9: writers of one run's rows merge under its lock ----------------------------------------
def test_a_run_saving_its_rows_keeps_the_rows_eval_added(run_dir: Path) -> None:
    assert evaluate(str(run_dir), "--attn", "ssmax").exit_code == 2  # weights do not fit: nothing added
    result = evaluate(str(run_dir), "--attn-option", "alpha=1.5", "--attn", "entmax")
    assert result.exit_code == 0, result.output
    variant = pd.read_parquet(run_dir / "results.parquet")
    assert set(variant["eval_variant"]) == {"", "attn=entmax,attn.alpha=1.5"}
    training = variant[variant["eval_variant"] == ""].to_dict("records")
    saved = save_training_rows(run_dir, training)  # the run (or its sweep) writing its rows again
    assert len(saved) == len(variant) and set(saved["eval_variant"]) == set(variant["eval_variant"])


def test_eval_waits_for_the_run_lock_and_merges(run_dir: Path) -> None:
    """While a writer holds the run's lock, eval waits; then its rows join the writer's."""
    command = [sys.executable, "-m", "lengthgen.cli", "eval", str(run_dir), "--attn", "entmax", "--quiet"]
    with run_lock(run_dir):
        process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
        time.sleep(12)  # eval plans, evaluates its first length, then waits for the lock
        assert process.poll() is None, process.communicate()
        rows = pd.read_parquet(run_dir / "results.parquet")
        assert set(rows["eval_variant"]) == {""}  # nothing written while the lock is held
        extra = rows.assign(eval_length=rows["eval_length"] * 4, factor=rows["factor"] * 4)
        save_rows(run_dir / "results.parquet", extra)  # the holder adds rows of its own
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, err
    final = pd.read_parquet(run_dir / "results.parquet")
    assert sorted(final.loc[final["eval_variant"] == "", "factor"]) == [1, 2, 4, 8]
    assert sorted(final.loc[final["eval_variant"] != "", "factor"]) == [1, 2]


# -- row 10: Ctrl-C keeps the lengths done --------------------------------------------------------
def interrupt_on_call(n: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C at the n-th length evaluated (the one loop over lengths of ``run`` and ``eval``)."""
    real, calls = harness_run.evaluate_length, {"n": 0}

    def evaluate_length(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(harness_run, "evaluate_length", evaluate_length)


def test_ctrl_c_during_eval_keeps_the_lengths_done(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    interrupt_on_call(2, monkeypatch)
    result = evaluate(str(run_dir), "--max-factor", "8")
    assert result.exit_code == 130 and "interrupted: the rows of the lengths evaluated so far are saved" \
        in result.stderr
    assert sorted(pd.read_parquet(run_dir / "results.parquet")["factor"]) == [1, 2, 4]


def test_sigterm_during_eval_keeps_the_lengths_done(run_dir: Path) -> None:
    command = [sys.executable, "-m", "lengthgen.cli", "eval", str(run_dir), "--max-factor", "256",
               "--eval-samples", "64", "--quiet"]
    process = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and process.poll() is None:
        if 4 in set(read_parquet_file(run_dir / "results.parquet")["factor"]):  # read as it is replaced
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    factors = sorted(pd.read_parquet(run_dir / "results.parquet")["factor"])
    assert process.returncode == 143 and "interrupted: the rows of the lengths evaluated so far" in err, err
    assert factors[:3] == [1, 2, 4] and factors != [1, 2, 4, 8, 16, 32, 64, 128, 256]


def test_ctrl_c_during_a_run_keeps_the_lengths_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_config: Callable[..., RunConfig]
) -> None:
    interrupt_on_call(3, monkeypatch)
    with pytest.raises(KeyboardInterrupt):
        execute(tiny_config(**{"eval.max_factor": 4}), tmp_path, progress=False)
    (run,) = tmp_path.iterdir()
    assert sorted(pd.read_parquet(run / "results.parquet")["factor"]) == [1, 2]


# -- row 13: a tracker that cannot start ----------------------------------------------------------
@pytest.fixture
def failing_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb", reason="wandb not installed (extra: track)")
    from lengthgen.harness import tracking

    def no_login(self: object, run_dir: Path, run_id: str, config: object) -> None:
        (run_dir / "wandb").mkdir(parents=True)
        (run_dir / "wandb" / "debug.log").write_text("started")
        raise RuntimeError("api_key not configured (no-tty)")

    monkeypatch.setattr(tracking.WandbTracker, "__init__", no_login)


@pytest.mark.usefixtures("failing_wandb")
def test_a_tracker_that_cannot_start_leaves_no_run_folder(tmp_path: Path) -> None:
    flags = ["--task", "copy", "--attn", "softmax", "--steps", "2", "--max-factor", "1", "--log", "wandb",
             "--quiet"]
    for command in ("run", "sweep"):
        result = runner.invoke(app, [command, *flags, "--out", str(tmp_path / command)])
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert result.stderr.strip().splitlines()[-1].startswith("error: --log wandb could not start")
        # no run folder, and in a sweep no run recorded as failed (it would be skipped next time)
        assert not (tmp_path / command).exists(), list((tmp_path / command).rglob("*"))


# -- row 16: a plugin's sys.exit fails its run; the seam refuses bad weights ----------------------
def test_a_plugin_that_exits_fails_its_run(tmp_path: Path) -> None:
    plugin = tmp_path / "exiting.py"
    plugin.write_text(textwrap.dedent("""
        import sys
        import torch
        from lengthgen.attention.backend import AttentionBackend

        class Exiting(AttentionBackend):
            name = "exiting"
            description = "exits when evaluated"

            def normalize(self, scores):
                if not torch.is_grad_enabled():
                    sys.exit(5)
                return torch.softmax(scores, dim=-1)
        """))
    result = runner.invoke(app, ["run", "--task", "copy", "--attn", f"{plugin}:Exiting", "--steps", "2",
                                 "--max-factor", "1", "--eval-samples", "4", "--quiet", "--out",
                                 str(tmp_path / "runs")])
    assert result.exit_code == 1 and "run failed: SystemExit: 5" in result.stderr, result.output
    (run,) = (tmp_path / "runs").iterdir()
    rows = pd.read_parquet(run / "results.parquet")
    assert list(rows["status"]) == ["failed"] and (run / "error.txt").is_file()


@pytest.mark.parametrize(("weights", "message"), [
    (lambda s: (s > 0).long(), "torch.int64 weights"),
    (lambda s: torch.softmax(s, -1) - 0.5, "negative weights"),
    (lambda s: torch.softmax(s, -1)[..., :1], "of the scores' shape"),
])
def test_the_seam_refuses_weights_that_are_not_probabilities(weights: object, message: str) -> None:
    q = k = v = torch.randn(1, 2, 8, 4)
    normalizer = Custom(weights)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=message):
        attend(q, k, v, normalizer)
    assert attend(q, k, v, Custom(lambda s: torch.softmax(s, -1)))[0].shape == (1, 2, 8, 4)


def test_non_utf8_config_is_one_line(
    run_dir: Path, tiny_config: Callable[..., RunConfig], one_line_error: Callable[..., None]
) -> None:
    (run_dir / "config.json").write_bytes(config_text(tiny_config()).encode("latin-1") + b"\xff")
    one_line_error(evaluate(str(run_dir)), "config.json is not UTF-8 text (byte 0xff")


def test_rows_eval_writes_pass_the_reader(run_dir: Path) -> None:
    """The rows lengthgen writes always pass its own checks (no warning when read back)."""
    import warnings

    from lengthgen.harness.storage.results import read_results_file

    assert evaluate(str(run_dir), "--max-factor", "4").exit_code == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rows = read_results_file(run_dir / "results.parquet")
    assert rows is not None and sorted(rows["factor"]) == [1, 2, 4]
