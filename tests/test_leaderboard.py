"""Leaderboard: intervals and effective length on hand-made rows, learned seeds, selection of settings
by validation (never test) scores, the paper-protocol row, determinism (byte-identical outputs,
independent of row order), and the ``leaderboard``/``plot`` commands."""

from __future__ import annotations

import io
import math
from pathlib import Path

import pandas as pd
import pytest
from scipy import stats as scipy_stats
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.harness.evaluate import wilson_interval
from lengthgen.harness.storage.results import rows_to_frame, write_parquet_atomic
from lengthgen.leaderboard import (
    PAPER_LABEL,
    PROTOCOL_LABEL,
    effective_length,
    effective_table,
    load_rows,
    markdown,
    render,
    seed_interval,
    summarize,
    t_quantile,
    task_settings_table,
    task_table,
)
from tests.leaderboard_rows import ROWS, make_rows

runner = CliRunner()
REPO = Path(__file__).resolve().parents[1]


def texts(row: object) -> list[str]:
    return [c.plain for c in row.cells]  # type: ignore[attr-defined]


def test_t_quantiles_match_tables() -> None:
    known = {1: 12.7062047, 2: 4.3026527, 3: 3.1824463, 4: 2.7764451, 9: 2.2621572, 30: 2.0422725}
    for df, value in known.items():
        assert t_quantile(df) == pytest.approx(value, abs=1e-6)
    with pytest.raises(ValueError):
        t_quantile(0)


def test_run_wilson_interval_is_scipys() -> None:
    """A one-seed cell shows the run's Wilson interval: the same 95% interval scipy computes."""
    for hits, n in ((0, 20), (8, 10), (20, 20), (97, 256), (1, 7)):
        expected = scipy_stats.binomtest(hits, n).proportion_ci(confidence_level=0.95, method="wilson")
        lo, hi = wilson_interval(hits, n)
        assert lo == pytest.approx(expected.low, abs=1e-12) and hi == pytest.approx(expected.high, abs=1e-12)


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


def test_effective_length_stops_where_not_every_seed_was_evaluated() -> None:
    """One seed extended further than the others (an evaluation still in progress): its longer
    lengths are listed with n=1, but the cell's effective length stands on all three seeds."""
    rows = make_rows({("asentmax", s): [1.0, 1.0, 1.0, 1.0] for s in range(3)})
    rows = rows[(rows["seed"] == 0) | (rows["factor"] <= 2)]
    measured = summarize(rows)
    measured = measured[measured["source"] == "measured"].set_index("factor")
    assert measured.loc[8, "n_seeds"] == 1 and measured.loc[2, "n_seeds"] == 3
    assert set(measured["effective_length"]) == {2} and measured["effective_length_capped"].all()
    assert set(measured["effective_length_learned"]) == {2}
    assert measured["effective_length_learned_capped"].all()


