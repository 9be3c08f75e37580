"""``lengthgen eval``: a saved model evaluated at more lengths or on a task variant, rows merged
into its results without duplicates, a whole sweep folder extended, the leaderboard showing it."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.harness.run import execute
from lengthgen.harness.storage.results import rows_to_frame, write_parquet_atomic
from lengthgen.harness.storage.store import merge_rows

runner = CliRunner()
#: How long these runs train (long enough to learn a little) and on how many samples they score.
EVAL_RUN = {"train.steps": 30, "train.batch_size": 16, "train.val_samples": 16, "train.val_every": 15,
            "train.train_length": 6, "eval.samples": 16, "eval.min_samples": 8}
METRICS = ["eval_length", "n_samples", "exact_match", "exact_match_lo", "exact_match_hi", "token_accuracy",
           "attn_entropy", "attn_support"]


@pytest.fixture
def tiny(tiny_config: Callable[..., RunConfig]) -> Callable[..., RunConfig]:
    """``tiny(task, max_factor, **task_params)``: an ASEntmax run of ``EVAL_RUN``."""

    def config(task: str, max_factor: int, **params: object) -> RunConfig:
        return tiny_config(task, "asentmax", run=EVAL_RUN, task_params=params or None,
                           **{"eval.max_factor": max_factor})

    return config


def evaluate(*args: str) -> object:
    return runner.invoke(app, ["eval", *args, "--quiet"])


def test_a_later_length_is_the_row_a_longer_run_writes(
    tmp_path: Path, tiny: Callable[..., RunConfig]
) -> None:
    short = execute(tiny("max_retrieval", 2), tmp_path / "short", progress=False)
    longer = execute(tiny("max_retrieval", 8), tmp_path / "long", progress=False)
    run_dir = tmp_path / "short" / short["run_id"].iloc[0]
    result = evaluate(str(run_dir), "--max-factor", "8")
    assert result.exit_code == 0, result.output
    assert "2 of 4 lengths to evaluate" in result.stderr
    rows = pd.read_parquet(run_dir / "results.parquet")
    assert list(rows["factor"]) == [1, 2, 4, 8] and (rows["status"] == "ok").all()
    # the model and the protocol are the same: the extension equals the run that went to 8x
    pd.testing.assert_frame_equal(rows[METRICS].reset_index(drop=True),
                                  longer[METRICS].reset_index(drop=True), check_dtype=False)
    # the new rows keep the identity of the trained run, and say they are the training task
    assert set(rows["run_id"]) == {run_dir.name} and rows["config_json"].nunique() == 1
    assert set(rows["eval_variant"]) == {""}
    # again: nothing to do; --redo replaces rows, never adds any
    again = evaluate(str(run_dir), "--max-factor", "8")
    assert again.exit_code == 0 and "0 of 4 lengths" in again.stderr
    redo = evaluate(str(run_dir), "--max-factor", "4", "--redo", "--eval-samples", "8")
    assert redo.exit_code == 0, redo.output
    after = pd.read_parquet(run_dir / "results.parquet")
    assert list(after["factor"]) == [1, 2, 4, 8] and list(after["n_samples"]) == [8, 8, 8, 16]


def test_a_task_variant_gets_rows_of_its_own(tmp_path: Path, tiny: Callable[..., RunConfig]) -> None:
    frame = execute(tiny("flip_flop", 2), tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    result = evaluate(str(run_dir), "--param", "eval_variant=sparse")
    assert result.exit_code == 0, result.output
    rows = pd.read_parquet(run_dir / "results.parquet")
    assert list(zip(rows["eval_variant"], rows["factor"], strict=True)) == [
        ("", 1), ("", 2), ("eval_variant=sparse", 1), ("eval_variant=sparse", 2)]
    # naming the training configuration is no variant: nothing to evaluate
    same = evaluate(str(run_dir), "--param", "eval_variant=same")
    assert same.exit_code == 0 and "0 of 2 lengths" in same.stderr
    board = runner.invoke(app, ["leaderboard", str(run_dir), "--out", str(tmp_path / "board")])
    assert board.exit_code == 0, board.output
    readme = (tmp_path / "board" / "README.md").read_text()
    assert "| asentmax [eval_variant=sparse] | nape | " in readme
    csv = pd.read_csv(tmp_path / "board" / "leaderboard.csv")
    assert csv[csv["source"] == "measured"]["method"].nunique() == 2


def test_a_sweep_folder_is_extended_run_by_run(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    flags = ["--steps", "20", "--max-factor", "2", "--train-length", "16", "--eval-samples", "8",
             "--set", "train.batch_size=16", "--set", "train.val_samples=16", "--set", "arch.d_model=32",
             "--set", "arch.d_ff=64", "--quiet"]
    made = runner.invoke(app, ["sweep", "--task", "mqmtar", "--attn", "softmax,asentmax", *flags,
                               "--out", str(sweep)])
    assert made.exit_code == 0, made.output
    extended = evaluate(str(sweep), "--max-factor", "8")
    assert extended.exit_code == 0, extended.output
    assert extended.stderr.count("2 of 4 lengths to evaluate") == 2
    for data in sorted((sweep / "data").glob("*.parquet")):
        rows = pd.read_parquet(data)
        assert list(rows["factor"]) == [1, 2, 4, 8], data.name
        run_rows = pd.read_parquet(sweep / "runs" / data.stem / "results.parquet")
        pd.testing.assert_frame_equal(rows, run_rows)
    board = runner.invoke(app, ["leaderboard", str(sweep), "--out", str(tmp_path / "board")])
    assert board.exit_code == 0, board.output
    header = next(line for line in (tmp_path / "board" / "README.md").read_text().splitlines()
                  if line.startswith("| backend |") and "ID (1×)" in line)
    assert "| 4× | 8× |" in header
    # the sweep still considers every run done
    resumed = runner.invoke(app, ["sweep", "--task", "mqmtar", "--attn", "softmax,asentmax", *flags,
                                  "--out", str(sweep)])
    assert "0 ok, 0 failed this time; 2 already recorded" in resumed.output


def test_a_variant_that_needs_length_is_evaluated_from_min_factor(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """MQMTAR's planted near misses need pairs: 1 per query needs 8, which first fit at 4x here."""
    config = tiny_config("mqmtar", "softmax", run=EVAL_RUN, **{"train.train_length": 16,
                                                             "eval.max_factor": 8})
    run_dir = tmp_path / execute(config, tmp_path, progress=False)["run_id"].iloc[0]
    short = evaluate(str(run_dir), "--param", "near_misses=1")
    assert short.exit_code == 1 and "near_misses=1 needs 8 pairs" in short.stderr, short.output
    result = evaluate(str(run_dir), "--param", "near_misses=1", "--min-factor", "4")
    assert result.exit_code == 0, result.output
    assert "2 of 2 lengths to evaluate (4x to 8x)" in result.stderr
    rows = pd.read_parquet(run_dir / "results.parquet")
    assert list(zip(rows["eval_variant"], rows["factor"], strict=True)) == [
        ("", 1), ("", 2), ("", 4), ("", 8), ("near_misses=1", 4), ("near_misses=1", 8)]


