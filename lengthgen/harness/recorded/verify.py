"""Re-deriving published result rows from their recorded configs (``lengthgen verify``).

A row is a claim: "this config, trained and evaluated by lengthgen, gives these numbers". Every
row carries its full config, so anyone can retrain the run in a scratch folder, evaluate it at the
lengths the row set holds (lengths past the config's ``max_factor`` through the same path as
``lengthgen eval``), and compare, column by column:

- identity and counts (run id, lengths, samples, steps, the selected checkpoint, …) exactly;
- metrics bitwise when torch, numpy and numba are the versions that made the rows and the
  processor and the instruction sets its kernels used are the same, else within
  :data:`TOLERANCE`, with a warning naming what differs (another processor may pick other BLAS
  kernels, which round differently). Rows older than the ``cpu_isa`` column count as another
  instruction set: two VMs with the same model name ran AVX2 and AVX-512 kernels.

Before any training, the config must hash to the row's ``config_hash`` and run id: an edited
config is reported as such. A plugin file or module the config names is not imported unless the
user allows it (``--trust-plugins``): the folder may come from someone else. When rows differ, the
report names what else differs between the code that made them and this one (commit, local
changes, numerics version). Rows of evaluation variants (``lengthgen eval --param/--attn``) are
not re-derived.

A run is checked all or nothing: one with any row the reader refuses (a mean outside its interval,
an odd factor, a million threads) is ✗ with the reason, and a run that fails to re-derive is ✗
while the others go on. The report goes where the user says (``--report``), is merged and saved
after every run, and records per run the rows it re-derived (count, factors and
:func:`rows_digest`) and the data it read, so that a page can tell whether the rows it shows are
still the rows that were checked (``leaderboard/verified.py``).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from pydantic import ValidationError

from lengthgen import limits, provenance
from lengthgen.config import RunConfig, parse_json
from lengthgen.errors import UserError, exception_line
from lengthgen.files import atomic_write, read_text
from lengthgen.harness.storage.identity import run_key
from lengthgen.harness.storage.results import check_results_file, load_results, results_files, results_source
from lengthgen.progress import Shown
from lengthgen.registry import RegistryError, reading_data

#: Compared exactly: what identifies a row and what was counted.
IDENTITY: tuple[str, ...] = (
    "run_id", "task", "attn", "pos", "seed", "preset", "train_length", "eval_length", "factor", "n_samples",
    "steps", "best_step", "selection", "params", "config_hash", "config_json", "status")
#: Compared bitwise on the same library versions, else within ``TOLERANCE``.
METRICS: tuple[str, ...] = (
    "exact_match", "exact_match_lo", "exact_match_hi", "token_accuracy", "attn_entropy", "attn_support",
    "val_exact_id", "val_exact_8x")
#: Largest absolute difference of a metric accepted when library versions differ.
TOLERANCE = 1e-4
#: Library versions that decide whether metrics must agree bit for bit.
LIBRARIES: tuple[str, ...] = ("torch_version", "numpy_version", "numba_version")
#: The name of a verify report; the board cites the one beside its data (``leaderboard/verify.json``).
REPORT = "verify.json"
#: The report's format: 2 records per run the rows it re-derived (count, factors, digest) and the
#: data's commit, so that a page can tell whether the rows it shows are the rows that were checked.
FORMAT = 2


@dataclass(frozen=True)
class RunCheck:
    run_id: str
    ok: bool
    detail: str = ""  # the first difference, or what could not be checked
    warning: str = ""  # library versions differ, so metrics were compared within the tolerance
    rows: int = 0  # the published rows compared (the run's evaluated rows of its training task)
    factors: tuple[int, ...] = ()
    digest: str = ""  # rows_digest of exactly those rows

    def line(self) -> str:
        mark = "✓" if self.ok else "✗"
        text = f"{mark} {self.run_id}" + (f": {self.detail}" if self.detail else "")
        return text + (f" (warning: {self.warning})" if self.warning else "")


def comparable(value: Any) -> Any:
    """A cell as the digest (and a comparison of two copies of a run) sees it: missing → None,
    integral numbers as ints (a column read as float because another file has a gap holds the
    same value), other numbers as floats."""
    value = _plain(value)
    if _missing(value):
        return None
    if isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, float)):
        number = float(value)
        return int(number) if number.is_integer() else number
    return str(value)


def rows_digest(rows: pd.DataFrame) -> str:
    """A digest of a run's published rows as ``verify`` compares them (identity, counts and
    metrics, by factor): what a report records, so that a board calls a run re-derived only while
    its rows are these."""
    ordered = rows.sort_values("factor", kind="mergesort")
    table = [[comparable(row[c]) for c in (*IDENTITY, *METRICS)] for _, row in ordered.iterrows()]
    text = json.dumps(table, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def evaluated_rows(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per run, its ok rows of the training task (what ``verify`` re-derives), by factor."""
    variant = rows["eval_variant"].fillna("").astype(str)
    ok = rows[(rows["status"] == "ok") & (variant == "") & rows["factor"].notna()]
    return {str(run): group.sort_values("factor").reset_index(drop=True)
            for run, group in ok.groupby("run_id", sort=True)}