def test_summary_cells_and_effective_length() -> None:
    rows = make_rows({**ROWS, ("entmax", 0): [0.95, 0.5]}, failed=(("softmax", 2),))
    summary = summarize(rows)
    measured = summary[summary["source"] == "measured"]
    asent = measured[measured["method"] == "asentmax"].set_index("factor")
    assert asent.loc[2, "exact_match"] == pytest.approx(0.97) and asent.loc[2, "n_seeds"] == 3
    assert asent.loc[2, "ci_lo"] == pytest.approx(0.97 - 4.3026527 * 0.01 / math.sqrt(3))
    assert asent.loc[2, "per_seed"] == "s0=0.980000;s1=0.960000;s2=0.970000"
    assert set(asent["effective_length"]) == {4} and not asent["effective_length_capped"].any()
    soft = measured[measured["method"] == "softmax"].iloc[0]
    assert (soft["effective_length"], soft["runs"], soft["runs_failed"]) == (1, 3, 1)
    assert soft["learned_seeds"] == 3
    entmax = measured[measured["method"] == "entmax"].set_index("factor")
    assert entmax.loc[1, "ci_method"] == "wilson" and entmax.loc[1, "ci_lo"] == pytest.approx(
        wilson_interval(95, 100)[0])
    paper = summary[summary["source"] == "paper"]
    assert set(paper["method"]) == {"softmax", "entmax", "asentmax"}  # the paper reports Copy for these three
    assert set(paper["effective_length"]) == {32}  # its 32× column: 96.1–96.3%

    table = task_table(summary, "copy")
    headers = [h.text for h in table.headers]
    assert headers[:2] == ["backend", "learned"]  # one position scheme: no column for it
    assert headers[2:9] == ["ID (1×)", "2×", "4×", "8×", "16×", "32×", "64×"]  # ours 1..8, the paper's 16..64
    assert [r.cells[0].text for r in table.rows] == ["asentmax", "entmax", "softmax"]
    first = texts(table.rows[0])
    assert first[3] == "97.0 [94.5, 99.5]" and first[-1] == "4× seeds 4 / 4 / 4" and first[1] == "3/3"
    assert texts(table.rows[1])[2] == "95.0 [88.8, 97.8]" and texts(table.rows[1])[4] == "—"  # entmax: to 2x
    assert texts(table.rows[2])[-1] == "1× seeds 2 / 1 / 1"  # softmax: the mean holds 1×, a seed 2×
    pinned = [(r.kind, r.cells[0].text) for r in table.pinned]
    assert pinned == [("protocol", f"{PROTOCOL_LABEL}: softmax"), ("paper", f"{PAPER_LABEL}: softmax"),
                      ("protocol", f"{PROTOCOL_LABEL}: entmax"),
                      ("paper", f"{PAPER_LABEL}: entmax (see note)"),
                      ("protocol", f"{PROTOCOL_LABEL}: asentmax"), ("paper", f"{PAPER_LABEL}: asentmax")]
    assert "32..64" in PAPER_LABEL and "suspect" in table.pinned[3].cells[0].title
    assert texts(table.pinned[1])[6:9] == ["99.4", "96.1", "85.5"]
    settings_table = task_settings_table(summary, "copy")
    assert [h.text for h in settings_table.headers] == ["backend", "pos", "setting", "runner-up", "seeds",
                                                        "failed"]
    assert [texts(r)[4:] for r in settings_table.rows] == [["3", "0"], ["1", "0"], ["3", "1"]]


def test_all_failed_method_still_listed() -> None:
    rows = rows_to_frame([{"run_id": "copy-x-nape-s0-1", "task": "copy", "attn": "x", "pos": "nape",
                           "seed": 0, "status": "failed", "error": "TrainingDiverged: loss is nan"}])
    summary = summarize(rows)
    row = task_table(summary, "copy").rows[0]
    assert row.cells[0].text == "x" and texts(row)[-1] == "— 0/1 learned" and texts(row)[1] == "0/1"
    assert texts(task_settings_table(summary, "copy").rows[0])[-2:] == ["1", "1"]  # 1 seed, 1 failed


def test_learned_seeds_on_the_published_leaderboard() -> None:
    """Over the committed quick-preset MQMTAR runs (the first published board, now an ablation),
    softmax (NAPE) learned with one seed of three."""
    rows = load_rows(REPO / "leaderboard" / "ablations" / "mqmtar-task-protocol")
    rows = rows[rows["preset"] == "quick"]
    summary = summarize(rows[rows["task"] == "mqmtar"])
    row = next(r for r in task_table(summary, "mqmtar").rows if texts(r)[:2] == ["softmax", "nape"])
    assert texts(row)[2] == "1/3"
    exact_1x = rows[(rows["task"] == "mqmtar") & (rows["attn"] == "softmax") & (rows["pos"] == "nape")
                    & (rows["factor"] == 1)].sort_values("seed")["exact_match"]
    assert sum(v >= 0.9 for v in exact_1x) == 1  # the same count from the raw rows
    assert "s0 0.0%" in row.cells[2].title and row.cells[3].title.endswith("s0 0.0%, s1 0.0%, s2 99.6%")
    # These rows predate validation scores: one setting per row (nothing to choose), no protocol row;
    # they drew MQMTAR's first stream, where the quick preset now draws its second.
    chosen = next(r for r in task_settings_table(summary, "mqmtar").rows
                  if texts(r)[:2] == ["softmax", "nape"])
    assert texts(chosen)[2:4] == ["task_params.stream=1", "—"]
    protocol = [r for r in task_table(summary, "mqmtar").pinned if r.kind == "protocol"]
    assert protocol and all("n/a: runs predate validation columns" in texts(r)[2] for r in protocol)


