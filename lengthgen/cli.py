"""``lengthgen`` command line: each command parses its flags, calls one function of the library
and prints what it returns (the wording of every line is in ``lengthgen.output``).

Every user mistake (unknown name, bad value, impossible combination, a folder that cannot be
written) ends with exit code 2 and a one-line ``error: ...`` that names the valid choices; never
a traceback. The conversion happens in one place, ``output.OneLineErrors``, the class of this
command group, for the library's :class:`~lengthgen.errors.UserError`, pydantic's validation
errors, click's usage errors and file-system errors alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Annotated, Any, Literal

import typer

from lengthgen import output
from lengthgen.choices import Device, Launcher, Precision, Selection, TrackerName
from lengthgen.console import capture_warnings, safe_streams
from lengthgen.errors import UserError
from lengthgen.files import new_folder
from lengthgen.paths import file_for_writing, folder_for_writing, input_path, shown
from lengthgen.presets import PRESETS

#: The options that take one of a few words (click checks them and lists them in the help); the
#: library's sets come from ``lengthgen.choices``, which the library checks Python callers against.
SampleFormat = Literal["jsonl", "text"]
PlotKind = Literal["exact", "dispersion"]

PRESET_HELP = ", ".join(f"{name} ({purpose})" for name, purpose in PRESETS.items()) + "."
#: Options several commands share, declared once.
Where = Annotated[Device, typer.Option("--device")]
Log = Annotated[TrackerName | None, typer.Option(
    "--log", help="Stream learning curves and per-length results to tensorboard or wandb (extra: track).")]
Trust = Annotated[bool, typer.Option(
    "--trust-plugins",
    help="Import plugin files (file.py:Class) that recorded configs name: only for folders you trust.")]
MaxFactor = Annotated[int | None, typer.Option("--max-factor", help="Evaluate up to L·this (power of 2).")]
EvalSamples = Annotated[int | None, typer.Option("--eval-samples", help="Samples per length (the most).")]
TrainLength = Annotated[int | None, typer.Option("--train-length", help="Longest training length L.")]
Steps = Annotated[int | None, typer.Option("--steps", help="Training steps (overrides the preset).")]
Selecting = Annotated[Selection | None, typer.Option("--selection", help="Checkpoint selection: id or 8x.")]
Variant = Annotated[list[str], typer.Option("--param",
                                            help="Test on a task variant: task parameter key=value")]
RunFolder = Annotated[str, typer.Argument(help="A run folder (with model.pt and config.json).")]
KeptStep = Annotated[int | None, typer.Option(
    "--checkpoint", min=1, help="Use the weights kept after this many steps (a run trained with "
    "train.keep_every) instead of the selected ones.")]

app = typer.Typer(
    cls=output.OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Length-generalization benchmark for attention: train short, evaluate up to 1024x longer.",
)


def _print(lines: Iterable[str], err: bool = False) -> None:
    for line in lines:
        typer.echo(line, err=err)


#: What a command is doing, on stderr (its results go to stdout).
_tell = partial(typer.echo, err=True)


def _environment(device: str, log: str | None) -> Any:
    """The device resolved and the tracker's package checked before any work (torch loads here)."""
    from lengthgen.harness.devices import check_environment

    return check_environment(device, log)


@contextmanager
def _stoppable(closing: Callable[[], Iterable[str]]) -> Iterator[None]:
    """Ctrl-C, or SIGTERM (a scheduler's stop), during a long command: its closing lines, then exit
    130 or 143; what was done is kept on disk."""
    from lengthgen.sweeps import SweepTerminated, sigterm_stops_cleanly

    try:
        with sigterm_stops_cleanly():
            yield
    except KeyboardInterrupt as stop:
        _print(closing(), err=True)
        raise typer.Exit(code=143 if isinstance(stop, SweepTerminated) else 130) from None