def one_run_sweep(sweep: Path) -> Path:
    """A sweep of one tiny max_retrieval run tested to 2x; returns its data file."""
    made = runner.invoke(app, ["sweep", "--task", "max_retrieval", "--attn", "softmax", "--steps", "20",
                               "--max-factor", "2", "--train-length", "6", "--eval-samples", "8", "--quiet",
                               "--set", "train.batch_size=16", "--set", "arch.d_model=32",
                               "--set", "arch.d_ff=64", "--out", str(sweep)])
    assert made.exit_code == 0, made.output
    (data,) = (sweep / "data").glob("*.parquet")
    return data


def test_a_run_whose_sweep_stopped_before_its_data_file_is_not_evaluated_again(tmp_path: Path) -> None:
    """A sweep stopped during a run's evaluation leaves rows in the run's results but no data file:
    the lengths already there are not evaluated again."""
    sweep = tmp_path / "sweep"
    data = one_run_sweep(sweep)
    data.unlink()
    result = evaluate(str(sweep), "--max-factor", "4")
    assert result.exit_code == 0, result.output
    assert "1 of 3 lengths to evaluate" in result.stderr
    rows = pd.read_parquet(sweep / "runs" / data.stem / "results.parquet")
    assert list(rows["factor"]) == [1, 2, 4] and not data.exists()