def two_settings(val_low_lr: tuple[float, float], val_high_lr: tuple[float, float] | None) -> pd.DataFrame:
    """Softmax at two learning rates, 2 seeds each: the high rate tests better, the low rate validates
    as given."""
    low = make_rows({("softmax", 0): [0.92, 0.5], ("softmax", 1): [0.90, 0.4]}, lr=1e-3,
                    val={("softmax", s): val_low_lr for s in (0, 1)})
    high = make_rows({("softmax", 0): [1.0, 0.9], ("softmax", 1): [1.0, 0.8]}, lr=2e-3,
                     val={("softmax", s): val_high_lr for s in (0, 1)} if val_high_lr else None)
    return pd.concat([low, high], ignore_index=True)


def test_setting_chosen_by_validation_never_by_test() -> None:
    summary = summarize(two_settings((0.95, 0.10), (0.80, 0.90)))
    table = task_table(summary, "copy")
    assert len(table.rows) == 1  # one row per (backend, scheme): the chosen setting
    row = texts(task_settings_table(summary, "copy").rows[0])
    assert row[2] == "train.lr=0.001 · val 95.0" and row[3] == "train.lr=0.002 · val 80.0"
    assert texts(table.rows[0])[2] == "91.0 [78.3, 100.0]"  # the lower rate's, though the other tests better
    chosen = summary[(summary["source"] == "measured") & summary["chosen"]]
    assert set(chosen["setting"]) == {"train.lr=0.001"} and set(chosen["runner_up"]) == {"train.lr=0.002"}
    assert set(summary.loc[~summary["chosen"], "selection"]) == {"not chosen"}  # the loser stays in the CSV
    # The paper protocol picks the best single run on 8x validation: a high-rate run.
    protocol = summary[(summary["source"] == "protocol")]
    assert set(protocol["setting"]) == {"seed 0, train.lr=0.002"}
    assert protocol["selection"].iloc[0] == "best of 4 runs by 8× validation (90.0%)"
    assert list(protocol["exact_match"]) == [1.0, 0.9]


def test_settings_without_validation_scores_are_not_ranked() -> None:
    summary = summarize(two_settings((0.95, 0.1), None))
    table = task_table(summary, "copy")
    chosen = task_settings_table(summary, "copy")
    assert [texts(r)[2] for r in chosen.rows] == ["train.lr=0.001 · val 95.0", "train.lr=0.002"]
    assert {texts(r)[3] for r in chosen.rows} == {"—"}
    assert set(summary.loc[summary["source"] == "measured", "selection"]) == {
        "n/a: runs predate validation columns: 2 settings shown separately"}
    protocol = [r for r in table.pinned if r.kind == "protocol"]
    assert texts(protocol[0])[1].startswith("n/a: runs predate validation columns")


def test_failed_training_counts_as_zero_for_selection() -> None:
    good = make_rows({("softmax", 0): [0.9]}, lr=1e-3, val={("softmax", 0): (0.9, 0.2)})
    diverged = rows_to_frame([{**good.iloc[0].to_dict(), "status": "failed", "error": "TrainingDiverged",
                               "factor": None, "val_exact_id": None, "val_exact_8x": None,
                               "run_id": "copy-softmax-nape-s1-x", "seed": 1}])
    other = make_rows({("softmax", 0): [0.5], ("softmax", 1): [0.5]}, lr=2e-3,
                      val={("softmax", 0): (0.5, 0.5), ("softmax", 1): (0.5, 0.5)})
    summary = summarize(pd.concat([good, diverged, other], ignore_index=True))
    chosen = summary[(summary["source"] == "measured") & summary["chosen"]].iloc[0]
    # 0.9 and 0 (diverged) average 0.45 < 0.5: the setting that trained on both seeds wins.
    assert chosen["setting"] == "train.lr=0.002" and chosen["runner_up_val_exact_id"] == pytest.approx(0.45)


