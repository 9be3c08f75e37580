"""What the command line prints: every line a command writes about tasks, backends, samples, runs,
sweeps and probes, as functions of the values it shows, and the one line of an error.

They live apart from ``cli.py`` so that the command bodies stay a parse, a call and a print, and so
that a line's wording is found and tested in one place. Nothing here computes or checks anything.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from pydantic import ValidationError
from typer.core import TyperGroup

from lengthgen.console import one_line
from lengthgen.errors import UserError
from lengthgen.paths import shown

if TYPE_CHECKING:
    import pandas as pd

    from lengthgen.config import RunConfig
    from lengthgen.harness.recorded.answers import RunProfile
    from lengthgen.harness.recorded.heads import HeadsReport
    from lengthgen.harness.recorded.reevaluate import EvalPlan
    from lengthgen.registry import Registry
    from lengthgen.sweeps import SweepSpec
    from lengthgen.tasks.base import Batch, Task


try:  # recent typer runs on its own copy of click: its exceptions are the ones raised here
    from typer import _click as click
except ImportError:  # older typer uses click itself
    import click  # type: ignore[no-redef]


#: click ≥ 8.2 shows the help of a bare command through this exception (older click: none to catch)
_NoArgsIsHelp: tuple[type[Exception], ...] = tuple(
    e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if e is not None)


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
            exc.show()  # type: ignore[attr-defined]
            code = exc.exit_code  # type: ignore[attr-defined]
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


def listing(registry: Registry[Any], *, indent: str = "", width: int | None = None,
            packages: bool = False) -> list[str]:
    """A registry's names with their descriptions (``packages``: a plugin's with its package and
    version), broken plugins last; names padded to ``width`` (default: the longest)."""
    from lengthgen.provenance import package_of

    entries = list(registry.entries())
    width = width if width is not None else max((len(e.name) for e in entries), default=4)
    lines = []
    for entry in entries:
        package = None if entry.builtin or not packages else package_of(entry.obj)
        lines.append(f"{indent}{entry.name:<{width}}  {entry.obj.description}"
                     + (f" [{package}]" if package else ""))
    lines += [f"{indent}{name:<{width}}  [broken plugin] {error}"
              for name, error in sorted(registry.broken.items())]
    return lines


def backend_lines(name: str, backend: type) -> list[str]:
    """``lengthgen attns --describe``: the description, the package, and every option (set with
    ``--attn-option key=value``) with its default and what it does."""
    from lengthgen.provenance import package_of

    package = package_of(backend)
    lines = [f"{name}: {backend.description}" + (f" [{package}]" if package else ""),
             "  options (set with --attn-option key=value):"]
    fields = backend.Options.model_fields
    for field_name, field in fields.items():
        doc = f"  {field.description}" if field.description else ""
        lines.append(f"    {field_name} = {field.get_default(call_default_factory=True)!r}{doc}")
    return lines if fields else [*lines, "    (none)"]


def task_lines(task: Task) -> list[str]:
    """``lengthgen tasks --describe``: parameters, defaults, vocabulary and an example."""
    info = task.describe()
    lines = [f"{info['name']}: {info['description']}", f"  length counts: {info['length_unit']}",
             f"  minimum length: {info['min_length']}",
             f"  default training length: {info['default_train_length']} "
             f"(range {info['train_range'][0]}..{info['train_range'][1]})",
             "  parameters (set with --param key=value):"]
    for field_name, field in type(task.config).model_fields.items():
        doc = f"  {field.description}" if field.description else ""
        lines.append(f"    {field_name} = {getattr(task.config, field_name)!r}{doc}")
    vocab = ", ".join(info["vocab"][:24]) + (" ..." if info["vocab_size"] > 24 else "")
    lines.append(f"  vocabulary ({info['vocab_size']} tokens): {vocab}")
    example_length = max(task.min_length, min(8, task.default_train_length))
    batch = task.sample(1, example_length, seed=0, split="train")
    return [*lines, f"  example (length {example_length}):", f"    source: {json.dumps(batch.source[0])}",
            f"    target: {json.dumps(batch.target[0])}",
            f"    tokens: {' '.join(task.vocab.decode(batch.input_ids[0]))}"]


def sample_lines(task: Task, batch: Batch, length: int, seed: int, fmt: str) -> Iterator[str]:
    """``lengthgen sample``: JSON lines (structured source/target and the exact model view), or text
    with the scored tokens in brackets; one line at a time (a call may print millions of tokens)."""
    for i in range(len(batch)):
        ids = batch.input_ids[i]
        if fmt == "jsonl":
            record = {"task": task.name, "length": length, "seed": seed, "index": i,
                      "source": batch.source[i], "target": batch.target[i], "input_ids": ids.tolist(),
                      "loss_mask": batch.loss_mask[i].astype(int).tolist()}
            yield json.dumps(record, separators=(",", ":"))
            continue
        scored = batch.loss_mask[i]  # a token is scored when the position before it is masked
        tokens = task.vocab.decode(ids)
        rendered = [f"[{tok}]" if t > 0 and scored[t - 1] else tok for t, tok in enumerate(tokens)]
        yield f"# {task.name} length={length} seed={seed} index={i}"
        yield " ".join(rendered)


def results_table(rows: pd.DataFrame) -> str:
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


def run_banner(key: str, config: RunConfig) -> str:
    """What ``lengthgen run`` says before it trains."""
    return (f"run {key}: {config.task} / {config.attn} ({config.pos}), preset {config.preset}, "
            f"L={config.train.train_length}, {config.train.steps} steps, "
            f"eval up to {config.eval.max_factor}x")


def closing_lines(run_dir: Path, max_factor: int, log: str | None) -> list[str]:
    """What a finished run says last: where its results and figure are, what two of its columns
    mean, and the natural next commands."""
    folder = shown(run_dir)
    lines = [f"results: {shown(run_dir / 'results.parquet')}",
             f"figure: {shown(run_dir / 'accuracy_vs_length.png')} (exact match against length)",
             "entropy: how spread each attention row is (0: one key, 1: uniform over the keys it sees); "
             "support: how many keys get weight > 0"]
    if log == "tensorboard":
        lines.append(f"tensorboard: {folder}/tensorboard/ (tensorboard --logdir {shown(run_dir.parent)})")
    lines.append(f"next: lengthgen eval {folder} --max-factor {2 * max_factor}   (longer lengths), "
                 f"lengthgen heads {folder} --factor 2   (what its heads look at)")
    return lines


def failed_run_lines(run_dir: Path, error: str) -> tuple[str, str]:
    """Where a failed run's rows are (stdout), and its error (stderr)."""
    return (f"results: {shown(run_dir / 'results.parquet')}",
            f"error: run failed: {error} (details in {shown(run_dir / 'error.txt')})")


