"""The training-budget study: MQMTAR at long lengths as a function of training steps (and width).

Its runs are a sweep folder of their own (``leaderboard/budget``, made by ``leaderboard/budget.toml``):
one backend, one number of steps, one width per point, three seeds each. From their rows alone:

- **points**: per (backend, steps, width), each seed's exact match at 256× and 1024× (and the
  test samples behind them), and its per-near-miss error: with m near misses planted per query at
  8× (``lengthgen eval RUN --param near_misses=8 --min-factor 8 --max-factor 8``) a sample holds
  4·m of them, so ``e = 1 − (exact_m / exact_0)^(1 / (4·m))`` with exact_0 the plain 8× score;
- **a trend**: per backend at the preset width, logit(exact match at 1024×) against log10(training
  sequences), a straight line fitted over every seed, its uncertainty by resampling the seeds of
  each budget; the budget at which the line reaches 95%, with a 95% range (when the rise bends,
  the last two budgets' slope below the first two's in nearly every resample, from the last two
  budgets alone, as a lower bound on that budget) — or why the data do
  not support extrapolating (a budget with fewer than ``MIN_SEEDS`` seeds, whose spread the range
  could not count, is left out; fewer than ``MIN_BUDGETS`` budgets, a flat or falling line, or a
  range wider than ``MAX_DECADES``);
- **the near misses' share of the 1024× failures**, per seed: near misses alone would make
  1 − (1 − e)^(4·34) of the samples wrong at 1024× (34 per query there), as a share of the samples
  the run got wrong at 1024× (capped at 100%: the 8× error then explains every failure). A
  prediction from the 8× measurement, not a count of the 1024× answers;
- the paper's point: ASEntmax 99.0% / 95.3% at 256× / 1024× after 390,625 steps of 128 sequences.

Exact match near 0 or 1 is clipped to half a sample from the edge before the logit, so that a
seed at 0 of 64 samples does not weigh as minus infinity.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import pandas as pd

from lengthgen.leaderboard.paper import PAPER_REPORTED, paper_training
from lengthgen.leaderboard.rows import config_dict
from lengthgen.leaderboard.stats import seed_interval
from lengthgen.leaderboard.tables import Cell, Header, Row, Table, pct

#: The lengths the study reports (multiples of the training length).
LONG_FACTORS = (256, 1024)
#: The near misses planted per query to measure the per-near-miss error, and where.
PLANTED, PLANTED_FACTOR = 8, 8
#: Queries per MQMTAR sample (each meets its own near misses).
QUERIES = 4
#: The target of the trend: exact match at 1024×.
TARGET = 0.95
#: A prediction whose 95% range spans more than this many decades of budget says nothing.
MAX_DECADES = 2.0
#: Seeds a budget needs to enter the fit: the range resamples each budget's seeds, and one seed has
#: no spread to resample.
MIN_SEEDS = 2
#: Budgets a prediction needs: a line through two budgets cannot show that the trend is straight.
MIN_BUDGETS = 3
#: Resamples for the trend's uncertainty (a fixed seed: the same rows give the same range).
RESAMPLES = 400
#: The rise bends when the last two budgets' slope is below the first two's in this share of the
#: resamples; the line is then fitted to the last two budgets alone.
BEND_SHARE = 0.975
#: The paper's MQMTAR training: steps, sequences per step, and sequences in all.
PAPER_STEPS, PAPER_BATCH = paper_training("mqmtar")
PAPER_SEQUENCES = PAPER_STEPS * PAPER_BATCH
#: The paper's reported MQMTAR exact match at 256× and 1024×, the claim's backend first.
PAPER_POINT = {attn: {f: PAPER_REPORTED["mqmtar"][attn][f] / 100 for f in LONG_FACTORS}
               for attn in ("asentmax", "softmax", "entmax")}
#: Near misses a query meets at 1024× on average (pairs sharing only its second key token, at the
#: paper's alphabet and pair density: ablation mqmtar-near-misses).
NEAR_MISSES_1024 = 34
#: The per-near-miss error that 95% at 1024× allows.
ALLOWED_ERROR = 1 - TARGET ** (1 / (QUERIES * NEAR_MISSES_1024))


@dataclass(frozen=True)
class SeedResult:
    seed: int
    exact: dict[int, float]  # factor -> exact match
    samples: dict[int, int]  # factor -> test samples
    near_miss_error: float | None


@dataclass(frozen=True)
class Point:
    """One budget of one backend: its seeds' results."""

    attn: str
    steps: int
    width: int
    sequences: int  # steps × batch
    seeds: tuple[SeedResult, ...]

    def values(self, factor: int) -> list[float]:
        return [s.exact[factor] for s in self.seeds if factor in s.exact]

    def errors(self) -> list[float]:
        return [s.near_miss_error for s in self.seeds if s.near_miss_error is not None]

    def near_miss_shares(self) -> list[tuple[int, float]]:
        """(seed, share of its 1024× failures near misses account for) where both are measured."""
        shares = ((s.seed, near_miss_share(s.near_miss_error, s.exact.get(1024))) for s in self.seeds)
        return [(seed, share) for seed, share in shares if share is not None]