def test_effective_length_summary_table() -> None:
    sort = make_rows({("softmax", 0): [1.0, 1.0]}, task="sort")
    rows = pd.concat([make_rows(ROWS), sort], ignore_index=True)
    table = effective_table(summarize(rows))
    # each task's column names the preset and the number of seeds behind its cells
    assert [h.text for h in table.headers] == ["backend", "pos", "copy (quick, 3 seeds)",
                                               "sort (quick, 1 seed)"]
    assert [texts(r) for r in table.rows] == [["asentmax", "nape", "4× seeds 4 / 4 / 4", ""],
                                              ["softmax", "nape", "1× seeds 2 / 1 / 1", "≥ 2×"]]
    paper_softmax = next(r for r in table.pinned if texts(r)[0] == f"{PAPER_LABEL}: softmax")
    assert texts(paper_softmax)[2:] == ["32×", "1×"]
    assert "| backend | pos | copy (quick, 3 seeds) | sort (quick, 1 seed) |" in markdown(table)


def test_effective_length_over_learned_seeds_beside_all_seeds() -> None:
    """A seed that did not learn drags the mean down to "did not extrapolate"; the cell also gives
    the effective length over the seeds that learned, and the CSV leaves a missing one empty."""
    curves = {("asentmax", 0): [1.0, 0.95, 0.92, 0.91], ("asentmax", 1): [0.98, 0.97, 0.93, 0.5],
              ("asentmax", 2): [0.0, 0.0, 0.0, 0.0], ("softmax", 0): [0.3, 0.1, 0.0, 0.0]}
    summary = summarize(make_rows(curves))
    table = task_table(summary, "copy")
    by_backend = {texts(r)[0]: texts(r) for r in table.rows}
    # all seeds: mean 1x = 0.66 < 0.9, so none; the two learned seeds hold >= 90% up to 4x
    assert by_backend["asentmax"][1] == "2/3"
    assert by_backend["asentmax"][-1] == "— 4× over 2/3 learned · seeds ≥ 8 / 4 / —"  # seed 0 holds to 8×
    assert by_backend["softmax"][-1] == "— 0/1 learned"
    effective = effective_table(summary)
    assert [texts(r)[2] for r in effective.rows] == ["— 4× over 2/3 learned · seeds ≥ 8 / 4 / —",
                                                     "— 0/1 learned"]
    csv = pd.read_csv(io.BytesIO(render(make_rows(curves)).files["leaderboard.csv"]))
    measured = csv[csv["source"] == "measured"].set_index(["method", "factor"])
    assert pd.isna(measured.loc[("softmax", 1), "effective_length"])  # empty, never 0
    assert pd.isna(measured.loc[("asentmax", 1), "effective_length"])
    assert measured.loc[("asentmax", 1), "effective_length_learned"] == 4
    assert not measured.loc[("asentmax", 1), "effective_length_learned_capped"]
    assert (csv["effective_length"].dropna() > 0).all()