def test_a_run_whose_model_is_gone_is_restored_on_request(tmp_path: Path) -> None:
    """A clone of a sweep holds data/, not the models: eval says so, --restore trains the run again,
    checks it reproduces the recorded rows, then evaluates it; a run that does not reproduce is
    refused and nothing is written."""
    sweep = tmp_path / "sweep"
    data = one_run_sweep(sweep)
    run_dir = sweep / "runs" / data.stem
    recorded = pd.read_parquet(data)
    shutil.rmtree(run_dir)
    refused = evaluate(str(run_dir), "--max-factor", "4")
    assert refused.exit_code == 2 and "--restore" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    restored = evaluate(str(run_dir), "--max-factor", "4", "--restore")
    assert restored.exit_code == 0, restored.output
    assert "its recorded rows reproduce exactly" in restored.stderr
    assert "1 of 3 lengths to evaluate" in restored.stderr
    rows = pd.read_parquet(data)
    assert list(rows["factor"]) == [1, 2, 4] and (run_dir / "model.pt").is_file()
    pd.testing.assert_frame_equal(rows[rows["factor"] <= 2].reset_index(drop=True), recorded)
    # the sweep folder as a whole: nothing to restore now; a tampered row is not reproduced
    shutil.rmtree(run_dir)
    rows.loc[rows["factor"] == 2, "token_accuracy"] = 0.5
    write_parquet_atomic(rows, data)
    tampered = evaluate(str(sweep), "--max-factor", "4", "--restore")
    assert tampered.exit_code == 2, tampered.output
    assert "does not reproduce its recorded rows (2×: token_accuracy published 0.5" in tampered.output
    assert not run_dir.exists() and not list((sweep / "runs").glob(".restore-*"))


def test_merge_replaces_rows_of_the_same_run_length_and_variant() -> None:
    def rows(*cells: tuple[int, str, float]) -> pd.DataFrame:
        return rows_to_frame([{"run_id": "r", "factor": f, "eval_length": 4 * f, "eval_variant": v,
                               "exact_match": e, "status": "ok"} for f, v, e in cells])

    old = pd.concat([rows((1, "", 0.9), (2, "", 0.5), (1, "x=1", 0.1)),
                     rows_to_frame([{"run_id": "r", "status": "failed", "error": "OOM"}])], ignore_index=True)
    merged = merge_rows(old, rows((2, "", 0.6), (4, "", 0.2)))
    cells = list(zip(merged["eval_variant"], merged["factor"], merged["exact_match"], strict=True))
    assert cells[:3] + cells[4:] == [("", 1, 0.9), ("", 2, 0.6), ("", 4, 0.2), ("x=1", 1, 0.1)]
    assert list(merged["status"]) == ["ok"] * 3 + ["failed", "ok"]  # variant by variant, failures last