@app.command("tasks")
def tasks_command(
    describe: str | None = typer.Option(None, "--describe", help="Show one task in detail."),
) -> None:
    """List the registered tasks, or describe one (parameters, defaults, vocabulary, example)."""
    from lengthgen.tasks import TASKS, get_task, new_task_params

    if describe is None:
        _print(output.listing(TASKS))
        return
    _print(output.task_lines(get_task(describe, **new_task_params(describe, {}))))


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
    for line in output.sample_lines(task, batch, length, seed, fmt):
        sys.stdout.write(line + "\n")


@app.command("attns")
def attns_command(
    describe: str | None = typer.Option(None, "--describe", help="Show one backend's options in detail."),
) -> None:
    """List the attention backends (a plugin's with its package and version) and the position
    schemes, or describe one backend (its options, their defaults and what they do)."""
    from lengthgen.attention import ATTENTION
    from lengthgen.attention.positions import POSITION_SCHEMES

    if describe is not None:
        _print(output.backend_lines(describe, ATTENTION.get(describe)))
        return
    width = max([len(e.name) for e in ATTENTION.entries()] + [len(n) for n in POSITION_SCHEMES])
    _print(["attention backends (--attn):",
            *output.listing(ATTENTION, indent="  ", width=width, packages=True), "position schemes (--pos):",
            *(f"  {name:<{width}}  {scheme.description}" for name, scheme in POSITION_SCHEMES.items())])


@app.command("run")
def run_command(
    task_name: str = typer.Option(..., "--task", help="Task name (see `lengthgen tasks`)."),
    attn: str = typer.Option(..., "--attn", help="Backend name (see `lengthgen attns`) or file.py:Class."),
    pos: str = typer.Option("nape", "--pos", help="Position scheme: nape, alibi, rope, nope."),
    preset: str = typer.Option("quick", "--preset", help=PRESET_HELP),
    train_length: TrainLength = None,
    max_factor: MaxFactor = None,
    steps: Steps = None,
    seed: int = typer.Option(0, "--seed"),
    device: Where = "auto",
    eval_samples: EvalSamples = None,
    selection: Selecting = None,
    param: list[str] = typer.Option(None, "--param", help="Task parameter key=value (repeatable)."),
    attn_option: list[str] = typer.Option(None, "--attn-option", help="Backend option key=value."),
    override: list[str] = typer.Option(
        None, "--set", help="Any config field SECTION.FIELD=VALUE, e.g. train.lr=5e-4 (repeatable)."
    ),
    out: str = typer.Option("runs", "--out", help="Folder that receives the run folder."),
    log: Log = None,
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
) -> None:
    """Train a model short, evaluate it at 1x..max-factor x the training length, write results."""
    from lengthgen.config import config_from_flags
    from lengthgen.harness.run import execute
    from lengthgen.harness.storage.identity import run_key

    config = config_from_flags(task_name, attn, pos=pos, preset=preset, seed=seed, param=param,
                               attn_option=attn_option, override=override, steps=steps, max_factor=max_factor,
                               train_length=train_length, eval_samples=eval_samples, selection=selection)
    where = _environment(device, log)
    out_dir = folder_for_writing(out, "--out")
    _tell(output.run_banner(run_key(config), config))
    frame = execute(config, out_dir, device=where, progress=not quiet, log=log)
    typer.echo(output.results_table(frame))
    run_dir = out_dir / str(frame["run_id"].iloc[0])
    if (frame["status"] != "ok").any():
        where_rows, error = output.failed_run_lines(run_dir, frame["error"].iloc[0])
        typer.echo(where_rows)
        _tell(error)
        raise typer.Exit(code=1)
    _print(output.closing_lines(run_dir, config.eval.max_factor, log))


