"""``lengthgen`` command line.

Every user mistake (unknown name, bad length, impossible combination) ends with exit code 2 and
a one-line message that names the valid choices; never a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from enum import Enum
from typing import Any

import typer
from pydantic import ValidationError

from lengthgen.registry import RegistryError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Length-generalization benchmark for attention: train short, evaluate up to 1024x longer.",
)


class UsageError(Exception):
    """Bad input detected by lengthgen itself (exit 2)."""


def fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's input errors into ``error: ...`` and exit code 2."""
    from lengthgen.tasks.base import TaskInputError

    try:
        yield
    except (RegistryError, TaskInputError, UsageError) as exc:
        raise fail(str(exc)) from None
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}"
            for err in exc.errors()
        )
        raise fail(f"invalid parameters: {problems}") from None


def parse_params(pairs: list[str] | None) -> dict[str, Any]:
    """``key=value`` pairs → dict; values parsed as JSON when they can be (numbers, bools)."""
    params: dict[str, Any] = {}
    for pair in pairs or []:
        key, eq, raw = pair.partition("=")
        if not eq or not key:
            raise UsageError(f"bad parameter {pair!r}: expected key=value")
        try:
            params[key] = json.loads(raw)
        except json.JSONDecodeError:
            params[key] = raw
    return params


class SampleFormat(str, Enum):
    jsonl = "jsonl"
    text = "text"


@app.command("tasks")
def tasks_command(
    describe: str | None = typer.Option(None, "--describe", help="Show one task in detail."),
) -> None:
    """List the registered tasks, or describe one (parameters, defaults, vocabulary, example)."""
    from lengthgen.tasks import TASKS, get_task

    with user_errors():
        if describe is None:
            entries = list(TASKS.entries())
            width = max((len(e.name) for e in entries), default=4)
            for entry in entries:
                typer.echo(f"{entry.name:<{width}}  {entry.obj.description}")
            for name, error in sorted(TASKS.broken.items()):
                typer.echo(f"{name:<{width}}  [broken plugin] {error}")
            return
        task = get_task(describe)
        info = task.describe()
        typer.echo(f"{info['name']}: {info['description']}")
        typer.echo(f"  length counts: {info['length_unit']}")
        typer.echo(f"  minimum length: {info['min_length']}")
        typer.echo(
            f"  default training length: {info['default_train_length']} "
            f"(range {info['train_range'][0]}..{info['train_range'][1]})"
        )
        typer.echo("  parameters (set with --param key=value):")
        for field_name, field in type(task.config).model_fields.items():
            value = getattr(task.config, field_name)
            doc = f"  {field.description}" if field.description else ""
            typer.echo(f"    {field_name} = {value!r}{doc}")
        shown = ", ".join(info["vocab"][:24]) + (" ..." if info["vocab_size"] > 24 else "")
        typer.echo(f"  vocabulary ({info['vocab_size']} tokens): {shown}")
        example_length = max(task.min_length, min(8, task.default_train_length))
        batch = task.sample(1, example_length, seed=0, split="train")
        typer.echo(f"  example (length {example_length}):")
        typer.echo(f"    source: {json.dumps(batch.source[0])}")
        typer.echo(f"    target: {json.dumps(batch.target[0])}")
        typer.echo(f"    tokens: {' '.join(task.vocab.decode(batch.input_ids[0]))}")


@app.command("sample")
def sample_command(
    task_name: str = typer.Option(..., "--task", help="Task name (see `lengthgen tasks`)."),
    length: int = typer.Option(..., "--length", help="Size parameter of the task."),
    seed: int = typer.Option(0, "--seed"),
    n: int = typer.Option(1, "--n", help="Number of samples."),
    # A plain string checked by the task, so an unknown split gets the one-line error, not click's box.
    split: str = typer.Option("train", "--split", help="train or eval."),
    fmt: SampleFormat = typer.Option(SampleFormat.jsonl, "--format"),
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (repeatable)."),
) -> None:
    """Print samples: JSON lines (structured source/target and the exact model view) or text."""
    from lengthgen.tasks import get_task

    with user_errors():
        task = get_task(task_name, **parse_params(param))
        batch = task.sample(n, length, seed=seed, split=split)
    out = sys.stdout
    for i in range(len(batch)):
        ids = batch.input_ids[i]
        if fmt is SampleFormat.jsonl:
            record = {
                "task": task.name,
                "length": length,
                "seed": seed,
                "index": i,
                "source": batch.source[i],
                "target": batch.target[i],
                "input_ids": ids.tolist(),
                "loss_mask": batch.loss_mask[i].astype(int).tolist(),
            }
            out.write(json.dumps(record, separators=(",", ":")) + "\n")
        else:
            tokens = task.vocab.decode(ids)
            scored = batch.loss_mask[i]
            # Mark the tokens whose prediction is scored (the token after a masked position).
            rendered = [
                f"[{tok}]" if t > 0 and scored[t - 1] else tok for t, tok in enumerate(tokens)
            ]
            out.write(f"# {task.name} length={length} seed={seed} index={i}\n")
            out.write(" ".join(rendered) + "\n")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