def eval_banner(plan: EvalPlan, todo: Sequence[int]) -> str:
    """What ``lengthgen eval`` says before it evaluates a run."""
    label = f" [{plan.variant}]" if plan.variant else ""
    return (f"eval {plan.run.run_id}{label}: {len(todo)} of {len(plan.factors)} lengths to evaluate "
            f"({plan.factors[0]}x to {plan.config.eval.max_factor}x)")


def sweep_banner(spec: SweepSpec, runs: int, shard: str | None, launcher: str, out: str) -> str:
    """What ``lengthgen sweep`` says before it starts."""
    settings = f"{len(spec.points())} settings x " if spec.grid else ""
    return (f"sweep: {runs} runs ({len(spec.tasks)} tasks x {len(spec.attns)} backends x "
            f"{len(spec.positions)} position schemes x {settings}{len(spec.seeds)} seeds"
            f"{f', shard {shard}' if shard else ''}), preset {spec.preset}, launcher {launcher} -> {out}")


def verify_banner(path: str, runs: Mapping[str, Any], unusable: Mapping[str, str], sample: int | None) -> str:
    """What ``lengthgen verify`` says before it re-derives runs."""
    return (f"verify: re-deriving {min(sample or len(runs), len(runs))} of {len(runs)} runs under {path}"
            + (f" ({len(unusable)} with unusable rows: not verified)" if unusable else ""))


