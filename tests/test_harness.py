"""Training, evaluation, results and the ``lengthgen run`` command, on tiny configurations."""

from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from lengthgen.attention import ATTENTION
from lengthgen.cli import app
from lengthgen.config import EvalConfig, RunConfig, build_run_config
from lengthgen.harness.evaluate import wilson_interval
from lengthgen.harness.run import build, execute
from lengthgen.harness.storage.results import COLUMNS, read_results
from lengthgen.harness.train import lr_at, train, train_lengths, validate
from lengthgen.harness.weights import checkpoint_path, kept_steps
from lengthgen.model import ModelConfig, Transformer
from lengthgen.presets import PAPER

runner = CliRunner()


def test_wilson_interval_hand_values():
    lo, hi = wilson_interval(8, 10)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    lo, hi = wilson_interval(0, 20)
    assert lo == 0.0 and hi == pytest.approx(0.1611, abs=1e-4)
    lo, hi = wilson_interval(20, 20)
    assert hi == 1.0 and lo == pytest.approx(0.8389, abs=1e-4)


def test_learning_rate_schedule_warmup_then_cosine(learning_config: Callable[..., RunConfig]):
    config = learning_config("softmax")
    t = config.train
    assert lr_at(0, config) == pytest.approx(t.lr / t.warmup_steps)
    assert lr_at(t.warmup_steps - 1, config) == pytest.approx(t.lr)
    assert lr_at(t.steps, config) == pytest.approx(t.lr * t.min_lr_ratio)
    middle = t.warmup_steps + (t.steps - t.warmup_steps) // 2
    assert lr_at(middle, config) == pytest.approx(t.lr * (t.min_lr_ratio + 1) / 2, rel=0.02)


def test_training_lengths_cover_the_range_and_follow_the_seed(learning_config: Callable[..., RunConfig]):
    config = learning_config("softmax")
    task, _ = build(config)
    lengths = train_lengths(task, config)
    assert set(lengths.tolist()) == {3, 4, 5, 6}
    assert (train_lengths(task, learning_config("softmax", seed=1)) != lengths).any()


def test_eval_sample_schedule():
    config = EvalConfig(samples=256, min_samples=16, token_budget=10_000)
    assert config.samples_at(20) == 256
    assert config.samples_at(100) == 100
    assert config.samples_at(100_000) == 16
    assert EvalConfig(max_factor=8).factors() == [1, 2, 4, 8]
    with pytest.raises(ValueError):
        EvalConfig(max_factor=6)


@pytest.mark.parametrize("attn", sorted(ATTENTION.names()))
def test_tiny_training_run_learns(attn, learning_config: Callable[..., RunConfig]):
    config = learning_config(attn)
    task, model = build(config)
    result = train(model, task, config, torch.device("cpu"), progress=False)
    first, last = result.history[0], result.history[-1]
    assert result.best_val_exact >= 0.6, result.history
    assert last["val_exact"] >= first["val_exact"] - 0.05
    assert math.isfinite(last["loss"]) and last["loss"] < math.log(task.vocab.size)


@pytest.mark.parametrize("selection", ["id", "8x"])
def test_selected_checkpoint_records_validation_at_1x_and_8x(
    selection, learning_config: Callable[..., RunConfig]
):
    """Both validation scores belong to the checkpoint that was kept, whichever rule kept it."""
    settings = {"train.steps": 60, "train.val_every": 20, "train.selection": selection}
    config = learning_config("softmax", **settings)
    task, model = build(config)
    result = train(model, task, config, torch.device("cpu"), progress=False)
    length, n, batch = config.train.train_length, config.train.val_samples, config.train.batch_size
    assert result.val_exact_id == validate(model, task, length, n, torch.device("cpu"), batch)
    assert result.val_exact_8x == validate(model, task, 8 * length, n, torch.device("cpu"), batch)
    chosen = result.val_exact_id if selection == "id" else result.val_exact_8x
    assert chosen == result.best_val_exact == max(h["val_exact"] for h in result.history)


def test_run_writes_folder_schema_and_is_deterministic(tmp_path, learning_config: Callable[..., RunConfig]):
    config = learning_config("asentmax", **{"train.steps": 40})
    first = execute(config, tmp_path / "a", progress=False)
    second = execute(config, tmp_path / "b", progress=False)
    run_dir = tmp_path / "a" / first["run_id"].iloc[0]
    for name in ("config.json", "model.pt", "results.parquet", "accuracy_vs_length.png"):
        assert (run_dir / name).is_file(), name
    frame = read_results(run_dir / "results.parquet")
    assert tuple(frame.columns) == COLUMNS
    assert list(frame["factor"]) == [1, 2] and list(frame["eval_length"]) == [6, 12]
    assert (frame["status"] == "ok").all()
    assert frame["val_exact_id"].between(0, 1).all() and frame["val_exact_8x"].between(0, 1).all()
    assert (frame["exact_match_lo"] <= frame["exact_match"]).all()
    assert (frame["exact_match"] <= frame["exact_match_hi"]).all()
    volatile = ["train_seconds", "eval_seconds", "created_at"]
    pd.testing.assert_frame_equal(first.drop(columns=volatile), second.drop(columns=volatile))
    assert RunConfig.model_validate_json(frame["config_json"].iloc[0]) == config