@app.command("eval")
def eval_command(
    path: str = typer.Argument(..., help="A run folder (with model.pt and config.json) or a sweep folder."),
    max_factor: MaxFactor = None,
    min_factor: int | None = typer.Option(None, "--min-factor",
                                          help="Evaluate from L·this on (power of 2; default 1)."),
    eval_samples: EvalSamples = None,
    param: list[str] = typer.Option(None, "--param",
                                    help="Evaluate on a task variant: task parameter key=value."),
    attn: str | None = typer.Option(
        None, "--attn", help="Evaluate the same weights with another backend (its parameters must match)."),
    attn_option: list[str] = typer.Option(None, "--attn-option",
                                          help="Evaluate with this backend option key=value."),
    precision: Precision = typer.Option(
        "fp32", "--precision", help="Evaluate the weights and activations in this format (bf16: pure "
        "bfloat16, attention scores still fp32)."),
    checkpoint: KeptStep = None,
    redo: bool = typer.Option(False, "--redo", help="Re-evaluate lengths the results already hold."),
    restore: bool = typer.Option(
        False, "--restore", help="First train runs whose sweep data records them but whose model.pt is gone "
        "again, kept only if they reproduce their recorded rows."),
    device: Where = "auto",
    log: Log = None,
    quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    trust_plugins: Trust = False,
) -> None:
    """Evaluate saved models at more lengths, on a task variant, with another backend, in bfloat16 or
    at a kept checkpoint; add the rows to their results."""
    from lengthgen.config import parse_assignments
    from lengthgen.harness.recorded.reevaluate import evaluate_runs, plan_runs, stopped
    from lengthgen.harness.recorded.restore import restore_models
    from lengthgen.registry import trusted_plugins

    params = parse_assignments(param, "--param")
    options = parse_assignments(attn_option, "--attn-option")
    with trusted_plugins([attn], everything=trust_plugins):
        if restore:
            _environment(device, log)
            restore_models(input_path(path, "PATH"), tell=_tell)
        plans = plan_runs(input_path(path, "PATH"), max_factor=max_factor, eval_samples=eval_samples,
                          task_params=params, attn=attn, attn_options=options, min_factor=min_factor,
                          precision=precision, checkpoint=checkpoint)
        where = _environment(device, log)
        failed = 0
        with _stoppable(lambda: ["interrupted: the rows of the lengths evaluated so far are saved; run the "
                                 "same command again to evaluate the rest"]):
            for plan, outcome in evaluate_runs(plans, redo=redo, device=where, progress=not quiet, log=log,
                                               starting=lambda p, todo: _tell(output.eval_banner(p, todo))):
                if not outcome.rows.empty:
                    typer.echo(output.results_table(outcome.rows))
                _print(f"results: {shown(written)}" for written in outcome.written)
                if outcome.error:
                    _tell(f"error: {stopped(plan, outcome)}")
                    failed += 1
    if failed:
        raise typer.Exit(code=1)