@pytest.mark.parametrize(
    ("make", "args", "expected"),
    [
        ("nothing", [], "is not a folder"),
        ("empty", [], "neither a run folder"),
        ("no model", [], "has no model.pt"),
        ("run", ["--max-factor", "6"], "power of two"),
        ("run", ["--param", "vocab_size=8"], "changes the task's vocabulary"),
        ("run", ["--param", "bogus=1"], "invalid parameters of task 'copy'"),
        ("run", ["--min-factor", "3"], "--min-factor must be a power of two"),
        ("run", ["--min-factor", "2"], "from 1 to the largest factor (1)"),
    ],
)
def test_eval_refuses(
    tmp_path: Path, make: str, args: list[str], expected: str, tiny_config: Callable[..., RunConfig]
) -> None:
    target = tmp_path / "target"
    if make == "empty":
        target.mkdir()
    elif make in ("no model", "run"):
        frame = execute(tiny_config("copy", "softmax", run=EVAL_RUN, **{"train.steps": 2,
                                                                         "eval.max_factor": 1}),
                        tmp_path, progress=False)
        target = tmp_path / frame["run_id"].iloc[0]
        if make == "no model":
            (target / "model.pt").unlink()
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")}
    result = evaluate(str(target), *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], result.stderr
    assert {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*")} == before


def _trained_then_evaluated(tmp_path: Path, config: RunConfig, *flags: str) -> tuple[Path, pd.DataFrame]:
    """The run of ``config`` trained, then ``lengthgen eval`` with ``flags``: its folder and rows."""
    frame = execute(config, tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    result = evaluate(str(run_dir), *flags)
    assert result.exit_code == 0, result.output
    return run_dir, pd.read_parquet(run_dir / "results.parquet")


def test_the_same_weights_evaluated_with_another_backend(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """Adaptive temperature without its inference-time sharpening is softmax on its weights."""
    import torch

    from lengthgen.harness.evaluate import evaluate_length
    from lengthgen.harness.run import build

    config = tiny_config("max_retrieval", "adaptive_temperature", run=EVAL_RUN, **{"eval.max_factor": 2})
    run_dir, rows = _trained_then_evaluated(tmp_path, config, "--attn", "softmax")
    plain = rows[rows["eval_variant"] == "attn=softmax"].sort_values("factor")
    assert list(plain["factor"]) == [1, 2] and set(plain["attn"]) == {"adaptive_temperature"}
    # reference: a softmax model built by hand with the saved weights
    softmax = config.model_copy(update={"attn": "softmax", "attn_options": {}})
    task, model = build(softmax)
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True)["state_dict"])
    model.eval()
    for factor, row in zip((1, 2), plain.itertuples(), strict=True):
        expected = evaluate_length(model, task, 6 * factor, factor, config.eval, torch.device("cpu"),
                                   progress=False)
        assert row.exact_match == expected.exact_match and row.token_accuracy == expected.token_accuracy
    sharpened = rows[rows["eval_variant"] == ""].sort_values("factor")
    assert list(sharpened["factor"]) == [1, 2]


def test_weights_that_do_not_fit_the_other_backend_are_refused(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    frame = execute(tiny_config("max_retrieval", "ssmax", run=EVAL_RUN, **{"eval.max_factor": 1}),
                    tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    result = evaluate(str(run_dir), "--attn", "softmax")
    assert result.exit_code == 2
    assert "do not fit the model with backend 'softmax'" in result.stderr
    assert "unexpected blocks.0.attn.backend.scale.sigma" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    unknown = evaluate(str(run_dir), "--attn", "nosuch")
    assert unknown.exit_code == 2 and "valid attention backends" in unknown.stderr


def test_the_same_weights_evaluated_in_bfloat16(tmp_path: Path, tiny: Callable[..., RunConfig]) -> None:
    """``--precision bf16`` evaluates the weights cast to bfloat16 (the paper's pure-bf16 numerics):
    rows of their own next to the fp32 ones, equal to a bf16 copy of the model built by hand, and
    not the fp32 model's numbers (the cast happened). ASEntmax: its length scale reads the weights."""
    import torch

    from lengthgen.harness.evaluate import evaluate_length
    from lengthgen.harness.run import build

    config = tiny("max_retrieval", 2)
    run_dir, rows = _trained_then_evaluated(tmp_path, config, "--precision", "bf16")
    fp32 = rows[rows["eval_variant"] == ""].sort_values("factor")
    bf16 = rows[rows["eval_variant"] == "precision=bf16"].sort_values("factor")
    assert list(bf16["factor"]) == [1, 2] and list(fp32["factor"]) == [1, 2]
    assert set(bf16["config_json"]) == set(fp32["config_json"])  # the same run
    task, model = build(config)
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True)["state_dict"])
    model = model.eval().to(torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    for factor, row in zip((1, 2), bf16.itertuples(), strict=True):
        expected = evaluate_length(model, task, 6 * factor, factor, config.eval, torch.device("cpu"),
                                   progress=False)
        assert row.exact_match == expected.exact_match and row.token_accuracy == expected.token_accuracy
        assert row.attn_entropy == expected.attn_entropy
    assert list(bf16["attn_entropy"]) != list(fp32["attn_entropy"])
    # asked again: nothing left to evaluate in that format; fp32 is the training task's rows
    again = evaluate(str(run_dir), "--precision", "bf16")
    assert again.exit_code == 0 and "0 of 2 lengths" in again.stderr
    plain = evaluate(str(run_dir), "--precision", "fp32")
    assert plain.exit_code == 0 and "0 of 2 lengths" in plain.stderr


def test_a_kept_checkpoint_is_evaluated_on_its_own_rows(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """``--checkpoint N`` evaluates the weights a run kept after N steps (``train.keep_every``): rows
    marked checkpoint=N, equal to that file's weights evaluated by hand; the kept checkpoint the
    selection chose gives the selected model's numbers; a step not kept is refused in one line; a
    run without its selected weights yet (still training) has its kept ones evaluated."""
    import torch

    from lengthgen.harness.evaluate import evaluate_length
    from lengthgen.harness.run import build
    from lengthgen.harness.weights import checkpoint_path

    config = tiny_config("max_retrieval", "asentmax", run={**EVAL_RUN, "train.keep_every": 15},
                         **{"eval.max_factor": 2})
    frame = execute(config, tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    for step in (15, 30):
        result = evaluate(str(run_dir), "--checkpoint", str(step))
        assert result.exit_code == 0, result.output
    rows = pd.read_parquet(run_dir / "results.parquet")
    task, model = build(config)
    model.load_state_dict(torch.load(checkpoint_path(run_dir, 15), weights_only=True)["state_dict"])
    early = rows[rows["eval_variant"] == "checkpoint=15"].sort_values("factor")
    assert list(early["factor"]) == [1, 2]
    for factor, row in zip((1, 2), early.itertuples(), strict=True):
        expected = evaluate_length(model.eval(), task, 6 * factor, factor, config.eval, torch.device("cpu"),
                                   progress=False)
        assert row.exact_match == expected.exact_match and row.attn_entropy == expected.attn_entropy
    best = int(frame["best_step"].iloc[0])
    chosen = rows[rows["eval_variant"] == f"checkpoint={best}"].sort_values("factor")
    plain = rows[rows["eval_variant"] == ""].sort_values("factor")
    assert list(chosen["attn_entropy"]) == list(plain["attn_entropy"])
    assert list(chosen["token_accuracy"]) == list(plain["token_accuracy"])
    missing = evaluate(str(run_dir), "--checkpoint", "20")
    assert missing.exit_code == 2 and "kept no checkpoint at step 20; choose one of 15, 30" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1
    (run_dir / "model.pt").unlink()  # as while the run still trains: its kept weights can be evaluated
    assert evaluate(str(run_dir), "--checkpoint", "15", "--redo").exit_code == 0
    selected = evaluate(str(run_dir))
    assert selected.exit_code == 2 and "has no model.pt" in selected.stderr