def test_kept_checkpoints_do_not_change_training(tmp_path, learning_config: Callable[..., RunConfig]):
    plain = learning_config("softmax", **{"train.steps": 40, "train.val_every": 20})
    keeping = learning_config("softmax", **{"train.steps": 40, "train.val_every": 20, "train.keep_every": 15})
    assert "keep_every" not in plain.model_dump()["train"] and plain.config_hash() != keeping.config_hash()
    rows = {name: execute(config, tmp_path / name, progress=False)
            for name, config in (("plain", plain), ("keeping", keeping))}
    plain_dir = tmp_path / "plain" / rows["plain"]["run_id"].iloc[0]
    run_dir = tmp_path / "keeping" / rows["keeping"]["run_id"].iloc[0]
    assert kept_steps(plain_dir) == [] and kept_steps(run_dir) == [15, 30]

    def weights(path):
        return torch.load(path, weights_only=True)["state_dict"]

    selected, plain_weights = weights(run_dir / "model.pt"), weights(plain_dir / "model.pt")
    assert all(torch.equal(selected[k], plain_weights[k]) for k in selected)  # keeping changed nothing
    early, late = weights(checkpoint_path(run_dir, 15)), weights(checkpoint_path(run_dir, 30))
    assert not all(torch.equal(early[k], late[k]) for k in early)
    saved_for = torch.load(checkpoint_path(run_dir, 30), weights_only=True)["config"]
    assert saved_for == keeping.model_dump(mode="json")


def test_nan_loss_fails_the_run_with_a_clear_status(tmp_path, learning_config: Callable[..., RunConfig]):
    config = learning_config("softmax", **{"train.lr": 1e30})  # finite, but the weights blow up
    frame = execute(config, tmp_path, progress=False)
    assert list(frame["status"]) == ["failed"]
    assert "TrainingDiverged" in frame["error"].iloc[0]


def test_paper_presets_match_the_paper_sizes():
    config = build_run_config("mqmtar", "asentmax", preset="paper")
    assert config.task_params["alphabet"] == 256
    task, model = build(config)
    a = config.arch
    assert (a.n_layers, a.d_model, a.n_heads, a.d_ff) == (4, 512, 16, 1024)
    assert a.d_model // a.n_heads == 32
    v, d, f = task.vocab.size, a.d_model, a.d_ff
    per_layer = 4 * d * d + 2 * d * f + f + d + 4 * d  # attention, FFN (+biases), two LayerNorms
    scale = 2 * (d * a.n_heads + a.n_heads)  # ASEntmax's W_β, W_γ and biases
    expected = 2 * v * d + a.n_layers * (per_layer + scale) + 2 * d
    assert model.num_parameters() == expected
    assert PAPER["sort"]["arch"] == {"n_layers": 2, "d_model": 256, "n_heads": 8, "d_ff": 1024}
    assert config.train.batch_size == 128 and config.train.lr == 2e-4


def test_model_config_rejects_unknown_fields_and_bad_heads():
    with pytest.raises(ValueError):
        ModelConfig(vocab_size=10, d_model=30, n_heads=4)
    with pytest.raises(ValueError):
        ModelConfig(vocab_size=10, dropout=0.1)  # type: ignore[call-arg]
    assert Transformer(ModelConfig(vocab_size=10), seed=0).num_parameters() > 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--task", "nope", "--attn", "softmax"], "valid tasks"),
        (["--task", "copy", "--attn", "nope"], "valid attention backends"),
        (["--task", "copy", "--attn", "softmax", "--pos", "nope2"], "valid position schemes"),
        (["--task", "copy", "--attn", "softmax", "--preset", "huge"], "valid presets"),
        (["--task", "copy", "--attn", "softmax", "--max-factor", "6"], "power of two"),
        (["--task", "copy", "--attn", "softmax", "--train-length", "0"], "train_length"),
        (["--task", "max_retrieval", "--attn", "softmax", "--train-length", "1"], "minimum"),
        (["--task", "copy", "--attn", "entmax", "--attn-option", "alpha=3"], "alpha"),
        (["--task", "copy", "--attn", "softmax", "--attn-option", "alpha=1.5"], "alpha"),
        (["--task", "copy", "--attn", "softmax", "--steps", "-1"], "steps"),
    ],
)
def test_run_bad_input_exits_2_with_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["run", *args, "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_run_cuda_without_cuda_exits_2(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = runner.invoke(app, ["run", "--task", "copy", "--attn", "softmax", "--device", "cuda",
                                 "--out", str(tmp_path)])
    assert result.exit_code == 2 and "CUDA" in result.output


def test_prefetched_batches_train_the_same_model(learning_config: Callable[..., RunConfig]):
    """Making step s + 1's batch while step s computes changes nothing a run records."""
    config = learning_config("asentmax", **{"train.steps": 30, "train.val_every": 10})
    results = []
    for ahead in (True, False):
        task, model = build(config)
        result = train(model, task, config, torch.device("cpu"), progress=False, prefetch=ahead)
        results.append((result.history, result.best_step, model.state_dict()))
    (history_a, best_a, state_a), (history_b, best_b, state_b) = results
    assert history_a == history_b and best_a == best_b
    assert state_a.keys() == state_b.keys()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)


