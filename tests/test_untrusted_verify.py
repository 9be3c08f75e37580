"""``lengthgen verify`` on folders from someone else, and the page's claim that follows the data: a
run is verified all or nothing, one bad row never stops the others, the report lands where the
user says and names the rows it checked, and a board calls a run re-derived only while its rows
are those rows (a row edited after the check, a submission's own report, an older report without
digests: none counts). Runs are tiny."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.harness.recorded import verify
from lengthgen.harness.storage.results import load_results, write_parquet_atomic
from lengthgen.leaderboard.verified import coverage, verification_line
from lengthgen.plans.plan import board_run_ids, load_plan, survey
from tests.hostile import forged, relabel

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory, tiny_sweep: Callable[[Path], Path]) -> Path:
    """A sweep of two tiny runs (flip_flop, softmax and entmax, 1× and 2×)."""
    return tiny_sweep(tmp_path_factory.mktemp("published") / "sweep")


@pytest.fixture
def folder(published: Path, tmp_path: Path) -> Path:
    """A copy of the sweep's data (no models: someone else's published folder)."""
    target = tmp_path / "board"
    shutil.copytree(published / "data", target / "data")
    return target


def data_file(folder: Path, backend: str) -> Path:
    return next((folder / "data").glob(f"flip_flop-{backend}-*.parquet"))


def run_verify(folder: Path, *args: str) -> tuple[int, list[str], dict]:  # type: ignore[type-arg]
    """verify, its ✓/✗ lines and the report it wrote (``--report`` inside ``folder`` unless given)."""
    report = folder / "verify.json"
    result = runner.invoke(app, ["verify", str(folder), *(args or ("--report", str(report)))])
    lines = [line for line in result.output.splitlines() if line.startswith(("✓", "✗"))]
    written = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else {}
    return result.exit_code, lines, written


def page_line(folder: Path) -> str:
    result = runner.invoke(app, ["leaderboard", str(folder), "--out", str(folder.parent / "page")])
    assert result.exit_code == 0, result.output
    meta = (folder.parent / "page" / "README.md").read_text(encoding="utf-8").splitlines()[2]
    return meta


# -- 8: a run with a bad row is not ✓; one bad row never stops the others ------------------------------
BAD_ROWS = {
    "a fraction above 1": ({"exact_match": 5.0}, "exact_match 5.0 is not a fraction in [0, 1]"),
    "a mean outside its interval": ({"exact_match": 1.0, "exact_match_lo": 0.0, "exact_match_hi": 0.5},
                                    "lies outside its interval"),
    "an odd factor": ({"factor": 3, "eval_length": None}, "factor 3 is not a power of two"),
    "a huge factor": ({"factor": 2**21, "eval_length": None}, "is not a power of two up to 1,048,576"),
    "a million threads": ({"torch_threads": 10**6}, "torch_threads 1000000 is over the limit of 512"),
    "2**62 threads": ({"torch_threads": 2**62}, "is over the limit of 512"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_run_with_a_bad_row_is_not_verified_and_the_others_are(folder: Path, case: str) -> None:
    """Before: 5.0 in one of two rows gave ✓ and "4 of 4 runs re-derived"; factor 3 stopped verify
    with exit 2 and no report; a million threads crashed it (rc 139)."""
    edit, reason = BAD_ROWS[case]
    path = data_file(folder, "entmax")
    rows = pd.read_parquet(path)
    bad = rows.iloc[[-1]].assign(**edit)
    if "eval_length" in edit:  # a factor copied with its length made to match (factor 3, length 3·L)
        bad["eval_length"] = bad["factor"] * bad["train_length"]
        bad["factor"] = bad["factor"].astype("int64")
        rows = pd.concat([rows, bad], ignore_index=True)
    else:
        rows = pd.concat([rows.iloc[:-1], bad], ignore_index=True)
    write_parquet_atomic(rows, path)
    code, lines, report = run_verify(folder)
    assert code == 1 and len(lines) == 2, lines
    [cross] = [line for line in lines if line.startswith("✗")]
    assert "-entmax-" in cross and "published rows unusable" in cross and reason in cross
    assert any(line.startswith("✓ flip_flop-softmax-") for line in lines)
    entry = next(v for k, v in report["runs"].items() if "-entmax-" in k)
    assert entry["ok"] is False and reason in entry["detail"]
    assert "0 of 2 runs re-derived" not in page_line(folder)  # the page: only the other run
    assert "1 of 2 runs re-derived" in page_line(folder)


def test_a_run_that_fails_to_re_derive_is_crossed_and_the_others_go_on(
        folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = verify.rederive

    def failing(config, *args, **kwargs):  # type: ignore[no-untyped-def]
        if config.attn == "entmax":
            raise ValueError("max_factor must be a power of two")
        return real(config, *args, **kwargs)

    monkeypatch.setattr(verify, "rederive", failing)
    checks = verify.verify(folder, echo=lambda line: None, report=folder / "verify.json")
    by = {c.run_id.split("-")[1]: c for c in checks}
    assert not by["entmax"].ok and "could not be re-derived: ValueError: max_factor" in by["entmax"].detail
    assert by["softmax"].ok
    assert len(json.loads((folder / "verify.json").read_text())["runs"]) == 2


# -- 6: the report goes where the user says -----------------------------------------------------------
def test_the_report_lands_where_it_is_told(folder: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: verify DIR wrote DIR/verify.json, into someone else's folder (and into data/ for
    verify DIR/data, where no board looks)."""
    elsewhere = tmp_path / "reports" / "mine.json"
    code, _, _ = run_verify(folder, "--report", str(elsewhere))
    assert code == 0 and elsewhere.is_file() and not (folder / "verify.json").exists()
    report = json.loads(elsewhere.read_text())
    assert report["format"] == 2 and set(report["data"]["runs"]) == set(report["runs"])
    assert all(len(v["digest"]) == 16 and v["rows"] == len(v["factors"]) for v in report["runs"].values())
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    assert runner.invoke(app, ["verify", str(folder / "data"), "--sample", "1"]).exit_code == 0
    assert (work / "verify.json").is_file() and not (folder / "data" / "verify.json").exists()
    assert sorted(os.listdir(folder)) == ["data"]  # nothing written into the folder under test
    refused = runner.invoke(app, ["verify", str(folder), "--report", str(work)])  # a folder
    assert refused.exit_code == 2 and "--report" in refused.output
    readme = work / "README.md"  # a typo must not overwrite a file that is no report
    readme.write_text("# mine\n", encoding="utf-8")
    refused = runner.invoke(app, ["verify", str(folder), "--report", str(readme)])
    assert refused.exit_code == 2 and "is a file that is not a verify report" in refused.output
    assert readme.read_text(encoding="utf-8") == "# mine\n" and "✓" not in refused.output  # nothing trained


