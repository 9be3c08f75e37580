"""``lengthgen`` command line.

Every user mistake (unknown name, bad length, impossible combination) ends with exit code 2 and
a one-line message that names the valid choices; never a traceback.
"""

from __future__ import annotations

import json
import sys
import warnings
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


class Device(str, Enum):
    auto = "auto"
    cpu = "cpu"
    cuda = "cuda"


class Selection(str, Enum):
    id = "id"
    eight_x = "8x"


@app.command("attns")
def attns_command() -> None:
    """List the attention backends and the position schemes."""
    from lengthgen.attention import ATTENTION
    from lengthgen.attention.positions import POSITION_SCHEMES

    entries = list(ATTENTION.entries())
    width = max([len(e.name) for e in entries] + [len(n) for n in POSITION_SCHEMES])
    typer.echo("attention backends (--attn):")
    for entry in entries:
        typer.echo(f"  {entry.name:<{width}}  {entry.obj.description}")
    for name, error in sorted(ATTENTION.broken.items()):
        typer.echo(f"  {name:<{width}}  [broken plugin] {error}")
    typer.echo("position schemes (--pos):")
    for name, scheme in POSITION_SCHEMES.items():
        typer.echo(f"  {name:<{width}}  {scheme.description}")


def format_table(rows: Any) -> str:
    """Exact match by length as a small fixed-width table."""
    lines = [f"{'length':>8} {'factor':>7} {'n':>5} {'exact':>7} {'95% CI':>15} {'tok acc':>8} "
             f"{'entropy':>8} {'support':>8} {'sec':>7}"]
    for r in rows.itertuples():
        if r.status != "ok":
            lines.append(f"failed: {r.error}")
            continue
        lines.append(
            f"{r.eval_length:>8} {str(r.factor) + 'x':>7} {r.n_samples:>5} {r.exact_match:>7.3f} "
            f"{'[' + format(r.exact_match_lo, '.3f') + ', ' + format(r.exact_match_hi, '.3f') + ']':>15} "
            f"{r.token_accuracy:>8.3f} {r.attn_entropy:>8.3f} {r.attn_support:>8.1f} {r.eval_seconds:>7.1f}"
        )
    return "\n".join(lines)


