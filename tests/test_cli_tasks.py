"""``lengthgen tasks`` and ``lengthgen sample``: output formats and one-line, exit-2 input errors."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.tasks import TASKS, get_task, new_task_params

BUILTINS = ["copy", "sort", "reverse", "max_retrieval", "mqmtar", "flip_flop"]
RECORD_KEYS = ["task", "length", "seed", "index", "source", "target", "input_ids", "loss_mask"]

runner = CliRunner()


def test_tasks_lists_every_task() -> None:
    result = runner.invoke(app, ["tasks"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for name in TASKS.names():
        task_cls = TASKS.get(name)
        assert any(line.split()[0] == name and task_cls.description in line for line in lines)


@pytest.mark.parametrize("name", BUILTINS)
def test_describe(name: str) -> None:
    result = runner.invoke(app, ["tasks", "--describe", name])
    assert result.exit_code == 0, result.output
    out = result.stdout
    task = get_task(name, **new_task_params(name, {}))  # the stream new runs get
    assert out.startswith(f"{name}: {task.description}")
    assert task.length_unit in out and f"minimum length: {task.min_length}" in out
    for field, info in type(task.config).model_fields.items():
        assert f"{field} = {getattr(task.config, field)!r}" in out
        assert info.description and info.description in out
    assert f"vocabulary ({task.vocab.size} tokens)" in out
    assert "example" in out and "source:" in out and "target:" in out and "tokens: <bos>" in out


@pytest.mark.parametrize("name", BUILTINS)
def test_sample_jsonl(name: str) -> None:
    task = get_task(name, **new_task_params(name, {}))
    length = max(task.min_length, 12)
    result = runner.invoke(
        app, ["sample", "--task", name, "--length", str(length), "--seed", "3", "--n", "3", "--split", "eval"]
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    batch = task.sample(3, length, seed=3, split="eval")
    assert len(records) == 3
    for i, record in enumerate(records):
        assert list(record) == RECORD_KEYS
        assert (record["task"], record["length"], record["seed"], record["index"]) == (name, length, 3, i)
        assert record["source"] == batch.source[i] and record["target"] == batch.target[i]
        assert record["input_ids"] == batch.input_ids[i].tolist()
        assert record["loss_mask"] == batch.loss_mask[i].astype(int).tolist()
        assert set(record["loss_mask"]) == {0, 1}


def test_sample_structured_shapes() -> None:
    """The per-task JSON shapes of source/target promised in the issue."""

    def first(name: str, length: int) -> dict:
        result = runner.invoke(app, ["sample", "--task", name, "--length", str(length)])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    mr = first("max_retrieval", 5)
    assert len(mr["source"]) == 5 and all(len(p) == 2 for p in mr["source"]) and len(mr["target"]) == 1
    mq = first("mqmtar", 16)
    assert set(mq["source"]) == {"pairs", "queries"} and len(mq["source"]["queries"]) == 4
    assert all(len(k) == 2 and len(v) == 2 for k, v in mq["source"]["pairs"])
    assert len(mq["target"]) == 4 and all(len(v) == 2 for v in mq["target"])
    ff = first("flip_flop", 6)
    assert [op for op, _ in ff["source"]][0] == "w" and all(isinstance(b, int) for _, b in ff["source"])
    assert isinstance(first("sort", 4)["source"][0], int)


@pytest.mark.parametrize("name", BUILTINS)
def test_sample_text(name: str) -> None:
    task = get_task(name, **new_task_params(name, {}))
    length = max(task.min_length, 10)
    result = runner.invoke(
        app, ["sample", "--task", name, "--length", str(length), "--n", "2", "--format", "text"]
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 4
    batch = task.sample(2, length)
    for i in range(2):
        assert lines[2 * i] == f"# {name} length={length} seed=0 index={i}"
        tokens = lines[2 * i + 1].split(" ")
        assert [t.strip("[]") for t in tokens] == task.vocab.decode(batch.input_ids[i])
        assert sum(t.startswith("[") for t in tokens) == int(batch.loss_mask[i].sum())


def test_sample_param() -> None:
    result = runner.invoke(
        app,
        ["sample", "--task", "mqmtar", "--length", "24", "--param", "n_queries=6", "--param", "key_len=1"],
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert len(record["target"]) == 6 and all(len(k) == 1 for k in record["source"]["queries"])


BAD_INPUTS = {
    "unknown task": (["sample", "--task", "nope", "--length", "8"], "valid tasks: copy"),
    "length 0": (["sample", "--task", "copy", "--length", "0"], "length must be positive"),
    "negative length": (["sample", "--task", "flip_flop", "--length", "-3"], "length must be positive"),
    "under minimum": (["sample", "--task", "mqmtar", "--length", "15"], "minimum"),
    "under minimum max_retrieval": (["sample", "--task", "max_retrieval", "--length", "1"], "minimum"),
    "n 0": (["sample", "--task", "copy", "--length", "8", "--n", "0"], "n must be positive"),
    "unknown split": (["sample", "--task", "copy", "--length", "8", "--split", "test"], "train, eval"),
    "param without =": (["sample", "--task", "copy", "--length", "8", "--param", "vocab_size"], "key=value"),
    "unknown param": (["sample", "--task", "copy", "--length", "8", "--param", "vocab=3"], "vocab"),
    "param out of range": (
        ["sample", "--task", "flip_flop", "--length", "8", "--param", "p_ignore=2"],
        "p_ignore",
    ),
    "param wrong type": (
        ["sample", "--task", "mqmtar", "--length", "16", "--param", "alphabet=many"],
        "alphabet",
    ),
    "impossible config": (
        ["sample", "--task", "mqmtar", "--length", "16", "--param", "alphabet=2", "--param", "key_len=1"],
        "distinct keys",
    ),
    "describe unknown": (["tasks", "--describe", "nope"], "valid tasks"),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_inputs_exit_2(case: str) -> None:
    args, expected = BAD_INPUTS[case]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)  # not a crash
    assert "Traceback" not in result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert expected in lines[0]
