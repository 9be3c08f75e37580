"""Leaderboard: intervals and effective length on hand-made rows, the paper rows, determinism
(byte-identical outputs, independent of row order), and the ``leaderboard``/``plot`` commands."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import build_run_config
from lengthgen.harness.evaluate import wilson_interval
from lengthgen.harness.results import rows_to_frame, write_parquet_atomic
from lengthgen.leaderboard import (
    PAPER_LABEL,
    effective_length,
    load_rows,
    render,
    seed_interval,
    summarize,
    t_quantile,
    task_table,
)

runner = CliRunner()


def make_rows(exact: dict[tuple[str, int], list[float]], task: str = "copy", n: int = 100,
              failed: tuple[tuple[str, int], ...] = (), pos: str = "nape") -> pd.DataFrame:
    """Rows for runs (attn, seed) with the given exact match at factors 1, 2, 4, … (one value each)."""
    rows = []
    for (attn, seed), values in sorted(exact.items()):
        config = build_run_config(task, attn, pos=pos, seed=seed, overrides={
            "train.steps": 10, "eval.max_factor": 2 ** (len(values) - 1), "eval.samples": n})
        run_id = f"{task}-{attn}-{pos}-s{seed}-{config.config_hash()[:8]}"
        base = {"run_id": run_id, "task": task, "attn": attn, "pos": pos, "seed": seed, "preset": "quick",
                "train_length": 16, "steps": 10,
                "selection": "id", "device": "cpu", "lengthgen_version": "0.1.0", "torch_version": "2.x",
                "config_hash": config.config_hash(), "config_json": config.canonical_json(),
                "train_seconds": 30.0, "created_at": f"2026-01-0{seed + 1}T00:00:00+00:00"}
        for i, value in enumerate(values):
            hits = round(value * n)
            lo, hi = wilson_interval(hits, n)
            rows.append({**base, "factor": 2 ** i, "eval_length": 16 * 2 ** i, "n_samples": n,
                         "exact_match": hits / n, "exact_match_lo": lo, "exact_match_hi": hi,
                         "token_accuracy": value, "attn_entropy": 0.2 + 0.1 * i + 0.01 * seed,
                         "attn_support": 2.0 ** (i + 1), "eval_seconds": 1.0, "status": "ok", "error": None})
        if (attn, seed) in failed:
            rows.append({**base, "status": "failed", "error": "OutOfMemoryError: at the next length"})
    return rows_to_frame(rows)


ROWS = {
    ("asentmax", 0): [1.0, 0.98, 0.95, 0.80],
    ("asentmax", 1): [1.0, 0.96, 0.93, 0.70],
    ("asentmax", 2): [1.0, 0.97, 0.91, 0.75],
    ("softmax", 0): [1.0, 0.90, 0.40, 0.00],
    ("softmax", 1): [0.99, 0.86, 0.30, 0.00],
    ("softmax", 2): [1.0, 0.88, 0.35, 0.01],
}


def test_t_quantiles_match_tables() -> None:
    known = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 9: 2.2621572, 30: 2.0422725}
    for df, value in known.items():
        assert t_quantile(df) == pytest.approx(value, abs=1e-6)
    scipy_stats = pytest.importorskip("scipy.stats")
    for df in (5, 17, 60):
        assert t_quantile(df) == pytest.approx(scipy_stats.t.ppf(0.975, df), abs=1e-9)


def test_seed_interval() -> None:
    ci = seed_interval([0.8, 1.0, 0.9])
    half = 4.3026527 * 0.1 / math.sqrt(3)
    assert (ci.n, ci.method) == (3, "t")
    assert ci.mean == pytest.approx(0.9) and ci.lo == pytest.approx(0.9 - half) and ci.hi == 1.0  # clipped
    assert seed_interval([0.5, 0.5]).lo == seed_interval([0.5, 0.5]).hi == 0.5  # no spread, no width
    one = seed_interval([0.7], wilson=(0.6, 0.78))
    assert (one.mean, one.lo, one.hi, one.method) == (0.7, 0.6, 0.78, "wilson")
    assert seed_interval([]).method == "none"


def test_effective_length() -> None:
    assert effective_length({1: 0.95, 2: 0.91, 4: 0.89, 8: 0.95}) == (2, False)  # stops at the first dip
    assert effective_length({1: 1.0, 2: 0.9, 4: 0.99}) == (4, True)  # 0.9 passes; capped at 4x
    assert effective_length({1: 0.89, 2: 1.0}) == (0, False)
    assert effective_length({2: 1.0}) == (0, False)  # no 1x
    assert effective_length({1: 1.0, 2: math.nan}) == (1, False)
    assert effective_length({1: 1.0, 2: 1.0, 16: 0.95, 64: 0.5}) == (16, False)  # the paper's gaps


def test_summary_cells_and_effective_length() -> None:
    rows = make_rows({**ROWS, ("entmax", 0): [0.95, 0.5]}, failed=(("softmax", 2),))
    summary = summarize(rows)
    measured = summary[summary["source"] == "measured"]
    asent = measured[measured["method"] == "asentmax"].set_index("factor")
    assert asent.loc[2, "exact_match"] == pytest.approx(0.97) and asent.loc[2, "n_seeds"] == 3
    assert asent.loc[2, "ci_lo"] == pytest.approx(0.97 - 4.3026527 * 0.01 / math.sqrt(3))
    assert set(asent["effective_length"]) == {4} and not asent["effective_length_capped"].any()
    soft = measured[measured["method"] == "softmax"].iloc[0]
    assert (soft["effective_length"], soft["runs"], soft["runs_failed"]) == (1, 3, 1)
    entmax = measured[measured["method"] == "entmax"].set_index("factor")
    assert entmax.loc[1, "ci_method"] == "wilson" and entmax.loc[1, "ci_lo"] == pytest.approx(
        wilson_interval(95, 100)[0])
    paper = summary[summary["source"] == "paper"]
    assert set(paper["method"]) == {"softmax", "asentmax"}  # design.md §5 has Copy rows for these
    assert set(paper["effective_length"]) == {16}

    factors, table = task_table(summary, "copy")
    assert factors == [1, 2, 4, 8, 16, 64]  # measured 1..8 plus the paper's 16, 64
    labels = [r.method for r in table]
    assert labels == ["asentmax", "entmax", "softmax", f"{PAPER_LABEL}: softmax", f"{PAPER_LABEL}: asentmax"]
    first = table[0]
    assert first.cells[1] == "97.0 [94.5, 99.5]" and first.effective == "4×" and first.seeds == "3"
    assert table[1].cells[0] == "95.0 [88.8, 97.8]" and table[1].cells[2] == "—"  # entmax stopped at 2x
    assert table[3].cells[4:] == ("99.4", "85.5") and table[3].seeds == "—"


def test_all_failed_method_still_listed() -> None:
    rows = rows_to_frame([{"run_id": "copy-x-nape-s0-1", "task": "copy", "attn": "x", "pos": "nape",
                           "seed": 0, "status": "failed", "error": "TrainingDiverged: loss is nan"}])
    _, table = task_table(summarize(rows), "copy")
    assert table[0].method == "x" and table[0].failed == "1" and table[0].effective == "—"


def test_outputs_are_deterministic(tmp_path: Path) -> None:
    rows = make_rows(ROWS, failed=(("softmax", 2),))
    first = render(rows, source="sweep", out_name="board").files
    shuffled = rows.sample(frac=1.0, random_state=3).reset_index(drop=True)
    second = render(shuffled, source="sweep", out_name="board").files
    assert sorted(first) == ["README.md", "leaderboard.csv", "leaderboard.html", "plots/copy_dispersion.png",
                             "plots/copy_exact_match.png"]
    for name in first:
        assert first[name] == second[name], name
    for name in ("plots/copy_exact_match.png", "plots/copy_dispersion.png"):
        png = first[name]
        assert png.startswith(b"\x89PNG") and b"tIME" not in png and b"Software" not in png
    html = first["leaderboard.html"].decode()
    assert html.count("data:image/png;base64,") == 2 and "<script>" in html and 'class="sortable"' in html
    readme = first["README.md"].decode()
    assert "## copy" in readme and "plots/copy_exact_match.png" in readme and "## Reproduce" in readme
    assert "lengthgen sweep --task copy --attn asentmax,softmax --pos nape --seeds 0,1,2 --preset quick " \
           "--steps 10 --max-factor 8 --eval-samples 100 --out sweep" in readme
    csv = first["leaderboard.csv"].decode().splitlines()
    assert csv[0].startswith("task,source,method,pos,recipe,factor,eval_length,n_seeds,exact_match,ci_lo")


def test_reproduce_commands_keep_position_schemes_apart() -> None:
    """A scheme run with only some backends gets its own command, not the cross product."""
    nape = make_rows(ROWS)
    curves = {("softmax", 0): [1.0, 0.9, 0.8, 0.7], ("softmax", 1): [1.0, 0.8, 0.7, 0.6]}
    alibi = make_rows(curves, pos="alibi")
    readme = render(pd.concat([nape, alibi], ignore_index=True), source="sweep").files["README.md"].decode()
    commands = [line for line in readme.splitlines() if line.startswith("lengthgen sweep")]
    assert commands == [
        "lengthgen sweep --task copy --attn asentmax,softmax --pos nape --seeds 0,1,2 --preset quick "
        "--steps 10 --max-factor 8 --eval-samples 100 --out sweep",
        "lengthgen sweep --task copy --attn softmax --pos alibi --seeds 0,1 --preset quick --steps 10 "
        "--max-factor 8 --eval-samples 100 --out sweep",
    ]
    _, table = task_table(summarize(pd.concat([nape, alibi], ignore_index=True)), "copy")
    assert [(r.method, r.pos) for r in table][:3] == [("asentmax", "nape"), ("softmax", "alibi"),
                                                      ("softmax", "nape")]


def test_leaderboard_and_plot_commands(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    rows = make_rows(ROWS)
    for run_id, part in rows.groupby("run_id"):
        write_parquet_atomic(part, sweep / "data" / f"{run_id}.parquet")
        write_parquet_atomic(part, sweep / "runs" / str(run_id) / "results.parquet")  # not read twice
    assert len(load_rows(sweep)) == len(rows)
    out = tmp_path / "board"
    result = runner.invoke(app, ["leaderboard", str(sweep), "--out", str(out), "--hardware", "2-core CPU"])
    assert result.exit_code == 0, result.output
    snapshot = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert len(snapshot) == 5 and "hardware: 2-core CPU" in (out / "README.md").read_text()
    again = runner.invoke(app, ["leaderboard", str(sweep), "--out", str(out), "--hardware", "2-core CPU"])
    assert again.exit_code == 0
    assert snapshot == {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    for kind, name in (("exact", "copy_exact_match.png"), ("dispersion", "copy_dispersion.png")):
        figure = tmp_path / f"{kind}.png"
        plotted = runner.invoke(app, ["plot", str(sweep), "--task", "copy", "-o", str(figure),
                                      "--kind", kind])
        assert plotted.exit_code == 0, plotted.output
        assert figure.read_bytes() == (out / "plots" / name).read_bytes()
    missing = runner.invoke(app, ["plot", str(sweep), "--task", "sort", "-o", str(tmp_path / "x.png")])
    assert missing.exit_code == 2 and "tasks with results: copy" in missing.stderr
    empty = runner.invoke(app, ["leaderboard", str(tmp_path / "nothing"), "--out", str(out)])
    assert empty.exit_code == 2 and "no results" in empty.stderr