def published_runs(path: str | Path) -> dict[str, pd.DataFrame]:
    """The ok rows of the training task per run, under a run folder, sweep folder or results file."""
    root = Path(path)
    if not root.exists():
        raise UserError(f"no results under {str(path)!r}: no such file or folder")
    rows = load_results(root / "results.parquet" if (root / "results.parquet").is_file() else root)
    runs = evaluated_rows(rows)
    if not runs:
        raise UserError(f"no evaluated runs under {str(path)!r} to verify")
    return runs


def runs_to_verify(path: str | Path) -> tuple[dict[str, pd.DataFrame], dict[str, str]]:
    """The evaluated rows per run (``published_runs``) and the runs with rows the reader refuses,
    with the first reason (``unusable_runs``); a UserError when there is neither."""
    unusable = unusable_runs(path)
    try:
        return published_runs(path), unusable
    except UserError:
        if not unusable:
            raise
        return {}, unusable


def unusable_runs(path: str | Path) -> dict[str, str]:
    """Runs whose published rows the reader skips (an edited config, a fraction above 1, …), each
    with the reason: they cannot be verified, so they count as failed checks."""
    root = Path(path)
    source = results_source(root / "results.parquet" if (root / "results.parquet").is_file() else root)
    found: dict[str, str] = {}
    for file in results_files(source):
        for run_id, reason in check_results_file(file).bad_runs.items():
            found.setdefault(run_id, reason)
    return found


def recorded_config(rows: pd.DataFrame) -> tuple[RunConfig | None, str]:
    """The run's config, or why it cannot be trusted (it must hash to the rows' hash and run id)."""
    texts = set(rows["config_json"])
    if len(texts) != 1:
        return None, "its rows hold different configs"
    try:
        config = RunConfig.model_validate_json(texts.pop())
    except (ValidationError, ValueError, TypeError) as exc:
        return None, f"config_json is not a run config ({str(exc).splitlines()[0]})"
    if set(rows["config_hash"]) != {config.config_hash()}:
        return None, f"config_json does not hash to config_hash (it hashes to {config.config_hash()})"
    if set(rows["run_id"]) != {run_key(config)}:
        return None, f"run_id is not the config's ({run_key(config)})"
    return config, ""


@reading_data()
def plugin_problem(config: RunConfig) -> str:
    """Why this installation cannot re-derive the config without importing code it names, or
    cannot find its task or backend ("" when it can)."""
    from lengthgen.attention import ATTENTION
    from lengthgen.tasks import TASKS

    try:
        TASKS.get(config.task)
        ATTENTION.get(config.attn)
    except RegistryError as exc:
        return str(exc)
    return ""


@reading_data()  # the names come from the rows: data
def rederive(config: RunConfig, factors: list[int], work: Path, device: str,
             threads: int | None, progress: Shown = False) -> pd.DataFrame:
    """Train the config in ``work`` and evaluate it at ``factors`` (past its ``max_factor`` too)."""
    from lengthgen.harness.recorded.reevaluate import plan_evaluation, run_evaluation
    from lengthgen.harness.recorded.saved import load_saved_run
    from lengthgen.harness.run import execute

    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        rows = execute(config, work, device=device, progress=progress)
        extra = [f for f in factors if f > config.eval.max_factor]
        if extra and (rows["status"] == "ok").all():
            saved = load_saved_run(work / run_key(config))
            plan = plan_evaluation(saved, max_factor=max(extra))
            outcome = run_evaluation(plan, extra, device=device, progress=False)
            rows = pd.concat([rows, outcome.rows], ignore_index=True)
    finally:
        torch.set_num_threads(before)
    return rows