def test_the_html_page_shows_the_verification_s_first_clause_and_folds_the_rest(folder: Path) -> None:
    """The README keeps the whole line; the HTML page keeps its first screen for the answer: the
    data line, then "k of n runs re-derived …" as a folded element holding the other clauses."""
    code, _, _ = run_verify(folder)
    line = page_line(folder)
    html = (folder.parent / "page" / "leaderboard.html").read_text(encoding="utf-8")
    shown = re.search(r'<p class="meta">(.*?)</p>', html)
    folded = re.search(r'<details id="verified"><summary>(.*?)</summary>\n<ul>(.*?)</ul>', html)
    assert code == 0 and "re-derived" in line and "rows here are rows it checked" in line
    assert shown and "Data as of" in shown[1] and "re-derived" not in shown[1]
    assert folded and folded[1].startswith("2 of 2 runs re-derived from their recorded configs")
    assert "rows here are rows it checked" in folded[2]


# -- 5, 43.4: the page's claim follows the data --------------------------------------------------------
def test_an_edited_row_after_verification_is_no_longer_called_re_derived(folder: Path) -> None:
    code, _, _ = run_verify(folder)
    assert code == 0 and page_line(folder).count("2 of 2 runs re-derived") == 1
    path = data_file(folder, "softmax")
    rows = pd.read_parquet(path)
    write_parquet_atomic(forged(rows, rows["factor"] == 2), path)  # the reader cannot tell it from honest
    line = page_line(folder)
    assert "1 of 2 runs re-derived" in line
    assert "1 run whose rows changed after the check, so no longer covered: flip_flop-softmax-" in line
    for file in (folder / "data").glob("*.parquet"):  # every exact_match made 1.0, intervals to match
        rows = pd.read_parquet(file)
        write_parquet_atomic(forged(rows, rows["factor"] > 0, hits=int(rows["n_samples"].iloc[0])), file)
    assert "0 of 2 runs re-derived" in page_line(folder)


def test_a_run_extended_or_added_since_is_named(folder: Path) -> None:
    run_verify(folder)
    path = data_file(folder, "entmax")
    rows = pd.read_parquet(path)
    longer = rows[rows["factor"] == 2].assign(factor=4, eval_length=lambda r: 4 * r["train_length"])
    write_parquet_atomic(pd.concat([rows, longer], ignore_index=True), path)  # evaluated at 4× since
    other = relabel(pd.read_parquet(data_file(folder, "softmax")), preset="paper-tasks")
    write_parquet_atomic(other, folder / "data" / f"{other['run_id'].iloc[0]}.parquet")  # a new run
    line = page_line(folder)
    assert "1 of 3 runs re-derived" in line
    assert "1 run extended since (flip_flop-entmax-" in line and "2 → 3 rows" in line
    assert "since the verified data (data commit unknown, 2 runs), 1 run added and 1 run evaluated at more " \
           "lengths" in line


