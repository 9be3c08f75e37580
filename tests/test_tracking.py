"""``--log tensorboard`` and ``--log wandb``: a tiny run's learning curve and per-length results,
read back with TensorBoard's event reader and from W&B's offline run file."""

from __future__ import annotations

import importlib.util
import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.harness import tracking

runner = CliRunner()
#: The run these tests log: 12 steps validated every 5, evaluated at 1× and 2× on 8 samples.
TRACKED_RUN = {"train.steps": 12, "train.val_every": 5, "eval.max_factor": 2, "train.train_length": 8,
               "eval.samples": 8}
EVAL_TAGS = {f"eval/{name}" for name in tracking.EVAL_FIELDS}


@pytest.fixture
def tracked(tiny_flags: Callable[..., list[str]]) -> list[str]:
    """The tracked run's flags: copy with softmax, ``TRACKED_RUN`` on the tiny model."""
    return ["--task", "copy", "--attn", "softmax", *tiny_flags(TRACKED_RUN)]


def run_with(tmp_path: Path, log: str, tracked: list[str]) -> tuple[Path, pd.DataFrame]:
    result = runner.invoke(app, ["run", *tracked, "--log", log, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    return run_dir, pd.read_parquet(run_dir / "results.parquet")


def test_tensorboard_log_reads_back(tmp_path: Path, tracked: list[str]) -> None:
    pytest.importorskip("tensorboard", reason="optional extra: pip install 'lengthgen[track]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, rows = run_with(tmp_path, "tensorboard", tracked)
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert {"train/loss", "train/lr", "val/exact_match"} | EVAL_TAGS <= set(events.Tags()["scalars"])
    assert [e.step for e in events.Scalars("train/loss")] == [1, 11, 12]
    assert [e.step for e in events.Scalars("val/exact_match")] == [5, 10, 12]
    history = json.loads((run_dir / "train_history.json").read_text())
    assert [e.value for e in events.Scalars("val/exact_match")] == [h["val_exact"] for h in history]
    assert events.Scalars("train/lr")[0].value == pytest.approx(2e-3 / 100)  # quick preset: warmup 100
    for name in tracking.EVAL_FIELDS:
        logged = events.Scalars(f"eval/{name}")
        assert [e.step for e in logged] == list(rows["eval_length"])
        assert [e.value for e in logged] == pytest.approx(list(rows[name]), rel=1e-6)


def wandb_records(path: Path) -> Iterator[bytes]:
    """Records of a W&B run file: a 7-byte file header, then LevelDB-style log blocks of 32 KiB
    whose chunks carry a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last)."""
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block, pending = 7, 32768, b""
    while position + 7 <= len(data):
        room = block - position % block
        if room < 7:  # the rest of a block too short for a header is padding
            position += room
            continue
        _, length, kind = struct.unpack("<IHB", data[position:position + 7])
        if length == 0 and kind == 0:
            position += room
            continue
        pending += data[position + 7:position + 7 + length]
        position += 7 + length
        if kind in (1, 4):
            yield pending
            pending = b""


def test_wandb_offline_run_holds_the_metrics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tracked: list[str]
) -> None:
    pytest.importorskip("wandb", reason="optional extra: pip install 'lengthgen[track]'")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir, rows = run_with(tmp_path, "wandb", tracked)
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = []
    for raw in wandb_records(run_file):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                            for item in record.history.item})
    train = [h for h in history if "train/loss" in h]
    assert [h["train/step"] for h in train] == [1, 11, 12] and all("train/lr" in h for h in train)
    assert [h["train/step"] for h in history if "val/exact_match" in h] == [5, 10, 12]
    evaluated = [h for h in history if "eval/exact_match" in h]
    assert [h["length"] for h in evaluated] == list(rows["eval_length"])
    assert [h["eval/factor"] for h in evaluated] == list(rows["factor"])
    for name in tracking.EVAL_FIELDS:
        assert [h[f"eval/{name}"] for h in evaluated] == pytest.approx(list(rows[name]), rel=1e-9)


def test_eval_logs_a_variant_under_its_own_prefix(tmp_path: Path, tracked: list[str]) -> None:
    pytest.importorskip("tensorboard", reason="optional extra: pip install 'lengthgen[track]'")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    flip_flop = [a if a != "copy" else "flip_flop" for a in tracked]
    result = runner.invoke(app, ["run", *flip_flop, "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    (run_dir,) = list(tmp_path.iterdir())
    result = runner.invoke(app, ["eval", str(run_dir), "--param", "eval_variant=dense",
                                 "--log", "tensorboard", "--quiet"])
    assert result.exit_code == 0, result.output
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("eval[eval_variant=dense]/exact_match")] == [8, 16]


@pytest.mark.parametrize("name", ["tensorboard", "wandb"])
def test_a_missing_package_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           name: str, tracked: list[str]) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(tracking.importlib.util, "find_spec",
                        lambda package, *a: None if package == name else real(package, *a))
    for command in (["run", *tracked], ["sweep", *tracked]):
        result = runner.invoke(app, [*command, "--log", name, "--out", str(tmp_path / "out")])
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (f"error: --log {name} needs the {name} package: "
                                         "pip install 'lengthgen[track]'")
    assert not (tmp_path / "out").exists()