def _same(a: Any, b: Any, tolerance: float) -> bool:
    missing_a, missing_b = _missing(a), _missing(b)
    if missing_a or missing_b:
        return missing_a and missing_b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) == float(b) or abs(float(a) - float(b)) <= tolerance
    return a == b


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def first_difference(published: pd.DataFrame, new: pd.DataFrame, tolerance: float) -> str | None:
    """The first column that differs, with both values (None: the rows agree)."""
    new = new[(new["status"] == "ok")].set_index("factor", drop=False)
    for _, row in published.iterrows():
        factor = int(row["factor"])
        if factor not in new.index:
            failed = "; re-derived run failed" if new.empty else ""
            return f"{factor}×: no re-derived row{failed}"
        other = new.loc[factor]
        for column in (*IDENTITY, *METRICS):
            mine, theirs = _plain(row[column]), _plain(other[column])
            if not _same(mine, theirs, tolerance if column in METRICS else 0.0):
                return f"{factor}×: {column} published {mine!r}, re-derived {theirs!r}"
    return None


def _versions_differ(published: pd.DataFrame) -> str:
    """What differs between the software and processor that made the rows and this one."""
    mine = {"torch_version": torch.__version__, **provenance.software()}
    first = published.iloc[0]
    changed = [f"{c.removesuffix('_version')} {_plain(first[c])} → {mine[c]}" for c in LIBRARIES
               if _plain(first[c]) != mine[c]]
    if isinstance(first["cpu"], str) and first["cpu"] != mine["cpu"]:
        changed.append(f"processor {first['cpu']} → {mine['cpu']}")
    if not isinstance(first["cpu_isa"], str):  # older rows: the same model name hid AVX2 and AVX-512
        changed.append(f"instruction sets not recorded (now {mine['cpu_isa']})")
    elif first["cpu_isa"] != mine["cpu_isa"]:
        changed.append(f"instruction sets {first['cpu_isa']} → {mine['cpu_isa']}")
    return ", ".join(changed)


def _code_differs(published: pd.DataFrame) -> str:
    mine = provenance.software()
    first = published.iloc[0]
    names = {"git_commit": "commit", "git_dirty": "local changes", "numerics_version": "numerics version"}
    changed = [f"{name} {_plain(first[c])} → {mine[c]}" for c, name in names.items()
               if _plain(first[c]) != mine[c]]
    return f"; code differs: {', '.join(changed)}" if changed else "; the same code"


def recorded_threads(published: pd.DataFrame) -> int | None:
    """The torch thread count the rows were made with (BLAS reductions round by it)."""
    threads = published["torch_threads"].dropna()
    return int(threads.iloc[0]) if not threads.empty else None


def compare(published: pd.DataFrame, new: pd.DataFrame) -> tuple[str | None, str]:
    """The first difference of re-derived rows from published ones (None: they agree), with what
    else differs when they do; and the warning that metrics were compared within the tolerance."""
    warning = _versions_differ(published)
    difference = first_difference(published, new, TOLERANCE if warning else 0.0)
    return (difference + _code_differs(published) if difference else None), warning


def check_run(run_id: str, published: pd.DataFrame, work: Path, device: str) -> RunCheck:
    """Re-derive one run and compare; whatever goes wrong (an unusable config, a plugin, an error
    while training) is this run's ✗, never the end of the other runs' checks."""
    rows = {"rows": len(published), "factors": tuple(int(f) for f in published["factor"]),
            "digest": rows_digest(published)}
    config, problem = recorded_config(published)
    problem = problem or (plugin_problem(config) if config is not None else "")
    if config is None or problem:
        return RunCheck(run_id, False, problem, **rows)
    try:
        new = rederive(config, list(rows["factors"]), work, device, recorded_threads(published))
    except (Exception, SystemExit) as exc:  # SystemExit: a plugin's exit
        return RunCheck(run_id, False, f"could not be re-derived: {exception_line(exc)}", **rows)
    difference, warning = compare(published, new)
    if difference is None:
        return RunCheck(run_id, True, f"{len(published)} rows", warning, **rows)
    return RunCheck(run_id, False, difference, warning, **rows)


def check_sample(sample: int | None) -> None:
    """How many runs to re-derive: None (all of them) or at least one."""
    if sample is not None and sample < 1:
        raise UserError(f"--sample must be at least 1, got {sample}")


