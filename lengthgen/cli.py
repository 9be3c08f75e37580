"""``lengthgen`` command line.

Every user mistake (unknown name, bad value, impossible combination, a folder that cannot be
written) ends with exit code 2 and a one-line ``error: ...`` that names the valid choices; never
a traceback. The conversion happens in one place, :class:`OneLineErrors`, for the library's
:class:`~lengthgen.errors.UserError`, pydantic's validation errors, click's usage errors and
file-system errors alike.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Literal

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from lengthgen.console import capture_warnings, one_line, safe_streams
from lengthgen.errors import UserError
from lengthgen.files import new_folder
from lengthgen.paths import file_for_writing, folder_for_writing, input_path, shown
from lengthgen.presets import PRESETS

try:  # recent typer runs on its own copy of click: its exceptions are the ones raised here
    from typer import _click as click
except ImportError:  # older typer uses click itself
    import click  # type: ignore[no-redef]


class _NeverRaised(Exception):
    pass


#: click ≥ 8.2 shows the help of a bare command through this exception
_NoArgsIsHelp: type[Exception] = getattr(click.exceptions, "NoArgsIsHelpError", _NeverRaised)


def error_message(exc: BaseException) -> str | None:
    """The one-line message for an exception a user can act on (None: a bug, let it surface)."""
    from lengthgen.config import validation_message

    if isinstance(exc, UserError):
        return str(exc)
    if isinstance(exc, ValidationError):
        return validation_message(exc, "invalid parameters")
    if isinstance(exc, click.ClickException):
        return exc.format_message().replace("Value error, ", "")
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if exc.filename else ""
        return f"{exc.strerror or type(exc).__name__}{where}"
    return None


class OneLineErrors(TyperGroup):
    """The one place that turns user errors into ``error: <one line>`` and exit code 2."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        try:
            result = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                  standalone_mode=False, **extra)
            code = result if isinstance(result, int) else 0
        except _NoArgsIsHelp as exc:  # bare `lengthgen`: the help text
            exc.show()
            code = exc.exit_code
        except typer.Abort:
            typer.echo("aborted", err=True)
            code = 1
        except (UserError, ValidationError, click.ClickException, OSError) as exc:
            typer.echo(f"error: {one_line(error_message(exc) or exc)}", err=True)
            code = exc.exit_code if isinstance(exc, click.ClickException) else 2
        except UnicodeError as exc:  # text that is not UTF-8 where no reader named the file
            typer.echo(f"error: text that is not valid UTF-8 ({exc.reason}); save files as UTF-8", err=True)
            code = 2
        if not standalone_mode:
            return code
        sys.exit(code)



#: The options that take one of a few words (click checks them and lists them in the help).
SampleFormat = Literal["jsonl", "text"]
Device = Literal["auto", "cpu", "cuda"]
Selection = Literal["id", "8x"]
Log = Literal["tensorboard", "wandb"]
Launcher = Literal["local", "ray"]
PlotKind = Literal["exact", "dispersion"]

PRESET_HELP = ", ".join(f"{name} ({purpose})" for name, purpose in PRESETS.items()) + "."

app = typer.Typer(
    cls=OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Length-generalization benchmark for attention: train short, evaluate up to 1024x longer.",
)


@app.command("tasks")
def tasks_command(
    describe: str | None = typer.Option(None, "--describe", help="Show one task in detail."),
) -> None:
    """List the registered tasks, or describe one (parameters, defaults, vocabulary, example)."""
    from lengthgen.tasks import TASKS, get_task, new_task_params

    if describe is None:
        entries = list(TASKS.entries())
        width = max((len(e.name) for e in entries), default=4)
        for entry in entries:
            typer.echo(f"{entry.name:<{width}}  {entry.obj.description}")
        for name, error in sorted(TASKS.broken.items()):
            typer.echo(f"{name:<{width}}  [broken plugin] {error}")
        return
    task = get_task(describe, **new_task_params(describe, {}))
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
    fmt: SampleFormat = typer.Option("jsonl", "--format"),
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (repeatable)."),
) -> None:
    """Print samples: JSON lines (structured source/target and the exact model view) or text."""
    from lengthgen.config import parse_assignments
    from lengthgen.tasks import get_task, new_task_params

    task = get_task(task_name, **new_task_params(task_name, parse_assignments(param, "--param")))
    batch = task.sample(n, length, seed=seed, split=split)
    out = sys.stdout
    for i in range(len(batch)):
        ids = batch.input_ids[i]
        if fmt == "jsonl":
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