def test_rows_of_an_evaluation_variant_are_said_not_to_be_re_derived(folder: Path) -> None:
    """Before: the page's "re-derived" line covered runs with variant rows it never re-derived."""
    run_verify(folder)
    path = data_file(folder, "softmax")
    rows = pd.read_parquet(path)
    variant = rows[rows["factor"] == 1].assign(eval_variant="attn=entmax")  # `eval --attn entmax`
    write_parquet_atomic(pd.concat([rows, variant], ignore_index=True), path)
    line = page_line(folder)
    assert "2 of 2 runs re-derived" in line and "rows of evaluation variants (1) are not re-derived" in line


def test_a_submissions_own_verify_json_is_never_taken(folder: Path, tmp_path: Path) -> None:
    """Before: a hand-written verify.json in a submission showed its runs as re-derived."""
    sub = tmp_path / "sub"
    shutil.copytree(folder / "data", sub / "data")
    for file in (sub / "data").glob("*.parquet"):  # its own runs (another preset: other run ids)
        write_parquet_atomic(relabel(pd.read_parquet(file), preset="paper-tasks"), file)
        file.rename(file.with_name(f"{pd.read_parquet(file)['run_id'].iloc[0]}.parquet"))
    checks = [verify.RunCheck(run, True, f"{len(rows)} rows", rows=len(rows), digest=verify.rows_digest(rows),
                              factors=tuple(int(f) for f in rows["factor"]))
              for run, rows in verify.published_runs(sub).items()]  # a report naming exactly its rows
    data = {"commit": "x", "runs": {c.run_id: c.rows for c in checks}}
    verify.write_report(sub / "verify.json", checks, data)
    (sub / "source.toml").write_text('name = "sub"\n', encoding="utf-8")
    result = runner.invoke(app, ["leaderboard", str(folder), str(sub), "--out", str(tmp_path / "page")])
    assert result.exit_code == 0, result.output
    readme = (tmp_path / "page" / "README.md").read_text(encoding="utf-8")
    row = next(line for line in readme.splitlines() if line.startswith("| sub |"))
    assert "| not verified |" in row and "re-derived" not in readme.splitlines()[2]


def test_a_report_without_row_digests_covers_nothing(folder: Path) -> None:
    runs = sorted(verify.published_runs(folder))
    entry = {"ok": True, "date": "2026-12-01", "commit": "abc", "detail": "2 rows", "warning": ""}
    legacy = {"total_runs": 2, "runs": dict.fromkeys(runs, entry)}
    (folder / "verify.json").write_text(json.dumps(legacy), encoding="utf-8")
    line = page_line(folder)
    assert "0 of 2 runs re-derived" in line
    assert "2 runs checked by a report that does not name the rows" in line


@pytest.mark.parametrize("text", ["[" * 100_000, "not json", '{"runs": 5}', '{"runs": {"x": [1]}}', "link"])
def test_an_unreadable_report_is_no_report(folder: Path, text: str) -> None:
    if text == "link":  # a report elsewhere, linked in: not read
        code, _, _ = run_verify(folder, "--report", str(folder.parent / "real.json"))
        (folder / "verify.json").symlink_to(folder.parent / "real.json")
    else:
        (folder / "verify.json").write_text(text, encoding="utf-8")
    assert verify.read_report(folder) is None or not verify.read_report(folder)["runs"]
    assert "re-derived" not in page_line(folder)


def test_the_published_board_states_its_verification_against_the_current_data() -> None:
    """The committed verify.json (checked on 2026-12-01, on 12 runs) against today's board: one run
    still re-derived, one extended since, the runs added since counted (issue 43)."""
    plan = load_plan(REPO / "leaderboard" / "plan.toml")
    rows = load_results(REPO / "leaderboard")
    rows = rows[rows["run_id"].isin(board_run_ids(survey(plan, REPO / "leaderboard")))]
    report = verify.read_report(REPO / "leaderboard")
    assert report is not None and report["format"] == 2
    found = coverage(report, rows)
    assert found is not None and found.runs == rows["run_id"].nunique()
    current = verify.evaluated_rows(rows)
    for run_id in found.rederived:  # each re-derived run: today's rows are the rows it checked
        assert verify.rows_digest(current[run_id]) == report["runs"][run_id]["digest"]
    for run_id, checked, now in found.extended:
        assert checked == report["runs"][run_id]["rows"] < now == len(current[run_id])
    assert not found.changed and not found.failed and not found.unnamed
    assert found.added == sum(r not in report["data"]["runs"] for r in current)
    line = verification_line(report, rows)
    assert line is not None and line.startswith(f"{len(found.rederived)} of {found.runs} runs re-derived")
    if found.extended:
        assert "extended since" in line and "the newer ones not re-derived" in line
    if found.added:
        assert f"{found.added} runs added" in line