def choose(run_ids: list[str], sample: int | None, seed: int) -> list[str]:
    """``sample`` runs drawn with a seeded sampler (all of them when ``sample`` is None)."""
    check_sample(sample)
    if sample is None or sample >= len(run_ids):
        return sorted(run_ids)
    return sorted(random.Random(seed).sample(sorted(run_ids), sample))


def verify(path: str | Path, *, sample: int | None = None, seed: int = 0, device: str = "cpu",
           echo: Callable[[str], None] = print, report: str | Path | None = None) -> list[RunCheck]:
    """Re-derive the chosen runs under ``path`` and compare; one line per run through ``echo``.

    A run is all or nothing: one with any row the reader refuses is ✗ with the reason (its other
    rows are not checked alone), and one that fails to re-derive is ✗ while the others go on. With
    ``report``, each check is merged into that report as soon as it is made, so a crash or Ctrl-C
    keeps the checks done."""
    runs, unusable = runs_to_verify(path)
    data = {"commit": provenance.data_commit(results_source(path)),
            "runs": {**{run: 0 for run in unusable}, **{run: len(rows) for run, rows in runs.items()}}}
    checks = []

    def record(check: RunCheck) -> None:
        echo(check.line())
        checks.append(check)
        if report is not None:
            write_report(report, [check], data)

    for run_id, reason in sorted(unusable.items()):  # rows the reader cannot use: never ✓
        published = runs.pop(run_id, None)
        counted = {} if published is None else {"rows": len(published), "digest": rows_digest(published),
                                                "factors": tuple(int(f) for f in published["factor"])}
        record(RunCheck(run_id, False, f"published rows unusable: {reason}", **counted))
    with tempfile.TemporaryDirectory(prefix="lengthgen-verify-") as scratch:
        for run_id in choose(list(runs), sample, seed):
            record(check_run(run_id, runs[run_id], Path(scratch), device))
    return checks


def report_path(path: str | Path) -> Path:
    """Where a board's own verify report lives: beside its ``data/`` (``leaderboard/verify.json``)."""
    root = Path(path)
    return (root if root.is_dir() else root.parent) / REPORT


def write_report(target: str | Path, checks: list[RunCheck], data: dict[str, Any]) -> Path:
    """Merge these checks into the report at ``target``: per run, the latest result, its date and
    code, and the rows it covered (count, factors, digest) with the data's commit; ``data`` is the
    data the invocation read (``commit``, and ``runs``: each run's evaluated rows), from which a page
    counts the runs added or extended since."""
    report = check_report(target)
    runs = dict((report or {}).get("runs", {}))
    when = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    commit = provenance.software()["git_commit"] or "unknown"
    for check in checks:
        runs[check.run_id] = {"ok": check.ok, "date": when, "commit": commit[:10], "detail": check.detail,
                              "warning": check.warning, "rows": check.rows, "factors": list(check.factors),
                              "digest": check.digest, "data_commit": data["commit"]}
    body = {"format": FORMAT, "total_runs": len(data["runs"]), "data": {**data, "runs": dict(sorted(
        data["runs"].items()))}, "runs": dict(sorted(runs.items()))}
    return atomic_write(target, json.dumps(body, indent=1, sort_keys=True) + "\n")


def check_report(target: str | Path) -> dict[str, Any] | None:
    """The report already at ``target`` (None: no file there); a one-line UserError when some other
    file is there (``--report README.md`` must not overwrite the README), checked before any run."""
    report = _load_report(Path(target))
    if report is None and os.path.lexists(target):
        raise UserError(f"--report {target} is a file that is not a verify report; lengthgen does not "
                        "overwrite it: name another file")
    return report


def _load_report(target: Path) -> dict[str, Any] | None:
    """The report at ``target``, or None when it is missing or not a report (a link, too large, not
    JSON, nested too deep: a report in a submitted folder is data someone else wrote)."""
    try:
        report = parse_json(read_text(target, links=False, limit=limits.MAX_TEXT_BYTES), str(target))
    except (OSError, ValueError, UserError):
        return None
    if not isinstance(report, dict) or not isinstance(report.get("runs"), dict):
        return None
    runs = {str(k): v for k, v in report["runs"].items() if isinstance(v, dict)}
    return {**report, "runs": runs}


def read_report(path: str | Path) -> dict[str, Any] | None:
    """A board's own verify report (beside its data), or None (missing or unreadable)."""
    return _load_report(report_path(path))