def near_miss_error(plain: float, planted: float, per_query: int = PLANTED) -> float | None:
    """The chance that one near miss makes its query wrong, from exact match without and with
    ``per_query`` planted near misses per query (None where the plain score is 0)."""
    if plain <= 0:
        return None
    ratio = min(1.0, max(planted, 0.0) / plain)
    if ratio == 0:
        return 1.0
    return 1.0 - ratio ** (1.0 / (QUERIES * per_query))


def near_miss_share(error: float | None, exact_1024: float | None) -> float | None:
    """The share of the samples wrong at 1024× that near misses alone make wrong (at most 1), from
    the error per near miss; None without both numbers or without a failure."""
    if error is None or exact_1024 is None or exact_1024 >= 1:
        return None
    from_near_misses = 1 - (1 - error) ** (QUERIES * NEAR_MISSES_1024)
    return min(1.0, from_near_misses / (1 - exact_1024))


def points(rows: pd.DataFrame, task: str = "mqmtar") -> list[Point]:
    """The study's points from its rows (ok rows of ``task``; variants other than MQMTAR's planted
    near misses are ignored), by backend, width and steps."""
    if rows.empty:
        return []
    ok = rows[(rows["status"] == "ok") & (rows["task"] == task)].dropna(subset=["factor"])
    planted_variant = f"near_misses={PLANTED}"
    out = []
    meta: dict[str, tuple[str, int, int, int]] = {}
    firsts = ok.drop_duplicates("run_id")[["run_id", "config_json"]]
    for run_id, config_json in firsts.itertuples(index=False):
        config = config_dict(config_json)
        train = config.get("train", {})
        meta[str(run_id)] = (str(config.get("attn")), int(train.get("steps", 0)),
                             int(config.get("arch", {}).get("d_model", 0)), int(train.get("batch_size", 0)))
    groups: dict[tuple[str, int, int, int], list[SeedResult]] = {}
    for run_id, run in ok.groupby("run_id", sort=True):
        attn, steps, width, batch = meta[str(run_id)]
        plain = run[run["eval_variant"] == ""]
        exact = {int(f): float(v) for f, v in zip(plain["factor"], plain["exact_match"], strict=True)}
        samples = {int(f): int(n) for f, n in zip(plain["factor"], plain["n_samples"], strict=True)}
        planted = run[(run["eval_variant"] == planted_variant) & (run["factor"] == PLANTED_FACTOR)]
        error = None
        if not planted.empty and PLANTED_FACTOR in exact:
            error = near_miss_error(exact[PLANTED_FACTOR], float(planted["exact_match"].iloc[0]))
        groups.setdefault((attn, steps, width, batch), []).append(
            SeedResult(int(run["seed"].iloc[0]), exact, samples, error))
    for (attn, steps, width, batch), seeds in sorted(groups.items()):
        out.append(Point(attn, steps, width, steps * batch, tuple(sorted(seeds, key=lambda s: s.seed))))
    return out


def _logit(p: float, n: int) -> float:
    edge = 0.5 / max(1, n)
    p = min(1 - edge, max(edge, p))
    return math.log(p / (1 - p))