def test_outputs_are_deterministic() -> None:
    rows = make_rows(ROWS, failed=(("softmax", 2),), val={k: (0.9, 0.5) for k in ROWS})
    first = render(rows, source="sweep", out_name="board", commit="abc1234").files
    shuffled = rows.sample(frac=1.0, random_state=3).reset_index(drop=True)
    second = render(shuffled, source="sweep", out_name="board", commit="abc1234").files
    assert sorted(first) == ["README.md", "leaderboard.csv", "leaderboard.html", "plots/copy_dispersion.svg",
                             "plots/copy_exact_match.svg", "plots/overview.svg"]
    for name in first:
        assert first[name] == second[name], name
    for name in ("plots/copy_exact_match.svg", "plots/copy_dispersion.svg"):
        svg = first[name]
        assert svg.startswith(b"<?xml") and b"<dc:date>" not in svg and b"Matplotlib v" not in svg
    html = first["leaderboard.html"].decode()
    assert html.count("data:image/svg+xml;base64,") == 3 and "<script>" in html
    # effective length, copy and its settings, paper vs ours, protocol, commits
    assert html.count('class="sortable"') == 6
    assert '<meta name="viewport"' in html and 'href="leaderboard.csv"' in html and 'href="README.md"' in html
    assert "Data as of 2026-01-03 00:00 UTC (newest run), data commit abc1234" in html
    readme = first["README.md"].decode()
    assert "## copy" in readme and "plots/copy_exact_match.svg" in readme and "## Reproduce" in readme
    assert "lengthgen sweep --task copy --attn asentmax,softmax --pos nape --seeds 0,1,2 --preset quick " \
           "--steps 10 --max-factor 8 --eval-samples 100 --out sweep" in readme
    csv = first["leaderboard.csv"].decode().splitlines()
    assert csv[0].startswith("task,source,method,pos,setting,setting_detail,recipe,chosen,selection,")
    assert "learned_seeds" in csv[0] and "per_seed" in csv[0]


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
    table = task_table(summarize(pd.concat([nape, alibi], ignore_index=True)), "copy")
    assert [tuple(texts(r)[:2]) for r in table.rows] == [("asentmax", "nape"), ("softmax", "alibi"),
                                                         ("softmax", "nape")]


def test_leaderboard_and_plot_commands(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    rows = make_rows(ROWS)
    for run_id, part in rows.groupby("run_id"):
        write_parquet_atomic(part, sweep / "data" / f"{run_id}.parquet")
        write_parquet_atomic(part, sweep / "runs" / str(run_id) / "results.parquet")  # not read twice
    assert len(load_rows(sweep)) == len(rows)
    out = tmp_path / "board"
    args = ["leaderboard", str(sweep), "--out", str(out), "--hardware", "2-core CPU"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    snapshot = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert len(snapshot) == 6 and "hardware: 2-core CPU" in (out / "README.md").read_text()
    html = (out / "leaderboard.html").read_text()
    assert 'href="../sweep/data/"' in html and "data commit unknown" in html  # not a git repository
    again = runner.invoke(app, args)
    assert again.exit_code == 0
    assert snapshot == {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    pinned = runner.invoke(app, args, env={"LENGTHGEN_COMMIT": "0123abc"})
    assert pinned.exit_code == 0 and "data commit 0123abc" in (out / "leaderboard.html").read_text()

    for kind, name in (("exact", "copy_exact_match.svg"), ("dispersion", "copy_dispersion.svg")):
        figure = tmp_path / f"{kind}.svg"
        plot = ["plot", str(sweep), "--task", "copy", "-o", str(figure), "--kind", kind]
        plotted = runner.invoke(app, plot)
        assert plotted.exit_code == 0, plotted.output
        assert figure.read_bytes() == (out / "plots" / name).read_bytes()
    png = runner.invoke(app, ["plot", str(sweep), "--task", "copy", "-o", str(tmp_path / "exact.png")])
    assert png.exit_code == 0 and (tmp_path / "exact.png").read_bytes().startswith(b"\x89PNG")
    for bad, message in ((["--task", "sort", "-o", str(tmp_path / "x.png")], "tasks with results: copy"),
                         (["--task", "copy", "-o", str(tmp_path / "x.pdf")], "must end in .svg or .png")):
        failed = runner.invoke(app, ["plot", str(sweep), *bad])
        assert failed.exit_code == 2 and message in failed.stderr
    empty = runner.invoke(app, ["leaderboard", str(tmp_path / "nothing"), "--out", str(out)])
    assert empty.exit_code == 2 and "no results" in empty.stderr


def test_task_variant_rows_are_rows_of_their_own() -> None:
    """Rows of a re-evaluation on a variant of the task never mix with the training task's."""
    rows = make_rows({("softmax", 0): [1.0, 0.9], ("softmax", 1): [1.0, 0.8]})
    variant = rows.assign(eval_variant="n_pairs=8", exact_match=0.5)
    table = task_table(summarize(pd.concat([rows, variant], ignore_index=True)), "copy")
    assert [(texts(r)[0], texts(r)[2].split()[0]) for r in table.rows] == [("softmax", "100.0"),
                                                                         ("softmax [n_pairs=8]", "50.0")]