def variant_mark(label: str) -> str:
    """' [near_misses=8]' after a run id when a command tests a task variant, as ``eval`` labels it."""
    return f" [{label}]" if label else ""


def positions_lines(profile: RunProfile, samples: int, label: str, bins: int) -> list[str]:
    """``lengthgen positions``: accuracy by range of answer positions, beyond training marked."""
    lines = [f"{profile.run_id}{variant_mark(label)} at {profile.factor}x (length {profile.length}, "
             f"{samples} test samples); training scored answer positions 1-{profile.trained_positions}",
             f"{'answer positions':>18} {'accuracy':>9}"]
    for first, last, accuracy in profile.accuracy.bins(bins):
        mark = "  (beyond training)" if first > profile.trained_positions else ""
        span = f"{first}" if first == last else f"{first}-{last}"
        lines.append(f"{span:>18} {100 * accuracy:>8.1f}%{mark}")
    return lines


#: Mean unclaimed weight above which ``lengthgen heads`` shows the column (rounding of normalized
#: rows stays far below it).
UNCLAIMED_SHOWN = 1e-4


def heads_lines(report: HeadsReport, label: str, mass: float) -> list[str]:
    """``lengthgen heads``: a line per head, then (for tasks that name roles) what each head's
    most-weighted key is over right and wrong answer tokens. The weight a row leaves to no key is a
    column only for backends whose rows do that (stick-breaking), the mean increment of a
    cumulative bias only for backends that have one (FoX)."""
    unclaimed = any(h.unclaimed > UNCLAIMED_SHOWN for h in report.heads)
    biased = any(h.bias_per_token is not None for h in report.heads)
    lines = [f"{report.run_id}{variant_mark(label)} at {report.factor}x (length {report.length}, "
             f"{report.n_samples} test samples): token accuracy {100 * report.accuracy:.1f}%",
             f"{'layer':>5} {'head':>4} {'position':>10} {f'keys for {mass:.0%}':>13} {'top weight':>10} "
             f"{'top key distance':>22} {'half weight within':>18} {'accuracy without':>16}"
             + (f" {'unclaimed':>9}" if unclaimed else "") + (f" {'bias per token':>14}" if biased else "")]
    for h in report.heads:
        where = f"{h.distance} ({100 * h.distance_share:.0f}% of rows)"
        lines.append(f"{h.layer:>5} {h.head:>4} {h.position:>10} {h.keys_for_mass:>13.1f} "
                     f"{h.top_weight:>10.2f} {where:>22} {h.half_weight_distance:>18.1f} "
                     f"{_share(h.accuracy_without):>16}" + (f" {h.unclaimed:>9.3f}" if unclaimed else "")
                     + (f" {h.bias_per_token:>14.4f}" if biased and h.bias_per_token is not None else ""))
    if any(h.roles for h in report.heads):
        lines.append("what each head's most-weighted key is, over answer tokens the model gets "
                     "right / wrong:")
        lines += [f"{h.layer:>5} {h.head:>4} {h.position:>10}  right: {_role_shares(h.roles, True)}"
                  f" | wrong: {_role_shares(h.roles, False)}" for h in report.heads]
    return lines


def _share(value: float | None) -> str:
    """A fraction as a percentage with one decimal; "—" where it was not measured."""
    return "—" if value is None else f"{100 * value:.1f}%"


def _role_shares(roles: Mapping[tuple[bool, str], int], right: bool) -> str:
    """'matching pair 96%, other pair 4% (128 tokens)': the roles over one kind of answer token."""
    counts = sorted(((n, role) for (ok, role), n in roles.items() if ok == right),
                    key=lambda t: (-t[0], t[1]))
    total = sum(n for n, _ in counts)
    if not total:
        return "none"
    shares = [f"{role} {100 * n / total:.0f}%" for n, role in counts]
    return f"{', '.join(shares)} ({total} tokens)"