def _line(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """Least squares y = a + b·x; None without two distinct x."""
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


@dataclass(frozen=True)
class Trend:
    attn: str
    budgets: int  # budgets in the fit
    seeds: int  # seeds in the fit
    slope: float | None  # logit units per decade of sequences
    predicted: float | None  # sequences at which the line reaches TARGET
    low: float | None
    high: float | None
    verdict: str  # what the fit supports, in words
    #: (steps, seeds tested at the factor) of every budget of the backend, in the fit or not.
    tested: tuple[tuple[int, int], ...] = ()
    #: The training sequences of the first and last budgets the line is fitted on (the last two
    #: budgets alone when the rise bends), where a drawing of the line starts and, when the fit
    #: does not support an extrapolation, ends.
    start: float | None = None
    end: float | None = None

    @property
    def extrapolates(self) -> bool:
        """Whether the fit supports reading the line beyond its budgets: it has a 95% range (its
        slope is positive on most resamples), and that range is narrow enough."""
        return self.low is not None and self.high is not None and \
            _narrow(math.log10(self.low), math.log10(self.high))


def _narrow(log_low: float, log_high: float) -> bool:
    """A 95% range (log10 sequences) narrow enough to extrapolate: at most ``MAX_DECADES``."""
    return log_high - log_low <= MAX_DECADES


#: Per budget: log10(training sequences), and each seed's logit(exact match).
Groups = list[tuple[float, list[float]]]


def _fit(groups: Groups) -> tuple[float, float] | None:
    return _line([x for x, ys in groups for _ in ys], [y for _, ys in groups for y in ys])


def _segment(groups: Groups, i: int, j: int) -> float:
    """The slope between budgets i and j through their means over seeds."""
    (xi, yi), (xj, yj) = groups[i], groups[j]
    return (sum(yj) / len(yj) - sum(yi) / len(yi)) / (xj - xi)


def trend(study: list[Point], attn: str, width: int, factor: int = 1024) -> Trend:
    """The line through logit(exact match at ``factor``) against log10(sequences), every seed a
    point; its 95% range by resampling, with replacement, the seeds of each budget. Budgets with
    fewer than ``MIN_SEEDS`` seeds stay out of the fit; a prediction needs ``MIN_BUDGETS``. When
    the rise bends (the last two budgets' slope below the first two's in ``BEND_SHARE`` of the
    resamples), a line through every budget would overstate the pace: the line is fitted to the
    last two budgets, and its budget for the target is a lower bound while the rise keeps slowing."""
    tested = [p for p in study if p.attn == attn and p.width == width and p.values(factor)]
    mine = [p for p in tested if len(p.values(factor)) >= MIN_SEEDS]
    counts = tuple((p.steps, len(p.values(factor))) for p in tested)
    left_out = "".join(f"; {p.steps:,} steps left out ({count_label(len(p.values(factor)), 'seed')} so far)"
                       for p in tested if p not in mine)
    groups: Groups = [(math.log10(p.sequences), [_logit(s.exact[factor], s.samples.get(factor, 1))
                                                 for s in p.seeds if factor in s.exact]) for p in mine]
    seeds = sum(len(ys) for _, ys in groups)

    def result(slope: float | None, verdict: str, *band: float | None,
               span: tuple[float, float] | None = None) -> Trend:
        predicted, low, high = (*band, None, None, None)[:3]
        start, end = span or (None, None)
        return Trend(attn, len(mine), seeds, slope, predicted, low, high, verdict + left_out, counts,
                     start, end)

    if len(mine) < 2:
        return result(None, f"{count_label(len(mine), 'budget')} with {MIN_SEEDS} or more seeds so far: "
                            "no trend to fit yet")
    fit = _fit(groups)
    assert fit is not None
    a, b = fit
    if b <= 0:
        return result(b, "exact match does not rise with budget here: the data do not support an "
                         "extrapolation")
    if len(mine) < MIN_BUDGETS:
        return result(b, f"exact match rises by {b:.2f} logit units per decade of training sequences "
                         f"over {len(mine)} budgets; a line through {len(mine)} budgets cannot show that the "
                         f"trend is straight, so no extrapolation before {MIN_BUDGETS}")
    rng = random.Random(0)
    resamples = [[(x, [rng.choice(ys) for _ in ys]) for x, ys in groups] for _ in range(RESAMPLES)]
    first, last = _segment(groups, 0, 1), _segment(groups, -2, -1)
    bends = sum(_segment(r, -2, -1) < _segment(r, 0, 1) for r in resamples) >= BEND_SHARE * RESAMPLES
    prefix, used = "", slice(None)
    if bends:
        used = slice(-2, None)
        prefix = (f"the rise slows: {first:.2f} logit units per decade between the first two budgets, "
                  f"{last:.2f} between the last two (lower in over {BEND_SHARE:.1%} of resampled seeds), so "
                  "a line through every budget would overstate the pace; through the last two budgets ")
        fit = _fit(groups[used])
        assert fit is not None
        a, b = fit
        if b <= 0:
            return result(b, prefix + "it no longer rises: no extrapolation")
    estimates = []
    target = _logit(TARGET, 10**6)
    for sample in resamples:
        refit = _fit(sample[used])
        if refit is not None and refit[1] > 0:
            estimates.append((target - refit[0]) / refit[1])
    predicted = (target - a) / b
    start, end = 10 ** groups[used][0][0], 10 ** groups[used][-1][0]
    if len(estimates) < RESAMPLES // 2:
        return result(b, prefix + "the slope is not reliably positive over resampled seeds: no extrapolation",
                      10**predicted, span=(start, end))
    estimates.sort()
    low, high = estimates[int(0.025 * len(estimates))], estimates[int(0.975 * len(estimates)) - 1]
    verdict = prefix + (f"the line reaches {TARGET * 100:.0f}% at about {sequences_label(10**predicted)} "
                        f"training sequences (95% range {sequences_label(10**low)} … "
                        f"{sequences_label(10**high)})")
    paper = math.log10(PAPER_SEQUENCES)
    if not _narrow(low, high):
        verdict += f"; the range spans {high - low:.1f} decades: too wide to support the extrapolation"
    elif bends:
        where = "inside it" if low <= paper <= high else "above it" if paper > high else "below it"
        verdict += (f", a lower bound on the budget while the rise keeps slowing (fitted from "
                    f"{sequences_label(start)} sequences on); the paper's "
                    f"{sequences_label(PAPER_SEQUENCES)} lies {where}")
    else:
        where = "inside" if low <= paper <= high else "outside"
        verdict += f"; the paper's {sequences_label(PAPER_SEQUENCES)} lies {where} it"
    return result(b, verdict, 10**predicted, 10**low, 10**high, span=(start, end))


def count_label(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def sequences_label(n: float) -> str:
    """Training sequences in a few characters: ``768 K``, ``50.0 M``."""
    if n >= 1e12:
        return f"{n:.1e}"
    if n >= 1e9:
        return f"{n / 1e9:.1f} G"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    if n >= 1e3:
        return f"{n / 1e3:.0f} K"
    return f"{n:.0f}"


def _seeds_label(pairs: list[tuple[int, str]]) -> str:
    """``seeds 17.2 / 31.2 / 46.9`` for seeds 0, 1, 2 in order; other seed sets, and a lone seed,
    are named (``seed 1: 87.5``, ``seed 0: 96.9``), so that no value is read as another seed's."""
    numbers = [seed for seed, _ in pairs]
    values = " / ".join(value for _, value in pairs)
    if len(numbers) > 1 and numbers == list(range(len(numbers))):
        return f"seeds {values}"
    return f"seed{'s' if len(numbers) > 1 else ''} {' / '.join(map(str, numbers))}: {values}"


def exact_cell(point: Point, factor: int) -> Cell:
    """Exact match at ``factor``: the mean over seeds, its interval and every seed."""
    values = point.values(factor)
    if not values:
        return Cell("—", -1.0, "not evaluated yet")
    ci = seed_interval(values)
    seeds = _seeds_label([(s.seed, pct(s.exact[factor])) for s in point.seeds if factor in s.exact])
    samples = sorted({s.samples[factor] for s in point.seeds if factor in s.samples})
    detail = f"[{pct(ci.lo)}, {pct(ci.hi)}]" if ci.method == "t" else ""
    return Cell(pct(ci.mean), ci.mean, f"mean over {count_label(ci.n, 'seed')}; {seeds}; "
                f"{'/'.join(map(str, samples))} test samples each", detail=f"{detail} {seeds}".strip(),
                wrap=True)


def _error_cell(point: Point) -> Cell:
    errors = point.errors()
    if not errors:
        return Cell("—", -1.0, "the planted near misses are not evaluated yet")
    mean = sum(errors) / len(errors)
    seeds = _seeds_label([(s.seed, f"{100 * s.near_miss_error:.2f}") for s in point.seeds
                          if s.near_miss_error is not None])
    over = count_label(len(errors), "seed")
    return Cell(f"{100 * mean:.2f}%", mean, f"per near miss and query, mean over {over} ({seeds}%); "
                f"95% at 1024× allows {100 * ALLOWED_ERROR:.3f}%",
                detail=seeds, wrap=True)


def _share_cell(point: Point) -> Cell:
    shares = point.near_miss_shares()
    if not shares:
        return Cell("—", -1.0, "needs the planted near misses and a failure at 1024×")
    mean = sum(v for _, v in shares) / len(shares)
    seeds = _seeds_label([(seed, pct(v, 0)) for seed, v in shares])
    return Cell(f"{pct(mean, 0)}%", mean, f"share of the samples wrong at 1024× that near misses alone make "
                f"wrong, predicted from the error per near miss ({NEAR_MISSES_1024} per query at 1024×), "
                f"mean over {count_label(len(shares), 'seed')} ({seeds}%)", detail=seeds, wrap=True)


def budget_table(study: list[Point]) -> Table:
    """A line per backend × budget × width: sequences, seeds, exact match at 256× and 1024× (mean
    [interval], each seed) and the per-near-miss error; the paper's point pinned below."""
    headers = (Header("backend"), Header("steps", numeric=True), Header("width", numeric=True),
               Header("sequences", "training sequences: steps × batch", numeric=True),
               Header("seeds", numeric=True),
               *[Header(f"{f}×", f"exact match (%) at {f}×: mean over seeds [95% Student-t interval], each "
                                 "seed", numeric=True) for f in LONG_FACTORS],
               Header("near-miss error", f"chance that a near miss makes its query wrong, from {PLANTED} "
                                         f"planted per query at {PLANTED_FACTOR}×", numeric=True),
               Header("near misses' share of 1024× failures",
                      f"the samples near misses alone would make wrong at 1024× ({NEAR_MISSES_1024} per "
                      "query), as a share of those wrong there: predicted from the error per near miss",
                      numeric=True))
    body = [Row((Cell(p.attn), Cell(f"{p.steps:,}", float(p.steps)), Cell(str(p.width), float(p.width)),
                 Cell(sequences_label(p.sequences), float(p.sequences)),
                 Cell(str(len(p.seeds)), len(p.seeds)),
                 *[exact_cell(p, f) for f in LONG_FACTORS], _error_cell(p), _share_cell(p))) for p in study]
    pinned = [Row((Cell(f"paper: {attn}"), Cell(f"{PAPER_STEPS:,}"), Cell("512"),
                   Cell(sequences_label(PAPER_SEQUENCES)), Cell("best of 3"),
                   *[Cell(pct(scores[f])) for f in LONG_FACTORS], Cell("—"), Cell("—")), kind="paper")
              for attn, scores in PAPER_POINT.items() if any(p.attn == attn for p in study)]
    return Table(headers, tuple(body), tuple(pinned), label="MQMTAR at long lengths by training budget")


def missing_note(study: list[Point], planned_runs: int | None) -> str:
    """How complete the study is: runs recorded (and planned, when the plan is known)."""
    runs = sum(len(p.seeds) for p in study)
    tested = sum(1 for p in study for s in p.seeds if 1024 in s.exact)
    planned = f" of {planned_runs} planned" if planned_runs else ""
    return f"{runs} runs recorded{planned}, {tested} tested to 1024×"