@app.command("run")
def run_command(
    task_name: str = typer.Option(..., "--task", help="Task name (see `lengthgen tasks`)."),
    attn: str = typer.Option(..., "--attn", help="Backend name (see `lengthgen attns`) or file.py:Class."),
    pos: str = typer.Option("nape", "--pos", help="Position scheme: nape, alibi, rope, nope."),
    preset: str = typer.Option("quick", "--preset", help="quick (CPU minutes) or paper."),
    train_length: int | None = typer.Option(None, "--train-length", help="Longest training length L."),
    max_factor: int | None = typer.Option(None, "--max-factor", help="Evaluate up to L·this (power of 2)."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (overrides the preset)."),
    seed: int = typer.Option(0, "--seed"),
    device: Device = typer.Option(Device.auto, "--device"),
    eval_samples: int | None = typer.Option(None, "--eval-samples", help="Samples per length (the most)."),
    selection: Selection | None = typer.Option(None, "--selection", help="Checkpoint selection: id or 8x."),
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (repeatable)."),
    attn_option: list[str] = typer.Option(None, "--attn-option", help="Backend option key=value."),
    override: list[str] = typer.Option(
        None, "--set", help="Any config field SECTION.FIELD=VALUE, e.g. train.lr=5e-4 (repeatable)."
    ),
    out: str = typer.Option("runs", "--out", help="Folder that receives the run folder."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Train a model short, evaluate it at 1x..max-factor x the training length, write results."""
    from lengthgen.attention import ATTENTION
    from lengthgen.attention.positions import get_position_scheme
    from lengthgen.harness.run import execute, resolve_device, safe_name
    from lengthgen.model import ModelConfig
    from lengthgen.presets import build_run_config
    from lengthgen.sweep import parse_overrides
    from lengthgen.tasks import get_task

    with user_errors():
        task = get_task(task_name, **parse_params(param))
        backend_cls = ATTENTION.get(attn)
        get_position_scheme(pos)
        try:
            sets = parse_overrides(override)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        options = backend_cls.Options(**parse_params(attn_option)).model_dump()
        config = build_run_config(
            task.name if ":" not in task_name else task_name, attn, pos=pos, preset=preset, seed=seed,
            task_params=parse_params(param), attn_options=options,
            train_overrides={**sets.get("train", {}), "steps": steps, "train_length": train_length,
                             "selection": selection.value if selection else None},
            eval_overrides={**sets.get("eval", {}), "max_factor": max_factor, "samples": eval_samples,
                            "min_samples": min(eval_samples, 16) if eval_samples else None},
            arch_overrides=sets.get("arch"),
        )
        if config.train.train_length < task.min_length:
            raise UsageError(f"train length {config.train.train_length} is under the minimum of task "
                             f"{task.name!r} ({task.min_length})")
        ModelConfig(vocab_size=task.vocab.size, attn=attn, attn_options=options, pos=pos,
                    **config.arch.model_dump())
        try:
            resolve_device(device.value)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    typer.echo(f"run {safe_name(config.run_id())}: {config.task} / {config.attn} ({config.pos}), preset "
               f"{config.preset}, L={config.train.train_length}, {config.train.steps} steps, "
               f"eval up to {config.eval.max_factor}x", err=True)
    frame = execute(config, out, device_name=device.value, progress=not quiet)
    typer.echo(format_table(frame))
    run_dir = f"{out}/{frame['run_id'].iloc[0]}"
    typer.echo(f"results: {run_dir}/results.parquet")
    if (frame["status"] != "ok").any():
        typer.echo(f"error: run failed: {frame['error'].iloc[0]} (details in {run_dir}/error.txt)", err=True)
        raise typer.Exit(code=1)


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                  file: Any = None, line: str | None = None) -> None:
    """Plugin warnings are for users, not developers: one ``warning: ...`` line, no source location."""
    from lengthgen.registry import PluginWarning

    if issubclass(category, PluginWarning):
        typer.echo(f"warning: {message}", err=True)
    else:
        _default_show_warning(message, category, filename, lineno, file, line)


_default_show_warning = warnings.showwarning


class Launcher(str, Enum):
    local = "local"
    ray = "ray"


@app.command("sweep")
def sweep_command(
    tasks: str = typer.Option(..., "--task", help="Comma-separated task names (see `lengthgen tasks`)."),
    attns: str = typer.Option(..., "--attn", help="Comma-separated backends (see `lengthgen attns`)."),
    positions: str = typer.Option("nape", "--pos", help="Comma-separated position schemes."),
    seeds: str = typer.Option("0", "--seeds", help="Seeds: 0,1,2 or a range 0-4."),
    preset: str = typer.Option("quick", "--preset", help="quick (CPU minutes) or paper."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (overrides the preset)."),
    max_factor: int | None = typer.Option(None, "--max-factor", help="Evaluate up to L·this (power of 2)."),
    eval_samples: int | None = typer.Option(None, "--eval-samples", help="Samples per length (the most)."),
    train_length: int | None = typer.Option(None, "--train-length", help="Longest training length L."),
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (all tasks)."),
    override: list[str] = typer.Option(None, "--set", help="Config field, e.g. train.lr=5e-4 (repeatable)."),
    out: str = typer.Option(..., "--out", help="Sweep folder: DIR/data (results), DIR/runs (artifacts)."),
    launcher: Launcher = typer.Option(Launcher.local, "--launcher", help="local or ray."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to join (else local)."),
    jobs: int | None = typer.Option(None, "--jobs", help="Runs at once (local: processes; ray: CPU share)."),
    device: Device = typer.Option(Device.auto, "--device"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Redo runs recorded as failed."),
    shard: str | None = typer.Option(None, "--shard", help="I/N: every N-th run from the I-th (0-based)."),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
) -> None:
    """Run a grid of runs into a crash-safe results dataset; re-run the same command to resume."""
    from lengthgen import sweep as sw
    from lengthgen.harness.run import resolve_device

    with user_errors():
        try:
            spec = sw.SweepSpec(
                tasks=sw.parse_list(tasks, "task"), attns=sw.parse_list(attns, "attention backend"),
                positions=sw.parse_list(positions, "position scheme"), seeds=sw.parse_seeds(seeds),
                preset=preset, steps=steps, max_factor=max_factor, eval_samples=eval_samples,
                train_length=train_length, task_params=parse_params(param),
                overrides=sw.parse_overrides(override),
            )
            if jobs is not None and jobs < 1:
                raise ValueError("--jobs must be at least 1")
            if ray_address and launcher is not Launcher.ray:
                raise ValueError("--ray-address needs --launcher ray")
            configs = sw.validate_spec(spec)
            if shard is not None:
                configs = sw.shard_of(configs, shard)
            if launcher is Launcher.ray:
                try:
                    import ray  # noqa: F401
                except ImportError:
                    raise ValueError("--launcher ray needs Ray: pip install 'lengthgen[ray]'") from None
            else:
                resolve_device(device.value)
        except ValidationError:
            raise
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    typer.echo(f"sweep: {len(configs)} runs ({len(spec.tasks)} tasks x {len(spec.attns)} backends x "
               f"{len(spec.positions)} position schemes x {len(spec.seeds)} seeds"
               f"{f', shard {shard}' if shard else ''}), preset {preset}, launcher {launcher.value} -> {out}",
               err=True)
    report = sw.SweepReport(len(configs), 0, 0)
    try:
        with sw.sigterm_stops_cleanly():
            sw.run_sweep(configs, out, launcher=launcher.value, device=device.value, jobs=jobs,
                         ray_address=ray_address, retry_failed=retry_failed, progress=not quiet,
                         report=report)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM
        report.interrupted = True
        for line in sw.summarize(report, out):
            typer.echo(line, err=True)
        raise typer.Exit(code=143 if isinstance(stop, sw.SweepTerminated) else 130) from None
    for line in sw.summarize(report, out):
        typer.echo(line, err=True)


@app.command("leaderboard")
def leaderboard_command(
    results: str = typer.Argument(..., help="Sweep folder (its data/ is read) or results folder/file."),
    out: str = typer.Option(..., "--out", help="Folder for README.md, leaderboard.csv/.html and plots/."),
    title: str = typer.Option("lengthgen leaderboard", "--title"),
    hardware: str | None = typer.Option(None, "--hardware", help="Hardware note for the README."),
    commit: str | None = typer.Option(
        None, "--commit", envvar="LENGTHGEN_COMMIT",
        help="Commit the page names (default: the last git commit that touched the data)."),
) -> None:
    """Tables (mean and 95% CI over seeds, learned seeds, selected settings, paper rows) and plots."""
    from lengthgen.leaderboard import load_rows, write_leaderboard

    with user_errors():
        rows = load_rows(results)
        if rows.empty:
            raise UsageError(f"no results under {results!r} (expected DIR/data/*.parquet from a sweep)")
    for path in write_leaderboard(rows, out, title=title, source=results, hardware=hardware, commit=commit):
        typer.echo(str(path))


class PlotKind(str, Enum):
    exact = "exact"
    dispersion = "dispersion"


@app.command("plot")
def plot_command(
    results: str = typer.Argument(..., help="Sweep folder (its data/ is read) or results folder/file."),
    task_name: str = typer.Option(..., "--task", help="Task to plot."),
    output: str = typer.Option(..., "-o", "--output", help="Figure to write: .svg or .png (200 dpi)."),
    kind: PlotKind = typer.Option(PlotKind.exact, "--kind",
                                  help="exact: exact match vs length; dispersion: entropy and support."),
) -> None:
    """One figure for one task, as on the leaderboard: exact match vs length, or attention entropy/support."""
    from pathlib import Path

    from lengthgen.leaderboard import load_rows, plot_dispersion, plot_exact_match

    with user_errors():
        suffix = Path(output).suffix.lower()
        if suffix not in (".svg", ".png"):
            raise UsageError(f"bad --output {output!r}: the file name must end in .svg or .png")
        rows = load_rows(results)
        tasks = sorted(rows.loc[rows["status"] == "ok", "task"].dropna().unique())
        if task_name not in tasks:
            raise UsageError(f"no ok results for task {task_name!r} under {results!r}; "
                             f"tasks with results: {', '.join(tasks) or '(none)'}")
    draw = plot_exact_match if kind is PlotKind.exact else plot_dispersion
    typer.echo(str(draw(rows, task_name, output)))


def main() -> None:
    warnings.showwarning = _show_warning
    app()


if __name__ == "__main__":
    main()