TRUST_HELP = "Import plugin files (file.py:Class) that recorded configs name: only for folders you trust."
LOG_HELP = "Stream learning curves and per-length results to tensorboard or wandb (extra: track)."


@app.command("attns")
def attns_command() -> None:
    """List the attention backends (a plugin's with its package and version) and the position schemes."""
    from lengthgen.attention import ATTENTION
    from lengthgen.attention.positions import POSITION_SCHEMES
    from lengthgen.provenance import package_of

    entries = list(ATTENTION.entries())
    width = max([len(e.name) for e in entries] + [len(n) for n in POSITION_SCHEMES])
    typer.echo("attention backends (--attn):")
    for entry in entries:
        package = None if entry.builtin else package_of(entry.obj)
        typer.echo(f"  {entry.name:<{width}}  {entry.obj.description}" + (f" [{package}]" if package else ""))
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


def _check_run_environment(device: Device | None, log: Log | None) -> None:
    """The device (None: checked where the runs execute) and the tracker's package."""
    from lengthgen.harness.run import resolve_device
    from lengthgen.harness.tracking import check_tracker

    if device is not None:
        resolve_device(device)
    check_tracker(log)


@app.command("run")
def run_command(
    task_name: str = typer.Option(..., "--task", help="Task name (see `lengthgen tasks`)."),
    attn: str = typer.Option(..., "--attn", help="Backend name (see `lengthgen attns`) or file.py:Class."),
    pos: str = typer.Option("nape", "--pos", help="Position scheme: nape, alibi, rope, nope."),
    preset: str = typer.Option("quick", "--preset", help=PRESET_HELP),
    train_length: int | None = typer.Option(None, "--train-length", help="Longest training length L."),
    max_factor: int | None = typer.Option(None, "--max-factor", help="Evaluate up to L·this (power of 2)."),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (overrides the preset)."),
    seed: int = typer.Option(0, "--seed"),
    device: Device = typer.Option("auto", "--device"),
    eval_samples: int | None = typer.Option(None, "--eval-samples", help="Samples per length (the most)."),
    selection: Selection | None = typer.Option(None, "--selection", help="Checkpoint selection: id or 8x."),
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (repeatable)."),
    attn_option: list[str] = typer.Option(None, "--attn-option", help="Backend option key=value."),
    override: list[str] = typer.Option(
        None, "--set", help="Any config field SECTION.FIELD=VALUE, e.g. train.lr=5e-4 (repeatable)."
    ),
    out: str = typer.Option("runs", "--out", help="Folder that receives the run folder."),
    log: Log | None = typer.Option(None, "--log", help=LOG_HELP),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Train a model short, evaluate it at 1x..max-factor x the training length, write results."""
    from lengthgen.config import build_run_config, combine_overrides, flag_overrides, parse_assignments
    from lengthgen.harness.identity import run_key
    from lengthgen.harness.run import execute

    flags = flag_overrides(steps=steps, max_factor=max_factor, train_length=train_length,
                           eval_samples=eval_samples, selection=selection)
    config = build_run_config(
        task_name, attn, pos=pos, preset=preset, seed=seed,
        task_params=parse_assignments(param, "--param"),
        attn_options=parse_assignments(attn_option, "--attn-option"),
        overrides=combine_overrides(flags, parse_assignments(override, "--set")),
    )
    _check_run_environment(device, log)
    out_dir = folder_for_writing(out, "--out")
    typer.echo(f"run {run_key(config)}: {config.task} / {config.attn} ({config.pos}), preset "
               f"{config.preset}, L={config.train.train_length}, {config.train.steps} steps, "
               f"eval up to {config.eval.max_factor}x", err=True)
    frame = execute(config, out_dir, device_name=device, progress=not quiet,
                    log=log)
    typer.echo(format_table(frame))
    run_dir = out_dir / str(frame["run_id"].iloc[0])
    if (frame["status"] != "ok").any():
        typer.echo(f"results: {shown(run_dir / 'results.parquet')}")
        typer.echo(f"error: run failed: {frame['error'].iloc[0]} (details in {shown(run_dir / 'error.txt')})",
                   err=True)
        raise typer.Exit(code=1)
    for line in closing_lines(run_dir, config.eval.max_factor, log):
        typer.echo(line)


def closing_lines(run_dir: Path, max_factor: int, log: str | None) -> list[str]:
    """What a finished run says last: where its results and figure are, what two of its columns
    mean, and the natural next commands."""
    folder = shown(run_dir)
    lines = [f"results: {shown(run_dir / 'results.parquet')}",
             f"figure: {shown(run_dir / 'accuracy_vs_length.png')} (exact match against length)",
             "entropy: how spread each attention row is (0: one key, 1: uniform over the keys it sees); "
             "support: how many keys get weight > 0",]
    if log == "tensorboard":
        lines.append(f"tensorboard: {folder}/tensorboard/ (tensorboard --logdir {shown(run_dir.parent)})")
    lines.append(f"next: lengthgen eval {folder} --max-factor {2 * max_factor}   (longer lengths), "
                 f"lengthgen heads {folder} --factor 2   (what its heads look at)")
    return lines


@app.command("eval")
def eval_command(
    path: str = typer.Argument(..., help="A run folder (with model.pt and config.json) or a sweep folder."),
    max_factor: int | None = typer.Option(None, "--max-factor", help="Evaluate up to L·this (power of 2)."),
    min_factor: int | None = typer.Option(None, "--min-factor",
                                          help="Evaluate from L·this on (power of 2; default 1)."),
    eval_samples: int | None = typer.Option(None, "--eval-samples", help="Samples per length (the most)."),
    param: list[str] = typer.Option(None, "--param",
                                    help="Evaluate on a task variant: task parameter key=value."),
    attn: str | None = typer.Option(
        None, "--attn", help="Evaluate the same weights with another backend (its parameters must match)."),
    attn_option: list[str] = typer.Option(None, "--attn-option",
                                          help="Evaluate with this backend option key=value."),
    redo: bool = typer.Option(False, "--redo", help="Re-evaluate lengths the results already hold."),
    restore: bool = typer.Option(
        False, "--restore", help="First train runs whose sweep data records them but whose model.pt is gone "
        "again, kept only if they reproduce their recorded rows."),
    device: Device = typer.Option("auto", "--device"),
    log: Log | None = typer.Option(None, "--log", help=LOG_HELP),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    trust_plugins: bool = typer.Option(False, "--trust-plugins", help=TRUST_HELP),
) -> None:
    """Evaluate saved models at more lengths, on a task variant or with another backend; add the rows
    to their results."""
    from lengthgen.config import parse_assignments
    from lengthgen.harness.reevaluate import plan_runs
    from lengthgen.harness.restore import models_to_restore, restore_run
    from lengthgen.registry import trusted_plugins
    from lengthgen.sweeps import SweepTerminated, sigterm_stops_cleanly

    params = parse_assignments(param, "--param")
    options = parse_assignments(attn_option, "--attn-option")
    with trusted_plugins([attn], everything=trust_plugins):
        if restore:
            _check_run_environment(device, log)
        for run_dir, data in models_to_restore(input_path(path, "PATH")) if restore else []:
            typer.echo(f"restore {run_dir.name}: training it again from its recorded config", err=True)
            warning = restore_run(run_dir, data)
            typer.echo(f"restore {run_dir.name}: its recorded rows reproduce"
                       + (f" within the tolerance ({warning})" if warning else " exactly"), err=True)
        plans = plan_runs(input_path(path, "PATH"), max_factor=max_factor, eval_samples=eval_samples,
                          task_params=params, attn=attn, attn_options=options, min_factor=min_factor)
        _check_run_environment(device, log)
        failed = 0
        try:
            with sigterm_stops_cleanly():
                for plan in plans:
                    failed += _evaluate_one(plan, redo, device, log, quiet)
        except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM: the lengths done are saved
            typer.echo("interrupted: the rows of the lengths evaluated so far are saved; run the same "
                       "command again to evaluate the rest", err=True)
            raise typer.Exit(code=143 if isinstance(stop, SweepTerminated) else 130) from None
    if failed:
        raise typer.Exit(code=1)


def _evaluate_one(plan: Any, redo: bool, device: Device, log: Log | None, quiet: bool) -> int:
    """Evaluate one planned run, print its rows; 1 when its evaluation stopped on an error."""
    from lengthgen.harness.reevaluate import run_evaluation

    todo = plan.factors if redo else plan.missing_factors
    label = f" [{plan.variant}]" if plan.variant else ""
    typer.echo(f"eval {plan.run.run_id}{label}: {len(todo)} of {len(plan.factors)} lengths to evaluate "
               f"({plan.factors[0]}x to {plan.config.eval.max_factor}x)", err=True)
    outcome = run_evaluation(plan, todo, device_name=device, progress=not quiet,
                             log=log)
    if not outcome.rows.empty:
        typer.echo(format_table(outcome.rows))
    for written in outcome.written:
        typer.echo(f"results: {shown(written)}")
    if outcome.error:
        typer.echo(f"error: evaluation of {plan.run.run_id} stopped: {outcome.error}", err=True)
        return 1
    return 0


@app.command("sweep")
def sweep_command(
    tasks: str | None = typer.Option(None, "--task", help="Comma-separated tasks (see `lengthgen tasks`)."),
    attns: str | None = typer.Option(None, "--attn", help="Comma-separated backends (`lengthgen attns`)."),
    positions: str | None = typer.Option(None, "--pos", help=r"Position schemes \[default: nape]."),
    seeds: str | None = typer.Option(None, "--seeds", help=r"Seeds: 0,1,2 or a range 0-4 \[default: 0]."),
    preset: str | None = typer.Option(None, "--preset", help=PRESET_HELP + r" \[default: quick]"),
    steps: int | None = typer.Option(None, "--steps", help="Training steps (overrides the preset)."),
    max_factor: int | None = typer.Option(None, "--max-factor", help="Evaluate up to L·this (power of 2)."),
    eval_samples: int | None = typer.Option(None, "--eval-samples", help="Samples per length (the most)."),
    train_length: int | None = typer.Option(None, "--train-length", help="Longest training length L."),
    selection: Selection | None = typer.Option(None, "--selection", help="Checkpoint selection: id or 8x."),
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (all tasks)."),
    attn_option: list[str] = typer.Option(
        None, "--attn-option", help="Backend option key=value for every backend of the sweep (repeatable)."),
    override: list[str] = typer.Option(
        None, "--set",
        help="Config field, e.g. train.lr=5e-4 (repeatable); several values make a grid: train.lr=1e-3,2e-3",
    ),
    out: str = typer.Option(..., "--out", help="Sweep folder: DIR/data (results), DIR/runs (artifacts)."),
    launcher: Launcher = typer.Option("local", "--launcher", help="local or ray."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster to join (else local)."),
    jobs: int | None = typer.Option(None, "--jobs", help="Runs at once (local: processes; ray: CPU share)."),
    device: Device = typer.Option("auto", "--device"),
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Redo runs recorded as failed."),
    shard: str | None = typer.Option(None, "--shard", help="I/N: every N-th run from the I-th (0-based)."),
    log: Log | None = typer.Option(None, "--log", help=LOG_HELP),
    quiet: bool = typer.Option(False, "--quiet", help="No progress output (bar, or lines in a log)."),
    plan_file: str | None = typer.Option(
        None, "--plan", help="A leaderboard plan (TOML): run exactly the runs it still misses."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List missing runs, CPU time; run nothing."),
) -> None:
    """Run a grid of runs into a crash-safe results dataset; re-run the same command to resume."""
    from lengthgen import sweeps as sw
    from lengthgen.config import parse_assignments

    sw.check_jobs(jobs)
    if plan_file is not None:
        given = [flag for flag, value in (
            ("--task", tasks), ("--attn", attns), ("--pos", positions), ("--seeds", seeds),
            ("--preset", preset),
            ("--steps", steps), ("--max-factor", max_factor), ("--eval-samples", eval_samples),
            ("--train-length", train_length), ("--selection", selection), ("--param", param),
            ("--attn-option", attn_option), ("--set", override), ("--shard", shard), ("--log", log),
            ("--ray-address", ray_address)) if value]
        if given or launcher != "local":
            flags = ", ".join(given + ([] if launcher == "local" else ["--launcher"]))
            raise UserError(f"--plan sets the grid itself; drop {flags} (the plan file holds every setting; "
                            "with --plan: --out, --jobs, --device, --retry-failed, --dry-run, --quiet)")
        _run_plan(plan_file, out, jobs or 1, device, retry_failed, dry_run, quiet)
        return
    if not tasks or not attns:
        raise UserError("sweep needs --task and --attn (or --plan FILE)")
    shared, grid = sw.split_settings(parse_assignments(override, "--set", parse=sw.parse_choices))
    preset = preset or "quick"
    spec = sw.SweepSpec(
        tasks=sw.parse_list(tasks, "task"), attns=sw.parse_list(attns, "attention backend"),
        positions=sw.parse_list(positions or "nape", "position scheme"), seeds=sw.parse_seeds(seeds or "0"),
        preset=preset, steps=steps, max_factor=max_factor, eval_samples=eval_samples,
        train_length=train_length, selection=selection,
        task_params=parse_assignments(param, "--param"), overrides=shared, grid=grid,
        attn_options=parse_assignments(attn_option, "--attn-option"),
    )
    if ray_address and launcher != "ray":
        raise UserError("--ray-address needs --launcher ray")
    configs = sw.validate_spec(spec)
    if shard is not None:
        configs = sw.shard_of(configs, shard)
    if dry_run:
        _list_missing_runs(configs, out, retry_failed)
        return
    if launcher == "ray":
        try:
            import ray  # noqa: F401
        except ImportError:
            raise UserError("--launcher ray needs Ray: pip install 'lengthgen[ray]'") from None
    _check_run_environment(device if launcher == "local" else None, log)
    out_dir = folder_for_writing(out, "--out")
    settings = f"{len(spec.points())} settings x " if spec.grid else ""
    typer.echo(f"sweep: {len(configs)} runs ({len(spec.tasks)} tasks x {len(spec.attns)} backends x "
               f"{len(spec.positions)} position schemes x {settings}{len(spec.seeds)} seeds"
               f"{f', shard {shard}' if shard else ''}), preset {preset}, launcher {launcher} -> {out}",
               err=True)
    report = sw.SweepReport(len(configs), 0, 0)
    try:
        with sw.sigterm_stops_cleanly():
            sw.run_sweep(configs, out_dir, launcher=launcher, device=device, jobs=jobs,
                         ray_address=ray_address, retry_failed=retry_failed, progress=not quiet,
                         report=report, log=log)
    except KeyboardInterrupt as stop:  # Ctrl-C, or SIGTERM
        report.interrupted = True
        for line in sw.summarize(report, out):
            typer.echo(line, err=True)
        raise typer.Exit(code=143 if isinstance(stop, sw.SweepTerminated) else 130) from None
    for line in sw.summarize(report, out):
        typer.echo(line, err=True)


def _list_missing_runs(configs: Any, out: str, retry_failed: bool) -> None:
    """``--dry-run`` of a plain sweep: each missing run with its estimated CPU time."""
    from lengthgen.plans import listing
    from lengthgen.plans.estimate import Timings

    for line in listing.missing_run_lines(configs, out, Timings.from_folders(Path(out)), retry_failed):
        typer.echo(line)


def _run_plan(plan_file: str, out: str, jobs: int, device: Device, retry_failed: bool, dry_run: bool,
              quiet: bool) -> None:
    from lengthgen import sweeps as sw
    from lengthgen.plans import execute, listing
    from lengthgen.plans.estimate import Timings
    from lengthgen.plans.numerics import pin_numerics
    from lengthgen.plans.plan import ablations_dir, load_plan, survey

    plan = load_plan(plan_file)
    if dry_run:
        states = survey(plan, out, retry_failed=retry_failed)
        timings = Timings.from_folders(Path(out), ablations_dir(plan, plan_file, out))
        for line in listing.dry_run_lines(states, timings):
            typer.echo(line)
        return
    pinned = pin_numerics(plan.numerics)  # before torch loads (the device check loads it)
    if pinned:
        typer.echo(pinned, err=True)
    _check_run_environment(device, None)
    out_dir = folder_for_writing(out, "--out")
    typer.echo(f"plan {plan_file}: {len(plan.sweep)} sweeps -> {out}", err=True)
    report = execute.PlanReport()
    echo = (lambda line: None) if quiet else (lambda line: typer.echo(line, err=True))
    try:
        with sw.sigterm_stops_cleanly(), new_folder(sw.data_dir(out_dir)):
            execute.run_plan(plan, out_dir, jobs=jobs, device=device, retry_failed=retry_failed,
                             echo=echo, progress=not quiet, report=report)
    except KeyboardInterrupt as stop:
        typer.echo(f"interrupted: {report.remaining} pieces of work left; run the same command again "
                   "to resume", err=True)
        raise typer.Exit(code=143 if isinstance(stop, sw.SweepTerminated) else 130) from None
    for line in execute.summary_lines(report, out):
        typer.echo(line, err=True)


def _load_rows(results: str) -> Any:
    """Result rows under ``results``; a path without any usable results file is a user error."""
    from lengthgen.harness.results import load_results

    rows = load_results(input_path(results, "RESULTS"))
    if rows.empty:
        raise UserError(f"no usable results under {results!r} (expected DIR/data/*.parquet from a sweep, "
                        "or results.parquet files)")
    return rows


@app.command("leaderboard")
def leaderboard_command(
    folders: list[str] = typer.Argument(..., help="Sweep folder (its data/ is read) or results folder/file; "
                                                  "more folders are submissions, each labelled with its "
                                                  "source (source.toml, SOURCE.md or its name)."),
    out: str = typer.Option(..., "--out", help="Folder for README.md, leaderboard.csv/.html and plots/."),
    title: str | None = typer.Option(None, "--title", help=r"Page title \[default: lengthgen leaderboard]."),
    hardware: str | None = typer.Option(None, "--hardware", help="Hardware note for the README."),
    commit: str | None = typer.Option(
        None, "--commit", envvar="LENGTHGEN_COMMIT",
        help="Commit the page names (default: the last git commit that touched the data)."),
    ablations: str | None = typer.Option(
        None, "--ablations", help="Folder of ablation sweeps (each with ABOUT.md) to publish as "
                                  "'What changes the result'."),
    plan_file: str | None = typer.Option(
        None, "--plan", help="The board's plan (TOML): show exactly its runs; title, hardware and "
                             "ablations come from it."),
    latex: bool = typer.Option(False, "--latex", help="Also write latex/TASK.tex (booktabs) and the "
                                                      "figures as PDF, for papers."),
) -> None:
    """Tables (mean and 95% CI over seeds, learned seeds, selected settings, paper rows) and plots."""
    from lengthgen.leaderboard import DEFAULT_TITLE, write_leaderboard
    from lengthgen.leaderboard.ablations import load_ablations
    from lengthgen.leaderboard.reasons import check_reasons
    from lengthgen.leaderboard.sources import load_sources

    out_dir = folder_for_writing(out, "--out")
    results = folders[0]
    if len(folders) > 1 and plan_file is not None:
        raise UserError("--plan builds one board from its own folder; merge submissions without --plan")
    for folder in folders:
        input_path(folder, "RESULTS")
    rows, sources = load_sources(folders)
    if rows.empty:
        raise UserError(f"no usable results under {', '.join(map(repr, folders))} (expected "
                        "DIR/data/*.parquet from a sweep, or results.parquet files)")
    budget = None
    if plan_file is not None:
        from lengthgen.plans.board import plan_board

        given = [flag for flag, value in (("--title", title), ("--hardware", hardware),
                                          ("--ablations", ablations)) if value is not None]
        if given:
            raise UserError(f"--plan sets {', '.join(given)} itself; drop it (edit the plan file instead)")
        board = plan_board(plan_file, results, rows)
        rows, title, hardware, ablations = board.rows, board.title, board.hardware, board.ablations
        rule, reasons, numerics, screening = board.rule, board.reasons, board.numerics, board.screening
        budget = board.budget
    else:
        rule, reasons, numerics, screening = None, None, None, None
    if ablations is not None:  # checked before anything is written
        check_reasons(reasons or [], load_ablations(input_path(ablations, "--ablations")))
    written = write_leaderboard(rows, out_dir, title=title or DEFAULT_TITLE, source=results,
                                hardware=hardware, commit=commit, ablations=ablations, plan=plan_file,
                                plan_rule=rule, latex=latex, sources=sources, reasons=reasons,
                                numerics=numerics, screening=screening, budget=budget)
    for path in written:
        typer.echo(str(path))


@app.command("plot")
def plot_command(
    results: str = typer.Argument(..., help="Sweep folder (its data/ is read) or results folder/file."),
    task_name: str = typer.Option(..., "--task", help="Task to plot."),
    output: str = typer.Option(..., "-o", "--output", help="Figure to write: .svg or .png (200 dpi)."),
    kind: PlotKind = typer.Option("exact", "--kind",
                                  help="exact: exact match vs length; dispersion: entropy and support."),
) -> None:
    """One figure for one task, as on the leaderboard: exact match vs length, or attention entropy
    and support."""
    from lengthgen.leaderboard import plot_dispersion, plot_exact_match

    target = file_for_writing(output, "-o")
    if target.suffix.lower() not in (".svg", ".png"):
        raise UserError(f"bad -o {output!r}: the file name must end in .svg or .png")
    rows = _load_rows(results)
    tasks = sorted(rows.loc[rows["status"] == "ok", "task"].dropna().unique())
    if task_name not in tasks:
        raise UserError(f"no ok results for task {task_name!r} under {results!r}; "
                        f"tasks with results: {', '.join(tasks) or '(none)'}")
    draw = plot_exact_match if kind == "exact" else plot_dispersion
    with new_folder(target.parent):
        typer.echo(str(draw(rows, task_name, target)))

@app.command("verify")
def verify_command(
    path: str = typer.Argument(..., help="A run folder, sweep folder (its data/) or results file."),
    sample: int | None = typer.Option(None, "--sample", help="Re-derive this many runs, drawn at random "
                                                              r"with --seed \[default: all]."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler."),
    device: Device = typer.Option("cpu", "--device"),
    report_file: str = typer.Option(
        "verify.json", "--report", help="The report to write (merged into it when it exists); a board "
                                        r"cites DIR/verify.json beside its data \[default: ./verify.json]."),
    trust_plugins: bool = typer.Option(False, "--trust-plugins", help=TRUST_HELP),
) -> None:
    """Retrain runs from their recorded configs and compare every row; exit 1 on any difference."""
    from lengthgen.harness import verify
    from lengthgen.registry import trusted_plugins

    if sample is not None and sample < 1:
        raise UserError(f"--sample must be at least 1, got {sample}")
    report = file_for_writing(report_file, "--report")
    verify.check_report(report)
    runs, unusable = verify.runs_to_verify(input_path(path, "PATH"))
    _check_run_environment(device, None)
    typer.echo(f"verify: re-deriving {min(sample or len(runs), len(runs))} of {len(runs)} runs under {path}"
               + (f" ({len(unusable)} with unusable rows: not verified)" if unusable else ""), err=True)
    with trusted_plugins(everything=trust_plugins):
        checks = verify.verify(path, sample=sample, seed=seed, device=device, echo=typer.echo, report=report)
    bad = [c for c in checks if not c.ok]
    typer.echo(f"verify: {len(checks) - len(bad)} of {len(checks)} runs re-derived identically; "
               f"report: {report}", err=True)
    if bad:
        raise typer.Exit(code=1)


@app.command("positions")
def positions_command(
    path: str = typer.Argument(..., help="A run folder (with model.pt and config.json)."),
    factor: int = typer.Option(2, "--factor", help="Test at the training length times this."),
    samples: int = typer.Option(64, "--samples", help="Test samples (the evaluation's test set)."),
    bins: int = typer.Option(8, "--bins", help="Ranges of answer positions to report."),
    param: list[str] = typer.Option(None, "--param", help="Test on a task variant: task parameter key=value"),
    device: Device = typer.Option("auto", "--device"),
    trust_plugins: bool = typer.Option(False, "--trust-plugins", help=TRUST_HELP),
) -> None:
    """Accuracy by answer position at one length: does a model fail everywhere, or only past the
    positions training reached?"""
    from lengthgen.config import parse_assignments
    from lengthgen.harness.positions import profile_run
    from lengthgen.registry import trusted_plugins

    if bins < 1:
        raise UserError(f"--bins must be at least 1, got {bins}")
    params = parse_assignments(param, "--param")
    with trusted_plugins(everything=trust_plugins):
        profile = profile_run(input_path(path, "PATH"), factor, samples, device, params)
    typer.echo(f"{profile.run_id}{_variant_mark(params)} at {profile.factor}x (length {profile.length}, "
               f"{samples} test samples); "
               f"training scored answer positions 1-{profile.trained_positions}")
    typer.echo(f"{'answer positions':>18} {'accuracy':>9}")
    for first, last, accuracy in profile.accuracy.bins(bins):
        mark = "  (beyond training)" if first > profile.trained_positions else ""
        label = f"{first}" if first == last else f"{first}-{last}"
        typer.echo(f"{label:>18} {100 * accuracy:>8.1f}%{mark}")


@app.command("heads")
def heads_command(
    path: str = typer.Argument(..., help="A run folder (with model.pt and config.json)."),
    factor: int = typer.Option(2, "--factor", help="Test at the training length times this."),
    samples: int = typer.Option(32, "--samples", help="Test samples (the evaluation's test set)."),
    param: list[str] = typer.Option(None, "--param", help="Test on a task variant: task parameter key=value"),
    device: Device = typer.Option("auto", "--device"),
    trust_plugins: bool = typer.Option(False, "--trust-plugins", help=TRUST_HELP),
) -> None:
    """Per attention head at one length: how concentrated it is, where it looks, and the token
    accuracy without it. Compare --factor 1 with a longer one to see which circuit breaks."""
    from lengthgen.config import parse_assignments
    from lengthgen.harness.heads import MASS, profile_run
    from lengthgen.registry import trusted_plugins

    params = parse_assignments(param, "--param")
    with trusted_plugins(everything=trust_plugins):
        report = profile_run(input_path(path, "PATH"), factor, samples, device, params)
    typer.echo(f"{report.run_id}{_variant_mark(params)} at {report.factor}x (length {report.length}, "
               f"{report.n_samples} test "
               f"samples): token accuracy {100 * report.accuracy:.1f}%")
    typer.echo(f"{'layer':>5} {'head':>4} {'position':>10} {f'keys for {MASS:.0%}':>13} {'top weight':>10} "
               f"{'top key distance':>22} {'accuracy without':>16}")
    for h in report.heads:
        where = f"{h.distance} ({100 * h.distance_share:.0f}% of rows)"
        typer.echo(f"{h.layer:>5} {h.head:>4} {h.position:>10} {h.keys_for_mass:>13.1f} "
                   f"{h.top_weight:>10.2f} {where:>22} {100 * h.accuracy_without:>15.1f}%")
    if any(h.roles for h in report.heads):
        typer.echo("what each head's most-weighted key is, over answer tokens the model gets right / wrong:")
        for h in report.heads:
            typer.echo(f"{h.layer:>5} {h.head:>4} {h.position:>10}  right: {_role_shares(h.roles, True)}"
                       f" | wrong: {_role_shares(h.roles, False)}")


def _variant_mark(params: dict[str, Any]) -> str:
    """' [near_misses=8]' after a run id when a command tests a task variant, as ``eval`` labels it."""
    from lengthgen.harness.reevaluate import variant_label

    return f" [{variant_label(params)}]" if params else ""


def _role_shares(roles: dict[tuple[bool, str], int], right: bool) -> str:
    """'matching pair 96%, other pair 4% (128 tokens)': the roles over one kind of answer token."""
    counts = sorted(((n, role) for (ok, role), n in roles.items() if ok == right),
                    key=lambda t: (-t[0], t[1]))
    total = sum(n for n, _ in counts)
    if not total:
        return "none"
    shares = [f"{role} {100 * n / total:.0f}%" for n, role in counts]
    return f"{', '.join(shares)} ({total} tokens)"


def main() -> None:
    """The ``lengthgen`` script: output that always encodes (ASCII where the terminal needs it),
    every warning as one line, shown once."""
    safe_streams()
    capture_warnings()
    app()


if __name__ == "__main__":
    main()
