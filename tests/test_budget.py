"""The training-budget study's numbers: points from rows, the per-near-miss error, the trend and the
budget it predicts, checked against values worked out by hand."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from lengthgen.leaderboard import render
from lengthgen.leaderboard.budget import (
    ALLOWED_ERROR,
    PAPER_SEQUENCES,
    Point,
    SeedResult,
    budget_table,
    near_miss_error,
    near_miss_share,
    points,
    trend,
)
from lengthgen.leaderboard.budget_page import TITLE, StudySource, answer_line
from tests.leaderboard_rows import study_rows


def test_the_per_near_miss_error_reproduces_the_ablation() -> None:
    """ASEntmax's 95.8% at 8× falls to 57.4% with 8 near misses per query (4 queries: 32 per
    sample): 1.6% per near miss, as ablation mqmtar-near-misses reports (1.3–1.9% per seed)."""
    assert near_miss_error(0.958, 0.574) == pytest.approx(1 - (0.574 / 0.958) ** (1 / 32))
    assert 0.015 < near_miss_error(0.958, 0.574) < 0.017
    assert near_miss_error(0.0, 0.5) is None and near_miss_error(0.9, 0.0) == 1.0
    assert near_miss_error(0.9, 0.95) == 0.0  # planted never scores above plain: no negative error
    assert ALLOWED_ERROR == pytest.approx(1 - 0.95 ** (1 / 136)) and 0.00037 < ALLOWED_ERROR < 0.0004


def test_points_group_runs_by_backend_and_budget() -> None:
    rows = study_rows({("asentmax", 3000, s): {8: 0.96, 256: 0.5 + 0.01 * s, 1024: 0.1} for s in range(3)}
                      | {("asentmax", 12000, 0): {8: 0.99, 256: 0.9}})
    study = points(rows)
    assert [(p.attn, p.steps, p.width, p.sequences, len(p.seeds)) for p in study] == [
        ("asentmax", 3000, 128, 3000 * 64, 3), ("asentmax", 12000, 128, 12000 * 64, 1)]
    first = study[0]
    assert first.values(256) == pytest.approx([0.50, 0.51, 0.52]) and first.values(1024) == [0.1] * 3
    assert first.errors() == pytest.approx([near_miss_error(0.96, 0.5)] * 3)
    assert study[1].values(1024) == []  # not tested there yet


def synthetic(slope: float, intercept: float, budgets: tuple[int, ...] = (3000, 12000, 48000),
              noise: float = 0.3) -> list[Point]:
    """Points whose logit(exact at 1024×) is intercept + slope · log10(sequences) + a fixed seed
    offset (−noise, 0, +noise)."""
    out = []
    for steps in budgets:
        seeds = []
        for s in range(3):
            logit = intercept + slope * math.log10(steps * 64) + noise * (s - 1)
            seeds.append(SeedResult(s, {1024: 1 / (1 + math.exp(-logit))}, {1024: 10**6}, None))
        out.append(Point("asentmax", steps, 128, steps * 64, tuple(seeds)))
    return out


def test_the_trend_recovers_a_known_line_and_its_budget() -> None:
    """logit(p) = −9 + 1.5 · log10(S): 95% (logit 2.944) at log10 S = 7.963, about 92 M sequences."""
    fitted = trend(synthetic(1.5, -9.0), "asentmax", 128)
    assert fitted.budgets == 3 and fitted.seeds == 9
    assert fitted.slope == pytest.approx(1.5, rel=1e-6)
    expected = 10 ** ((math.log(0.95 / 0.05) + 9.0) / 1.5)
    assert fitted.predicted == pytest.approx(expected, rel=1e-3)
    assert fitted.low is not None and fitted.high is not None and fitted.low <= expected <= fitted.high
    assert "reaches 95% at about" in fitted.verdict
    assert ("inside" in fitted.verdict) == (fitted.low <= PAPER_SEQUENCES <= fitted.high)


FLAT_VERDICT = "too wide to support the extrapolation"


def test_the_trend_says_when_it_supports_no_extrapolation() -> None:
    assert "no trend to fit yet" in trend(synthetic(1.5, -9.0, budgets=(3000,)), "asentmax", 128).verdict
    two = trend(synthetic(1.5, -9.0, budgets=(3000, 12000)), "asentmax", 128)
    assert two.slope == pytest.approx(1.5, rel=1e-6) and two.predicted is None and two.low is None
    assert "rises by 1.50 logit units per decade" in two.verdict
    assert "no extrapolation before 3" in two.verdict
    assert "do not support an extrapolation" in trend(synthetic(-0.5, 1.0), "asentmax", 128).verdict
    flat = trend(synthetic(0.05, -3.0, noise=2.0), "asentmax", 128)  # a rise lost in the seeds' spread
    assert flat.slope is not None and flat.slope > 0 and FLAT_VERDICT in flat.verdict


def test_a_rise_that_bends_is_extrapolated_from_its_last_two_budgets_as_a_lower_bound() -> None:
    """Seed logits like the study's ASEntmax: a steep rise from 3,000 to 12,000 steps, a slow one to
    48,000. A line through all three would overstate the pace; the last two budgets' line gives the
    budget for 95%, called a lower bound, and the figure draws it from the 12,000-step budget on."""
    logits = {3000: (-3.4, -4.2, -3.4), 12000: (0.86, 0.51, 0.31), 48000: (1.95, 1.80, 1.70)}
    study = [Point("asentmax", steps, 128, steps * 64,
                   tuple(SeedResult(s, {1024: 1 / (1 + math.exp(-y))}, {1024: 10**6}, None)
                         for s, y in enumerate(ys))) for steps, ys in logits.items()]
    fitted = trend(study, "asentmax", 128)
    mean12, mean48 = sum(logits[12000]) / 3, sum(logits[48000]) / 3
    slope = (mean48 - mean12) / math.log10(4)
    expected = 10 ** (math.log10(12000 * 64) + (math.log(0.95 / 0.05) - mean12) / slope)
    assert fitted.slope == pytest.approx(slope, rel=1e-6)
    assert fitted.predicted == pytest.approx(expected, rel=1e-6)
    assert fitted.start == pytest.approx(12000 * 64) and fitted.budgets == 3
    assert fitted.verdict.startswith("the rise slows: ") and "a lower bound on the budget" in fitted.verdict
    assert fitted.low is not None and fitted.high is not None and fitted.low <= expected <= fitted.high
    straight = trend(synthetic(1.5, -9.0), "asentmax", 128)  # the same seeds' spread, no bend
    assert "the rise slows" not in straight.verdict and straight.start == pytest.approx(3000 * 64)


def test_the_figure_reads_a_trend_beyond_its_budgets_only_where_the_fit_supports_it() -> None:
    """A narrow trend is drawn to the paper's budget and reaches 95% where it predicts; one whose
    range is too wide stops at its last budget, where it passes through the fitted line."""
    from lengthgen.leaderboard.budget import PAPER_SEQUENCES
    from lengthgen.leaderboard.plots import trend_curve

    straight = trend(synthetic(1.5, -9.0), "asentmax", 128)
    assert straight.extrapolates and straight.end == pytest.approx(48000 * 64)
    xs, ys = trend_curve(straight, 1.0) or ([], [])
    assert xs == [pytest.approx(3000 * 64), float(PAPER_SEQUENCES)]
    # by hand: logit(y) = logit(95%) + slope · log10(x / predicted), the slope per decade
    odds = 19 * (PAPER_SEQUENCES / straight.predicted) ** (straight.slope / math.log(10))
    assert ys[1] == pytest.approx(100 * odds / (1 + odds), rel=1e-9)
    flat = trend(synthetic(0.05, -3.0, noise=2.0), "asentmax", 128)
    assert FLAT_VERDICT in flat.verdict and not flat.extrapolates
    xs, _ = trend_curve(flat, 1.0) or ([], [])
    assert xs == [pytest.approx(3000 * 64), pytest.approx(48000 * 64)]


def test_a_budget_with_one_seed_stays_out_of_the_fit() -> None:
    """Resampling one seed gives no spread: the range would be too narrow, so the budget waits."""
    study = synthetic(1.5, -9.0)
    full = trend(study, "asentmax", 128)
    first, *rest = study[-1].seeds
    lone = [*study[:-1], Point("asentmax", 48000, 128, 48000 * 64, (first,))]
    fitted = trend(lone, "asentmax", 128)
    assert fitted.budgets == 2 and fitted.seeds == 6 and fitted.tested == ((3000, 3), (12000, 3), (48000, 1))
    assert fitted.predicted is None and "48,000 steps left out (1 seed so far)" in fitted.verdict
    assert full.predicted is not None and full.tested == ((3000, 3), (12000, 3), (48000, 3))


def test_the_table_gives_means_seeds_and_the_paper() -> None:
    rows = study_rows({("asentmax", 3000, s): {8: 0.96, 256: 0.5, 1024: 0.1 * (s + 1)} for s in range(3)})
    table = budget_table(points(rows))
    cells = [c.plain for c in table.rows[0].cells]
    assert cells[:5] == ["asentmax", "3,000", "128", "192 K", "3"]
    assert cells[6].startswith("20.0 [") and cells[6].endswith("seeds 10.0 / 20.0 / 30.0")
    assert cells[7].startswith("2.02%")  # 1 − (0.5 / 0.96)^(1/32)
    # near misses alone fail 1 − (1 − 0.0202)^136 = 93.9% at 1024x, more than the 90 / 80 / 70% wrong
    assert cells[8].startswith("100% seeds 100 / 100 / 100")
    # 0.2015% per near miss fails 1 − (1 − e)^136 = 24.0% of the samples: half of 50% wrong, a third of 72%
    rows = study_rows({("softmax", 3000, 0): {8: 0.96, 1024: 0.5},
                       ("softmax", 3000, 1): {8: 0.96, 1024: 0.28}}, planted=0.9)
    cells = [c.plain for c in budget_table(points(rows)).rows[0].cells]
    assert cells[8] == "41% seeds 48 / 33"
    assert near_miss_share(0.0023, 0.635) == pytest.approx((1 - 0.9977 ** 136) / 0.365)
    assert near_miss_share(0.01, 1.0) is None and near_miss_share(None, 0.5) is None
    assert [c.plain for c in table.pinned[0].cells][:1] == ["paper: asentmax"]


def test_the_board_section_shows_the_table_the_trend_and_both_figures() -> None:
    from tests.leaderboard_rows import ROWS, make_rows

    scores = {(attn, steps, seed): {8: 0.97, 256: 0.3 + 0.1 * k + 0.02 * seed,
                                    1024: 1 / (1 + math.exp(3 - 1.2 * k - 0.1 * seed))}  # logit-linear
              for attn in ("asentmax", "softmax") for k, steps in enumerate((3000, 12000, 48000))
              for seed in range(3)}
    source = StudySource(study_rows(scores), {"mqmtar": 33}, "leaderboard/budget.toml", "leaderboard/budget")
    files = render(make_rows(ROWS), budget=source).files
    readme = files["README.md"].decode()
    assert f"## {TITLE}" in readme and "18 runs recorded of 33 planned, 18 tested to 1024×" in readme
    assert "| asentmax | 12,000 | 128 | 768 K | 3 |" in readme
    assert ("- asentmax (seeds 3 / 3 / 3 at 3,000 / 12,000 / 48,000 steps): the line reaches 95% at about"
            in readme)
    assert {"plots/budget.svg", "plots/budget_near_misses.svg"} <= set(files)
    html = files["leaderboard.html"].decode()
    assert 'id="budget"' in html and html.count("data:image/svg+xml;base64,") == 5  # 3 board + 2 study
    empty = render(make_rows(ROWS), budget=StudySource(study_rows({}), {"mqmtar": 33}, "p", "d")).files
    assert "0 runs recorded of 33 planned" in empty["README.md"].decode()


def test_a_budget_with_other_seeds_names_them() -> None:
    rows = study_rows({("asentmax", 12000, 1): {8: 0.99, 256: 0.875, 1024: 0.625}})
    cells = [c.plain for c in budget_table(points(rows)).rows[0].cells]
    assert cells[4] == "1" and cells[5] == "87.5 seed 1: 87.5" and cells[6] == "62.5 seed 1: 62.5"
    lone = study_rows({("asentmax", 48000, 0): {8: 0.99, 256: 0.969}})  # one seed, even seed 0, is named
    assert [c.plain for c in budget_table(points(lone)).rows[0].cells][5] == "96.9 seed 0: 96.9"


def test_the_answer_states_each_budget_its_seeds_and_the_paper() -> None:
    """One line for the board's answer: means at 1024x in budget order, with the seeds behind each."""
    scores = {("asentmax", 3000, s): {8: 0.97, 256: 0.5, 1024: 0.125 * s} for s in range(3)}
    scores |= {("asentmax", 12000, 1): {8: 0.99, 256: 0.875, 1024: 0.625}}
    scores |= {("softmax", 3000, s): {8: 0.97, 256: 0.25} for s in range(2)}  # not tested at 1024x yet
    line = answer_line(StudySource(study_rows(scores), {"mqmtar": 33}, "p", "d"))
    assert line == ("mqmtar trained longer (the training-budget study, 6 runs recorded of 33 planned, 4 "
                    "tested to 1024×): exact match at 1024× (width 128, mean over seeds): asentmax 12.5% → "
                    "62.5% (seeds 3 / 1 at 3,000 / 12,000 steps); the paper, after 390,625 steps of 128 "
                    "sequences: asentmax 95.3%.")
    assert answer_line(StudySource(study_rows({}), {"mqmtar": 33}, "p", "d")) is None
    wide = study_rows({("softmax", 12000, 0): {8: 0.97, 1024: 0.5}}, width=256)
    both = StudySource(pd.concat([study_rows(scores), wide], ignore_index=True), {"mqmtar": 33}, "p", "d")
    assert answer_line(both) == line.replace("6 runs recorded of 33 planned, 4",
                                             "7 runs recorded of 33 planned, 5")  # the preset width only
    from tests.leaderboard_rows import ROWS, make_rows

    source = StudySource(study_rows(scores), {"mqmtar": 33}, "p", "d")
    readme = render(make_rows(ROWS), budget=source).files["README.md"]
    answer = readme.decode().split("## The answer", 1)[1].split("\n\n")[1]
    assert answer.splitlines()[-1] == f"- {line}"


def test_the_figures_join_each_seed_across_its_budgets() -> None:
    """A thin line per seed run at two or more budgets (seeds 0-2 here), none for a seed at one."""
    import io

    from lengthgen.leaderboard.plots import plot_budget, plot_near_miss_error

    scores = {("asentmax", steps, s): {8: 0.97, 256: 0.5 + 0.1 * s, 1024: 0.1 * s}
              for steps in (3000, 12000) for s in range(3)}
    scores |= {("softmax", 3000, 3): {8: 0.97, 256: 0.2, 1024: 0.0}}
    study = points(study_rows(scores))
    thin = "stroke-width: 0.7"
    exact = plot_budget(study, io.BytesIO(), fmt="svg").getvalue().decode()
    assert exact.count(thin) == 2 * 3  # two panels (256x, 1024x), three seeds each
    errors = plot_near_miss_error(study, io.BytesIO(), fmt="svg").getvalue().decode()
    assert errors.count(thin) == 3