@app.command("sweep")
def sweep_command(
    tasks: str | None = typer.Option(None, "--task", help="Comma-separated tasks (see `lengthgen tasks`)."),
    attns: str | None = typer.Option(None, "--attn", help="Comma-separated backends (`lengthgen attns`)."),
    positions: str | None = typer.Option(None, "--pos", help=r"Position schemes \[default: nape]."),
    seeds: str | None = typer.Option(None, "--seeds", help=r"Seeds: 0,1,2 or a range 0-4 \[default: 0]."),
    preset: str | None = typer.Option(None, "--preset", help=PRESET_HELP + r" \[default: quick]"),
    steps: Steps = None,
    max_factor: MaxFactor = None,
    eval_samples: EvalSamples = None,
    train_length: TrainLength = None,
    selection: Selecting = None,
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
    device: Where = "auto",
    retry_failed: bool = typer.Option(False, "--retry-failed", help="Redo runs recorded as failed."),
    shard: str | None = typer.Option(None, "--shard", help="I/N: every N-th run from the I-th (0-based)."),
    log: Log = None,
    quiet: bool = typer.Option(False, "--quiet", help="No progress output (bar, or lines in a log)."),
    plan_file: str | None = typer.Option(
        None, "--plan", help="A leaderboard plan (TOML): run exactly the runs it still misses."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List missing runs, CPU time; run nothing."),
) -> None:
    """Run a grid of runs into a crash-safe results dataset; re-run the same command to resume."""
    from lengthgen import sweeps as sw
    from lengthgen.plans import listing

    sw.check_jobs(jobs)
    if plan_file is not None:
        grid = {"--task": tasks, "--attn": attns, "--pos": positions, "--seeds": seeds, "--preset": preset,
                "--steps": steps, "--max-factor": max_factor, "--eval-samples": eval_samples,
                "--train-length": train_length, "--selection": selection, "--param": param,
                "--attn-option": attn_option, "--set": override, "--shard": shard, "--log": log,
                "--ray-address": ray_address, "--launcher": None if launcher == "local" else launcher}
        _sweep_plan(plan_file, out, jobs or 1, device, retry_failed, dry_run, quiet, grid)
        return
    if not tasks or not attns:
        raise UserError("sweep needs --task and --attn (or --plan FILE)")
    spec = sw.spec_from_flags(tasks=tasks, attns=attns, positions=positions, seeds=seeds, preset=preset,
                              param=param, attn_option=attn_option, override=override, steps=steps,
                              max_factor=max_factor, eval_samples=eval_samples, train_length=train_length,
                              selection=selection)
    if ray_address and launcher != "ray":
        raise UserError("--ray-address needs --launcher ray")
    configs = sw.validate_spec(spec)
    configs = sw.shard_of(configs, shard) if shard is not None else configs
    if dry_run:
        _print(listing.missing_run_lines(configs, out, retry_failed=retry_failed))
        return
    sw.check_launcher(launcher)
    sw.check_environment(launcher, device, log)
    out_dir = folder_for_writing(out, "--out")
    _tell(output.sweep_banner(spec, len(configs), shard, launcher, out))
    report = sw.SweepReport(len(configs), 0, 0)
    with _stoppable(lambda: sw.summarize(report, out, interrupted=True)):
        sw.run_sweep(configs, out_dir, launcher=launcher, device=device, jobs=jobs, ray_address=ray_address,
                     retry_failed=retry_failed, progress=not quiet, report=report, log=log)
    _print(sw.summarize(report, out), err=True)


def _sweep_plan(plan_file: str, out: str, jobs: int, device: str, retry_failed: bool, dry_run: bool,
                quiet: bool, grid: dict[str, Any]) -> None:
    from lengthgen.plans.execute import PlanReport
    from lengthgen.plans.sweep import interrupted_line, refuse_grid_flags, sweep_plan

    refuse_grid_flags(grid)
    report = PlanReport()
    with _stoppable(lambda: [interrupted_line(report)]):
        sweep_plan(plan_file, out, jobs=jobs, device=device, retry_failed=retry_failed, dry_run=dry_run,
                   progress=not quiet, say=typer.echo, tell=_tell, report=report)


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
    from lengthgen.plans.board import write_board

    _print(str(path) for path in write_board(folders, out, title=title, hardware=hardware, commit=commit,
                                             ablations=ablations, plan_file=plan_file, latex=latex))


@app.command("plot")
def plot_command(
    results: str = typer.Argument(..., help="Sweep folder (its data/ is read) or results folder/file."),
    task_name: str = typer.Option(..., "--task", help="Task to plot."),
    output_file: str = typer.Option(..., "-o", "--output", help="Figure to write: .svg or .png (200 dpi)."),
    kind: PlotKind = typer.Option("exact", "--kind",
                                  help="exact: exact match vs length; dispersion: entropy and support."),
) -> None:
    """One figure for one task, as on the leaderboard: exact match vs length, or attention entropy
    and support."""
    from lengthgen.leaderboard import plot_task

    target = file_for_writing(output_file, "-o")
    with new_folder(target.parent):
        typer.echo(str(plot_task(input_path(results, "RESULTS"), results, task_name, target, kind)))


@app.command("verify")
def verify_command(
    path: str = typer.Argument(..., help="A run folder, sweep folder (its data/) or results file."),
    sample: int | None = typer.Option(None, "--sample", help="Re-derive this many runs, drawn at random "
                                                              r"with --seed \[default: all]."),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampler."),
    device: Where = "cpu",
    report_file: str = typer.Option(
        "verify.json", "--report", help="The report to write (merged into it when it exists); a board "
                                        r"cites DIR/verify.json beside its data \[default: ./verify.json]."),
    trust_plugins: Trust = False,
) -> None:
    """Retrain runs from their recorded configs and compare every row; exit 1 on any difference."""
    from lengthgen.harness.recorded import verify
    from lengthgen.registry import trusted_plugins

    verify.check_sample(sample)
    report = file_for_writing(report_file, "--report")
    verify.check_report(report)
    runs, unusable = verify.runs_to_verify(input_path(path, "PATH"))
    where = _environment(device, None)
    _tell(output.verify_banner(path, runs, unusable, sample))
    with trusted_plugins(everything=trust_plugins):
        checks = verify.verify(path, sample=sample, seed=seed, device=where, echo=typer.echo, report=report)
    bad = [c for c in checks if not c.ok]
    _tell(f"verify: {len(checks) - len(bad)} of {len(checks)} runs re-derived identically; report: {report}")
    if bad:
        raise typer.Exit(code=1)


@app.command("positions")
def positions_command(
    path: RunFolder,
    factor: int = typer.Option(2, "--factor", help="Test at the training length times this."),
    samples: int = typer.Option(64, "--samples", help="Test samples (the evaluation's test set)."),
    bins: int = typer.Option(8, "--bins", help="Ranges of answer positions to report."),
    param: Variant = None,  # type: ignore[assignment]
    checkpoint: KeptStep = None,
    device: Where = "auto",
    trust_plugins: Trust = False,
) -> None:
    """Accuracy by answer position at one length: does a model fail everywhere, or only past the
    positions training reached?"""
    from lengthgen.config import parse_assignments
    from lengthgen.harness.recorded.answers import profile_run
    from lengthgen.harness.recorded.saved import variant_label
    from lengthgen.registry import trusted_plugins

    if bins < 1:
        raise UserError(f"--bins must be at least 1, got {bins}")
    params = parse_assignments(param, "--param")
    with trusted_plugins(everything=trust_plugins):
        profile = profile_run(input_path(path, "PATH"), factor, samples, device, params, checkpoint)
    _print(output.positions_lines(profile, samples, variant_label(_probed(params, checkpoint)), bins))


@app.command("heads")
def heads_command(
    path: RunFolder,
    factor: int = typer.Option(2, "--factor", help="Test at the training length times this."),
    samples: int = typer.Option(32, "--samples", help="Test samples (the evaluation's test set)."),
    param: Variant = None,  # type: ignore[assignment]
    knock_out: bool = typer.Option(True, "--knock-out/--no-knock-out",
                                   help="Also measure the accuracy without each head (one more forward "
                                        "pass per head: most of the time at long lengths)."),
    checkpoint: KeptStep = None,
    device: Where = "auto",
    trust_plugins: Trust = False,
) -> None:
    """Per attention head at one length: how concentrated it is, where it looks, and the token
    accuracy without it. Compare --factor 1 with a longer one to see which circuit breaks."""
    from lengthgen.config import parse_assignments
    from lengthgen.harness.recorded.heads import MASS, profile_run
    from lengthgen.harness.recorded.saved import variant_label
    from lengthgen.registry import trusted_plugins

    params = parse_assignments(param, "--param")
    with trusted_plugins(everything=trust_plugins):
        report = profile_run(input_path(path, "PATH"), factor, samples, device, params, knock_out, checkpoint)
    _print(output.heads_lines(report, variant_label(_probed(params, checkpoint)), MASS))


def _probed(params: dict[str, Any], checkpoint: int | None) -> dict[str, Any]:
    """What a probe's report names besides the run: the task variant and the kept checkpoint."""
    return params if checkpoint is None else {**params, "checkpoint": checkpoint}


def main() -> None:
    """The ``lengthgen`` script: output that always encodes (ASCII where the terminal needs it),
    every warning as one line, shown once."""
    safe_streams()
    capture_warnings()
    app()


if __name__ == "__main__":
    main()