def test_prefetch_hands_each_step_its_own_batch_and_its_errors():
    from lengthgen.harness.prefetch import prefetched

    made = []

    def make(step: int) -> int:
        made.append(step)
        if step == 7:
            raise ValueError("bad step 7")
        return step * step

    with prefetched(make, range(3, 7)) as batches:
        assert list(batches) == [(s, s * s) for s in range(3, 7)]
    seen = []
    with pytest.raises(ValueError, match="bad step 7"), prefetched(make, range(5, 9)) as batches:
        seen.extend(step for step, _ in batches)
    assert seen == [5, 6]  # the error reaches the caller at the step it belongs to
    with prefetched(make, range(0)) as batches:
        assert list(batches) == []


def test_divergence_stops_within_the_logging_interval(monkeypatch, learning_config: Callable[..., RunConfig]):
    """A non-finite loss is read back only at logging steps, so the run stops within LOG_EVERY
    steps of it, names the first bad step, and never validates diverged weights."""
    from lengthgen.harness import train as training

    config = learning_config("softmax", **{"train.steps": 60, "train.val_every": 50})
    task, model = build(config)
    bad_from, calls = 23, []
    real_loss = training.masked_loss

    def poisoned(logits, batch):
        calls.append(1)
        loss = real_loss(logits, batch)
        return loss * float("nan") if len(calls) > bad_from else loss

    validations = []
    monkeypatch.setattr(training, "masked_loss", poisoned)
    monkeypatch.setattr(training, "validate", lambda *a, **k: validations.append(1) or 0.0)
    with pytest.raises(training.TrainingDiverged, match=f"loss became nan at step {bad_from};"):
        train(model, task, config, torch.device("cpu"), progress=False)
    assert bad_from + 1 <= len(calls) <= bad_from + training.LOG_EVERY
    assert validations == []


@pytest.mark.parametrize("attn", ["softmax", "asentmax"])
def test_bf16_training_is_recorded_and_runs_bf16_products(attn, learning_config: Callable[..., RunConfig]):
    """``train.precision = bf16`` autocasts the training forward passes (the linear layers run in
    bfloat16, attention arithmetic stays fp32), is part of the config's hash, and still learns; the
    default fp32 is not written, so recorded configs keep their hash."""
    config = learning_config(attn, **{"train.precision": "bf16"})
    plain = learning_config(attn)
    assert '"precision":"bf16"' in config.canonical_json() and "precision" not in plain.canonical_json()
    assert config.config_hash() != plain.config_hash()
    assert RunConfig.model_validate_json(plain.canonical_json()).train.precision == "fp32"
    task, model = build(config)
    seen = set()
    hook = model.blocks[0].mlp[0].register_forward_hook(lambda m, i, out: seen.add(out.dtype))
    result = train(model, task, config, torch.device("cpu"), progress=False)
    hook.remove()
    assert torch.bfloat16 in seen and torch.float32 in seen  # training in bf16, validation in fp32
    assert result.best_val_exact >= 0.6, result.history


def _engine_normalized() -> list[str]:
    """The built-ins and the installed plugins that hand the engine one of its own normalizers
    (lengthgen-baselines): a plugin's bare ``normalize`` has its output checked on the host, by
    design (``kernels.normalizers.Custom``)."""
    from lengthgen.attention.backend import AttentionBackend

    return sorted(e.name for e in ATTENTION.entries()
                  if e.builtin or e.obj.normalizer is not AttentionBackend.normalizer)


@pytest.mark.parametrize("attn", _engine_normalized())
def test_a_training_step_never_waits_for_the_device(attn, monkeypatch):
    """On the meta device every read of a tensor's value by the host raises: a training step
    (forward, loss, divergence watch, backward, clipping, AdamW) that runs there has no host-device
    synchronisation. The engine is held to the materialized path, which a GPU trains on wherever
    the Triton kernel does not run (the query rows of the last layer, every non-α-entmax layer)."""
    from lengthgen.harness.batches import ModelBatch, masked_loss
    from lengthgen.harness.train import DivergenceWatch
    from lengthgen.kernels import engine

    config = build_run_config("mqmtar", attn, preset="paper-tasks", pos="nape")
    task, model = build(config)
    model.to("meta")  # the last layer's query rows read every key's input (x_keys): no host read either
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = ModelBatch.from_task(task.sample(4, 40), "cpu").to("meta")
    watch = DivergenceWatch(torch.device("meta"))
    monkeypatch.setattr(engine, "_choose", lambda *args: "materialized")
    for step in range(2):
        loss = masked_loss(model(batch.input_ids, batch.query_positions), batch)
        watch.observe(loss, step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    with pytest.raises((RuntimeError, NotImplementedError)):
        watch.check()  # the check itself reads the device: that is why it runs every LOG_EVERY steps
