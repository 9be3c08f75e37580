"""Ablations on the leaderboard: every setting of an ablation sweep in its own table, the author's
text beside it, commands that rebuild it (sweep grid and evaluation variants), determinism."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.harness.evaluate import wilson_interval
from lengthgen.harness.storage.results import write_parquet_atomic
from lengthgen.leaderboard.ablations import ablation_table, load_ablations
from lengthgen.leaderboard.reproduce import eval_commands
from tests.leaderboard_rows import make_rows

runner = CliRunner()


ABOUT = "# Does the learning rate matter?\n\nIt does.\n\nA `lr` grid."
VARIANT_SETTING = "train.lr=0.004, train.steps=10, eval.max_factor=2, +1 more"


def _ablation(folder: Path, about: str = ABOUT) -> Path:
    low = make_rows({("entmax", 0): [0.0, 0.0], ("entmax", 1): [0.1, 0.0]}, lr=1e-3,
                    val={("entmax", 0): (0.0, 0.0), ("entmax", 1): (0.1, 0.0)})
    high = make_rows({("entmax", 0): [0.95, 0.4], ("entmax", 1): [0.91, 0.2]}, lr=4e-3,
                     val={("entmax", 0): (0.96, 0.3), ("entmax", 1): (0.9, 0.1)})
    variant = high[high["seed"] == 0].copy()
    variant["eval_variant"] = "attn=softmax"
    variant["exact_match"] = [0.5, 0.1]
    variant["exact_match_lo"], variant["exact_match_hi"] = zip(*(wilson_interval(h, 100) for h in (50, 10)),
                                                               strict=True)
    rows = pd.concat([low, high, variant], ignore_index=True)
    for run_id, group in rows.groupby("run_id"):
        write_parquet_atomic(group.reset_index(drop=True), folder / "lr" / "data" / f"{run_id}.parquet")
    (folder / "lr" / "ABOUT.md").write_text(about, encoding="utf-8")
    return folder


def test_every_setting_of_an_ablation_is_a_row(tmp_path: Path) -> None:
    (ablation,) = load_ablations(_ablation(tmp_path))
    assert ablation.title == "Does the learning rate matter?"
    assert ablation.paragraphs == ("It does.", "A `lr` grid.")
    table = ablation_table(ablation.rows)
    # one task and one position scheme: no column for either (the backend's header names them)
    assert [h.text for h in table.headers][:4] == ["backend", "setting", "seeds", "learned"]
    assert "task copy" in table.headers[0].title and "position scheme nape" in table.headers[0].title
    rows = {(r.cells[0].plain, r.cells[1].text.split(" · ")[0]): [c.plain for c in r.cells]
            for r in table.rows}
    assert set(rows) == {("entmax", "train.lr=0.001"), ("entmax", "train.lr=0.004"),
                         ("entmax [attn=softmax]", VARIANT_SETTING)}
    high = rows[("entmax", "train.lr=0.004")]
    assert high[2:] == ["2", "2/2", "93.0 [67.6, 100.0]", "30.0 [0.0, 100.0]", "1×"]
    low = rows[("entmax", "train.lr=0.001")]
    assert low[2:] == ["2", "0/2", "5.0 [0.0, 68.5]", "0.0 [0.0, 0.0]", "—"]
    plain = rows[("entmax [attn=softmax]", VARIANT_SETTING)]
    assert plain[2:5] == ["1", "0/1", "50.0 [40.4, 59.6]"]


def test_commands_rebuild_the_grid_and_the_variants(tmp_path: Path) -> None:
    (ablation,) = load_ablations(_ablation(tmp_path))
    commands = eval_commands(ablation.rows, ablation.source)
    run_id = ablation.rows[(ablation.rows["eval_variant"] == "attn=softmax")]["run_id"].iloc[0]
    assert commands == [f"lengthgen eval {ablation.source}/runs/{run_id} --max-factor 2 --attn softmax"]
    extended = ablation.rows.copy()
    extended.loc[extended["factor"] == 2, "factor"] = 4  # a length past the config's max_factor (2)
    assert any("--max-factor 4" in c for c in eval_commands(extended, "S"))
    later = ablation.rows[ablation.rows["factor"] == 2]  # a variant evaluated from 2x on only
    assert eval_commands(later, "S") == [f"lengthgen eval S/runs/{run_id} --max-factor 2 --min-factor 2 "
                                         "--attn softmax"]
    # the same variant on every run of the folder: one command for the folder
    base = ablation.rows[ablation.rows["eval_variant"] == ""]
    everywhere = pd.concat([base, base.assign(eval_variant="near_misses=1")], ignore_index=True)
    assert eval_commands(everywhere, "S/") == ["lengthgen eval S --max-factor 2 --param near_misses=1"]
    # a number format, with a task variant: each its own flag
    in_bf16 = pd.concat([base, base.assign(eval_variant="near_misses=1,precision=bf16")], ignore_index=True)
    assert eval_commands(in_bf16, "S/") == ["lengthgen eval S --max-factor 2 --param near_misses=1 "
                                            "--precision bf16"]
    kept = pd.concat([base, base.assign(eval_variant="checkpoint=1500")], ignore_index=True)
    assert eval_commands(kept, "S/") == ["lengthgen eval S --max-factor 2 --checkpoint 1500"]


def test_leaderboard_publishes_ablations(tmp_path: Path) -> None:
    board = make_rows({("softmax", 0): [1.0, 0.5]}, val={("softmax", 0): (1.0, 0.4)})
    for run_id, group in board.groupby("run_id"):
        write_parquet_atomic(group.reset_index(drop=True), tmp_path / "main" / "data" / f"{run_id}.parquet")
    abl = _ablation(tmp_path / "abl")
    args = ["leaderboard", str(tmp_path / "main"), "--out", str(tmp_path / "out"), "--ablations", str(abl),
            "--commit", "abc1234"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    readme = (tmp_path / "out" / "README.md").read_text()
    section = readme[readme.index("## What changes the result"):readme.index("## Protocol and hardware")]
    assert "### Does the learning rate matter?" in section and "It does." in section
    assert "train.lr=0.001,0.004" in section and "--attn softmax" in section
    assert f"--ablations {abl}" in readme
    page = (tmp_path / "out" / "leaderboard.html").read_text()
    assert 'id="ablation-lr"' in page and "<code>lr</code>" in page
    first = {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}
    assert runner.invoke(app, args).exit_code == 0
    assert first == {p.name: p.read_bytes() for p in (tmp_path / "out").rglob("*") if p.is_file()}


def test_an_ablation_without_a_title_is_refused(tmp_path: Path) -> None:
    abl = _ablation(tmp_path / "abl", about="no title line\n")
    result = runner.invoke(app, ["leaderboard", str(abl / "lr"), "--out", str(tmp_path / "out"),
                                 "--ablations", str(abl)])
    assert result.exit_code == 2 and "must start with a '# title' line" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_variant_never_tested_at_1x_does_not_say_no_seed_learned(tmp_path: Path) -> None:
    """A variant tested from 2× on has no 1× score: its learned cell is '—', not '0/1'."""
    (ablation,) = load_ablations(_ablation(tmp_path))
    rows = ablation.rows[(ablation.rows["eval_variant"] == "") | (ablation.rows["factor"] == 2)]
    table = ablation_table(rows)
    learned = {r.cells[0].plain: r.cells[3].plain for r in table.rows
               if r.cells[1].text.startswith(("train.lr=0.004", "eval"))}
    assert learned == {"entmax": "2/2", "entmax [attn=softmax]": "—"}
