"""``build_run_config``, the one path from settings to a run: every setting honoured, every bad
one refused with a one-line ``UserError`` before anything is allocated, run ids of the committed
results unchanged."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from lengthgen import limits
from lengthgen.config import (
    ARCH_FIELDS,
    ModelConfig,
    RunConfig,
    build_run_config,
    combine_overrides,
    dotted,
    flag_overrides,
    parse_assignments,
    parse_value,
)
from lengthgen.errors import UserError
from lengthgen.harness.storage.identity import run_key
from lengthgen.presets import PAPER, QUICK
from lengthgen.tasks import get_task

COMMITTED = Path(__file__).resolve().parent.parent / "leaderboard" / "data"


@pytest.mark.parametrize(
    ("raw", "value"),
    [("7", 7), ("5e-4", 5e-4), ("true", True), ("null", None), ("[0.9, 0.95]", [0.9, 0.95]),
     ('"8x"', "8x"), ("8x", "8x"), ("abc", "abc"), ("", ""), ("NaN", "NaN"), ("-Infinity", "-Infinity")],
)
def test_parse_value(raw: str, value: object) -> None:
    assert parse_value(raw) == value and type(parse_value(raw)) is type(value)


def test_parse_assignments() -> None:
    parsed = parse_assignments(["a=1", "b=x", "c=[1,2]", "d=k=v"])
    assert parsed == {"a": 1, "b": "x", "c": [1, 2], "d": "k=v"}
    assert parse_assignments(None) == {}
    with pytest.raises(UserError, match="bad --set 'x': expected key=value"):
        parse_assignments(["x"], "--set")
    with pytest.raises(UserError, match="bad --param '=3'"):
        parse_assignments(["=3"])
    with pytest.raises(UserError, match="sets 'a' twice"):
        parse_assignments(["a=1", "a=2"])


def test_every_override_is_honoured() -> None:
    config = build_run_config("copy", "softmax", seed=3, overrides={
        "train.steps": 7, "eval.max_factor": 4, "train.train_length": 8, "train.lr": 5e-4,
        "arch.d_model": 64, "arch.n_heads": 8, "eval.samples": 12, "eval.min_samples": 4,
        "train.selection": "8x",
    })
    assert (config.train.steps, config.eval.max_factor, config.train.train_length) == (7, 4, 8)
    assert (config.train.lr, config.arch.d_model, config.arch.n_heads) == (5e-4, 64, 8)
    assert (config.eval.samples, config.eval.min_samples) == (12, 4)
    assert (config.train.selection, config.seed) == ("8x", 3)
    # the dedicated flags are the same dotted overrides
    flags = flag_overrides(steps=7, max_factor=4, train_length=8, eval_samples=12, selection="8x")
    assert flags == {"train.steps": 7, "eval.max_factor": 4, "train.train_length": 8, "eval.samples": 12,
                     "train.selection": "8x"}
    assert flag_overrides() == {}


def test_neighbours_follow_a_lowered_field() -> None:
    # --eval-samples 4 under a preset with min_samples 16: the fewest never exceeds the most
    config = build_run_config("copy", "softmax", overrides={"eval.samples": 4})
    assert (config.eval.samples, config.eval.min_samples) == (4, 4)
    # the paper preset's min_train_length 32 with --train-length 16: back to the default (L/2)
    paper = build_run_config("sort", "softmax", preset="paper", overrides={"train.train_length": 16})
    assert paper.train.min_train_length is None


def test_two_values_for_one_field_are_refused() -> None:
    with pytest.raises(UserError, match="train.steps is set twice, to 5 and to 7"):
        combine_overrides(flag_overrides(steps=5), {"train.steps": 7})
    assert combine_overrides({"train.steps": 5}, {"train.steps": 5}) == {"train.steps": 5}


BAD = {
    "unknown section": ({"overrides": {"model.d": 1}}, "SECTION one of train, eval, arch"),
    "no section": ({"overrides": {"steps": 1}}, "expected SECTION.FIELD"),
    "unknown field": ({"overrides": {"train.bogus": 1}}, "train.bogus: Extra inputs are not permitted"),
    "not a number": ({"overrides": {"train.steps": "abc"}}, "train.steps: Input should be a valid integer"),
    "NaN lr": ({"overrides": {"train.lr": "NaN"}}, "train.lr: Input should be a finite number"),
    "inf lr": ({"overrides": {"train.lr": float("inf")}}, "train.lr: Input should be a finite number"),
    "betas": ({"overrides": {"train.betas": [0.9, 1.5]}}, "betas must be in [0, 1)"),
    "min_samples over samples": ({"overrides": {"eval.samples": 4, "eval.min_samples": 100}},
                                 "min_samples 100 is over samples 4"),
    "min_train_length over L": ({"overrides": {"train.min_train_length": 100}},
                                "min_train_length 100 is over train_length 16"),
    "L under the task minimum": ({"task": "mqmtar", "overrides": {"train.train_length": 8}},
                                 "train.train_length 8 is under the minimum of task 'mqmtar'"),
    "low end under the task minimum": ({"task": "mqmtar", "overrides": {"train.min_train_length": 8}},
                                       "train.min_train_length 8 is under the minimum"),
    "not a power of two": ({"overrides": {"eval.max_factor": 6}}, "power of two"),
    "max factor too long": ({"overrides": {"eval.max_factor": 2**30}}, "less than or equal to 1048576"),
    "longest length": ({"overrides": {"eval.max_factor": 2**20}}, "longest evaluation length"),
    "too many tokens": ({"overrides": {"eval.max_factor": 2**16, "eval.samples": 10**6,
                                       "eval.min_samples": 10**4}}, "samples × length"),
    "steps": ({"overrides": {"train.steps": 10**12}}, "train.steps: Input should be less than or equal"),
    "batch": ({"overrides": {"train.batch_size": 10**6, "train.train_length": 10**3}},
              "batch_size × train_length"),
    "model size": ({"overrides": {"arch.d_model": 2**17, "arch.n_heads": 8}}, "model size"),
    "heads": ({"overrides": {"arch.d_model": 30}}, "not divisible by n_heads"),
    "arch holds only the size": ({"overrides": {"arch.attn": "entmax"}}, "attn cannot be set in arch"),
    "negative seed": ({"seed": -1}, "seed -1 is out of range"),
    "huge seed": ({"seed": 99999999999999999999999}, "out of range"),
    "NaN attention option": ({"attn": "asentmax", "attn_options": {"delta": float("nan")}},
                             "attention option delta=nan: must be a finite number"),
    "NaN option as text": ({"attn": "asentmax", "attn_options": {"beta_init": "Infinity"}}, "finite"),
    "unknown option": ({"attn_options": {"delta": 1.0}}, "unknown attention option 'delta' of 'softmax'"),
    "NaN task parameter": ({"task": "flip_flop", "task_params": {"p_ignore": float("nan")}}, "finite"),
    "bad task parameter": ({"task_params": {"vocab": 3}}, "invalid parameters of task 'copy'"),
    "unknown task": ({"task": "nope"}, "valid tasks"),
    "unknown backend": ({"attn": "nope"}, "valid attention backends"),
    "unknown position scheme": ({"pos": "xyz"}, "valid position schemes"),
    "unknown preset": ({"preset": "huge"}, "valid presets: quick, paper"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_settings_are_one_line_user_errors(case: str) -> None:
    arguments, message = BAD[case]
    kwargs = {"task": "copy", "attn": "softmax", **arguments}
    with pytest.raises(UserError) as info:
        build_run_config(kwargs.pop("task"), kwargs.pop("attn"), **kwargs)
    text = str(info.value)
    assert message in text and "\n" not in text


def test_limits_leave_the_paper_settings_alone() -> None:
    for task in ("mqmtar", "sort", "copy", "reverse", "max_retrieval", "flip_flop"):
        paper = build_run_config(task, "asentmax", preset="paper")
        longest = paper.train.train_length * paper.eval.max_factor
        assert longest <= limits.MAX_LENGTH
        assert paper.eval.samples * longest <= limits.MAX_TOKENS


def test_one_model_config() -> None:
    config = build_run_config("copy", "entmax", pos="alibi", overrides={"arch.d_model": 64})
    assert isinstance(config.arch, ModelConfig)
    assert sorted(config.model_dump(mode="json")["arch"]) == sorted(ARCH_FIELDS)
    model = config.model(vocab_size=36)
    assert (model.vocab_size, model.d_model, model.attn, model.pos) == (36, 64, "entmax", "alibi")
    assert model.attn_options == config.attn_options and model.n_layers == config.arch.n_layers
    assert RunConfig.model_validate_json(config.canonical_json()) == config


def test_dotted_settings_give_the_config_back() -> None:
    config = build_run_config("max_retrieval", "ssmax", pos="rope", seed=2, overrides={
        "train.lr": 7e-4, "eval.max_factor": 16, "arch.n_layers": 3})
    rebuilt = build_run_config(config.task, config.attn, pos=config.pos, preset=config.preset,
                               seed=config.seed, task_params=config.task_params,
                               attn_options=config.attn_options, overrides=dotted(config))
    assert rebuilt == config and rebuilt.config_hash() == config.config_hash()


def _committed_configs() -> list[tuple[Path, pd.Series, RunConfig]]:
    """Every committed results file (the leaderboard's and its ablations'), its first row, its config."""
    files = sorted(COMMITTED.glob("*.parquet")) + sorted(COMMITTED.parent.glob("ablations/*/data/*.parquet"))
    out = []
    for path in files:
        frame = pd.read_parquet(path, columns=["run_id", "config_hash", "config_json", "task", "attn",
                                               "pos", "seed", "preset"])
        row = frame.iloc[0]
        out.append((path, row, RunConfig.model_validate_json(row["config_json"])))
    return out


def test_committed_results_keep_their_run_ids() -> None:
    """Every committed run: its config_json parses to the same hash and run id, and its preset plus
    its recorded settings (as its sweep built it) give that config again; a config recorded
    without a stream names stream 1, the stream it was made with (new runs get the latest)."""
    committed = _committed_configs()
    assert len(committed) >= 78
    for path, row, config in committed:
        assert config.canonical_json() == row["config_json"], path.name
        assert config.config_hash() == row["config_hash"] and run_key(config) == row["run_id"]
        assert path.stem == row["run_id"]
        rebuilt = build_run_config(row["task"], row["attn"], pos=row["pos"], preset=row["preset"],
                                   seed=int(row["seed"]), task_params={"stream": 1, **config.task_params},
                                   attn_options=config.attn_options, overrides=dotted(config))
        assert rebuilt.config_hash() == row["config_hash"], path.name


def test_quick_presets_are_valid() -> None:
    for task in QUICK:
        config = build_run_config(task, "softmax")
        assert config.train.steps > 0 and not math.isnan(config.train.lr)


@pytest.mark.parametrize("task", sorted(PAPER))
def test_paper_tasks_preset_keeps_the_papers_task_protocol(task: str) -> None:
    """Training lengths, evaluation factors and task parameters as the paper preset; only the
    model and the optimizer's budget are the quick preset's."""
    mine = build_run_config(task, "asentmax", preset="paper-tasks")
    paper = build_run_config(task, "asentmax", preset="paper")
    assert (mine.train.train_length, mine.train.min_train_length) == (
        paper.train.train_length, paper.train.min_train_length)
    assert mine.eval.max_factor == paper.eval.max_factor
    assert mine.task_params == paper.task_params
    assert mine.train.steps < paper.train.steps and mine.arch.d_model <= paper.arch.d_model


def test_paper_tasks_mqmtar_has_the_papers_pair_count() -> None:
    """The paper places floor(0.8·L/6) key-value pairs in a context of L tokens, at every length."""
    config = build_run_config("mqmtar", "softmax", preset="paper-tasks")
    task = get_task("mqmtar", **config.task_params)
    for length in range(32, 64 * 1024 + 1, 7):
        assert task.n_pairs(length) == max(4, (8 * length) // 60), length


def test_new_runs_get_the_latest_stream_and_recorded_configs_keep_theirs() -> None:
    """A new MQMTAR config names stream 2; a config without ``stream`` is stream 1, and ``stream
    = 1`` given explicitly is that same config (never written), so old hashes are kept."""
    from lengthgen.harness.run import build

    new = build_run_config("mqmtar", "softmax", preset="paper-tasks")
    assert new.task_params["stream"] == 2 and build(new)[0].config.stream == 2
    first = build_run_config("mqmtar", "softmax", preset="paper-tasks", task_params={"stream": 1})
    assert "stream" not in first.task_params and build(first)[0].config.stream == 1
    recorded = RunConfig.model_validate_json(first.canonical_json())
    assert recorded == first and build(recorded)[0].config.stream == 1
    assert first.config_hash() != new.config_hash()
    explicit = RunConfig(task="copy", task_params={"stream": 1})
    assert explicit.config_hash() == RunConfig(task="copy").config_hash()
    again = build_run_config("mqmtar", "softmax", preset="paper-tasks", start=recorded,
                             overrides={"eval.max_factor": 8})
    assert "stream" not in again.task_params  # lengthgen eval keeps the recorded stream


def test_reproduce_flags_rebuild_a_first_stream_run() -> None:
    from lengthgen.leaderboard.reproduce import sweep_flags
    from lengthgen.sweeps import SweepSpec

    recorded = build_run_config("mqmtar", "asentmax", preset="paper-tasks", task_params={"stream": 1},
                                overrides={"train.lr": 5e-4})
    flags = sweep_flags("mqmtar", recorded.model_dump(mode="json"))
    assert "--param stream=1" in flags
    rebuilt = SweepSpec(tasks=("mqmtar",), attns=("asentmax",), preset="paper-tasks",
                        task_params={"stream": 1}, overrides={"train.lr": 5e-4}).configs()[0]
    assert rebuilt.config_hash() == recorded.config_hash()


def test_documented_example_run_id_is_the_default_runs() -> None:
    """docs/sweeps.md names a default run's id as its example; a config change that moves the id
    must move the docs with it."""
    run_id = run_key(build_run_config("copy", "softmax"))
    docs = (Path(__file__).parents[1] / "docs" / "sweeps.md").read_text()
    assert f"e.g. `{run_id}`" in docs
