"""Submissions: several result folders on one board, each row labelled with its source, a
plugin's backend with its distribution and version, a tampered row refused."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.attention import ATTENTION
from lengthgen.cli import app
from lengthgen.errors import UserNotice
from lengthgen.leaderboard.sources import describe_folder, load_sources
from tests.hostile import result_folder
from tests.leaderboard_rows import ROWS, make_rows

runner = CliRunner()


folder = result_folder


def test_a_folder_names_itself_or_is_named_after_its_folder(tmp_path: Path) -> None:
    own = folder(tmp_path, "ours", make_rows(ROWS))
    alice = folder(tmp_path, "sub1", make_rows({("entmax", 0): [1.0, 0.5]}),
                   'name = "alice"\nwho = "Alice A."\ncontact = "alice@example.org"\ncommit = "abc123"\n')
    bob = folder(tmp_path, "bob-results", make_rows({("entmax", 0): [0.9, 0.4]}))
    (bob / "SOURCE.md").write_text("# bob\n\nEntmax at α = 1.5, one seed.\n", encoding="utf-8")
    assert describe_folder(str(own)).label == "ours"
    assert describe_folder(str(alice)).who == "Alice A." and describe_folder(str(alice)).commit == "abc123"
    assert describe_folder(str(bob)).label == "bob" and "one seed" in describe_folder(str(bob)).what
    rows, sources = load_sources([str(own), str(alice), str(bob)])
    assert [s.label for s in sources] == ["ours", "alice", "bob"] and sources[0].primary
    assert sorted(set(rows["source"])) == ["", "alice", "bob"]


def test_submissions_join_the_board_with_their_origin(tmp_path: Path) -> None:
    own = folder(tmp_path, "ours", make_rows(ROWS))
    theirs = make_rows({("softmax", 0): [1.0, 0.95, 0.9, 0.5], ("entmax", 0): [1.0, 0.9, 0.8, 0.7]})
    alice = folder(tmp_path, "sub", theirs, 'name = "alice"\nwho = "Alice A."\nwhat = "entmax runs"\n')
    result = runner.invoke(app, ["leaderboard", str(own), str(alice), "--out", str(tmp_path / "board")])
    assert result.exit_code == 0, result.output
    readme = (tmp_path / "board" / "README.md").read_text(encoding="utf-8")
    table = readme[readme.index("## copy"):readme.index("The paper's protocol")]
    lines = [line for line in table.splitlines() if line.startswith("| ")]
    backends = [line.split(" | ")[0].removeprefix("| ") for line in lines]
    assert {"softmax", "asentmax", "softmax @ alice", "entmax @ alice"} <= set(backends)
    sources = readme[readme.index("## Sources"):readme.index("## Protocol")]
    assert "| ours (this board) |" in sources and "| alice |" in sources and "Alice A." in sources
    csv = pd.read_csv(tmp_path / "board" / "leaderboard.csv")
    ours_softmax = csv[(csv["method"] == "softmax") & (csv["source"] == "measured") & (csv["factor"] == 8)]
    assert list(ours_softmax["n_seeds"]) == [3]  # alice's softmax run did not join ours
    reproduce = readme[readme.index("## Reproduce"):]
    assert "# alice" in reproduce and f"--out {alice}" in reproduce


def test_a_tampered_submitted_row_is_refused_with_a_warning(tmp_path: Path) -> None:
    own = folder(tmp_path, "ours", make_rows(ROWS))
    forged = make_rows({("entmax", 0): [1.0, 1.0]})
    config = json.loads(forged["config_json"].iloc[0])
    config["train"]["steps"] = 100_000  # claims a longer training than the run id was made for
    forged["config_json"] = json.dumps(config, sort_keys=True, separators=(",", ":"))
    mallory = folder(tmp_path, "mallory", forged)
    with pytest.warns(UserNotice, match=r"skipped .*mallory.*is not the hash of its config_json"):
        result = runner.invoke(app, ["leaderboard", str(own), str(mallory), "--out", str(tmp_path / "board")])
    assert result.exit_code == 0, result.output
    assert "entmax @ mallory" not in (tmp_path / "board" / "README.md").read_text(encoding="utf-8")


def test_a_second_folder_with_a_label_taken_is_skipped_and_a_plan_with_submissions_refused(
        tmp_path: Path) -> None:
    own = folder(tmp_path, "ours", make_rows(ROWS), 'name = "same"\n')
    other = folder(tmp_path, "other", make_rows({("entmax", 1): [1.0, 0.5]}), 'name = "Same "\n')
    with pytest.warns(UserNotice, match="surrounding spaces"):  # "Same " is refused as a name: skipped
        runner.invoke(app, ["leaderboard", str(own), str(other), "--out", str(tmp_path / "b")])
    (other / "source.toml").write_text('name = "SAME"\n', encoding="utf-8")
    with pytest.warns(UserNotice, match="label 'SAME' is already that of another folder"):
        clash = runner.invoke(app, ["leaderboard", str(own), str(other), "--out", str(tmp_path / "b")])
    assert clash.exit_code == 0 and "@ SAME" not in (tmp_path / "b" / "README.md").read_text(encoding="utf-8")
    plan = tmp_path / "plan.toml"
    plan.write_text("[[sweep]]\nname = 'a'\ntask = ['copy']\nattn = ['softmax']\n", encoding="utf-8")
    mixed = runner.invoke(app, ["leaderboard", str(own), str(other), "--plan", str(plan), "--out", "b"])
    assert mixed.exit_code == 2 and "--plan" in mixed.output


def test_a_plugin_backend_shows_its_distribution_and_version(tmp_path: Path) -> None:
    if "relu2" not in ATTENTION:
        pytest.skip("the example plugin (examples/lengthgen-plugin-example) is not installed")
    from importlib import metadata

    rows = make_rows({("relu2", 0): [1.0, 0.5], ("softmax", 0): [1.0, 0.6]}).drop(columns=["attn_package"])
    own = folder(tmp_path, "ours", rows)
    result = runner.invoke(app, ["leaderboard", str(own), "--out", str(tmp_path / "board")])
    assert result.exit_code == 0, result.output
    version = metadata.version("lengthgen-example-plugin")
    readme = (tmp_path / "board" / "README.md").read_text(encoding="utf-8")
    assert f"| relu2 lengthgen-example-plugin {version} |" in readme  # read from the installed entry point
    assert "| softmax |" in readme  # a built-in shows no package
    recorded = rows.assign(attn_package=["lengthgen-example-plugin 9.9" if a == "relu2" else "lengthgen 0.1.0"
                                         for a in rows["attn"]])
    again = folder(tmp_path, "recorded", recorded)
    runner.invoke(app, ["leaderboard", str(again), "--out", str(tmp_path / "board2")])
    assert "| relu2 lengthgen-example-plugin 9.9 |" in (tmp_path / "board2" / "README.md").read_text("utf-8")
