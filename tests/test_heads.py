"""Per-head profiles (``lengthgen heads``): the recomputed weights are the ones each head used (they
reproduce its output), a knock-out equals removing the head from the output projection, and the
summaries match hand-made weight rows."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.harness.recorded.heads import (
    HeadTally,
    _hooked,
    _knock_out,
    half_weight_distance,
    head_weights,
    keys_holding,
    profile_heads,
)
from lengthgen.harness.run import execute
from lengthgen.tasks import get_task
from lengthgen.testing import make_model

runner = CliRunner()


def test_keys_holding_counts_the_fewest_keys_that_reach_the_mass() -> None:
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.95, 0.05, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25],
                      [0.6, 0.3, 0.1, 0.0]])
    assert keys_holding(p).tolist() == [3, 1, 4, 2]
    # a row that leaves weight unclaimed (stick-breaking) counts 90% of the weight it gives
    assert keys_holding(torch.tensor([[0.4, 0.05, 0.05, 0.0], [0.1, 0.1, 0.1, 0.1]])).tolist() == [2, 4]


def _brute_half_distance(row: list[float], q: int) -> int:
    """The definition: the smallest d whose keys q - d..q hold at least half of the row's weight."""
    total = sum(row)
    return next(d for d in range(q + 1) if sum(row[q - d:q + 1]) >= total / 2)


def test_half_weight_distance_is_the_definition() -> None:
    generator = torch.Generator().manual_seed(5)
    q_pos = torch.tensor([0, 3, 7, 11, 11])
    p = torch.rand(3, 5, 12, generator=generator, dtype=torch.float64)
    p[torch.rand(p.shape, generator=generator, dtype=torch.float64) < 0.4] = 0  # sparse rows, as entmax's
    p = p.masked_fill(torch.arange(12)[None, None, :] > q_pos[None, :, None], 0)  # causal
    p[0, 1] = 0
    p[0, 1, 3] = 1.0  # all on the query itself: 0
    p[0, 2] = 0
    p[0, 2, 0] = 0.3  # unnormalized, all on the first key: 7
    p[1, 3] = 0
    p[1, 3, [1, 11]] = 0.5  # exactly half on the query: 0
    expected = [[_brute_half_distance(p[b, r].tolist(), int(q_pos[r])) for r in range(5)] for b in range(3)]
    got = half_weight_distance(p, q_pos)
    assert got.tolist() == expected
    assert (got[0, 1], got[0, 2], got[1, 3]) == (0, 7, 0)


def test_tally_reports_the_distance_to_the_top_key_over_scored_rows_only() -> None:
    tally = HeadTally()
    p = torch.zeros(2, 2, 8)
    p[0, 0, 2], p[0, 1, 3], p[1, 0, 0], p[1, 1, 3] = 1.0, 1.0, 1.0, 1.0  # rows at positions 5 and 6
    tally.add(p, torch.tensor([5, 6]), torch.tensor([[True, True], [False, True]]))
    assert tally.rows == 3 and tally.distances == {3: 3} and tally.top_weight == 3.0 and tally.keys == 3
    assert tally.half_distance == 9 and tally.unclaimed == 0
    short = torch.zeros(1, 2, 8)
    short[0, 0, 5], short[0, 1, 2], short[0, 1, 6] = 0.75, 0.25, 0.125  # rows giving 0.75 and 0.375
    tally.add(short, torch.tensor([5, 6]), torch.tensor([[True, True]]))
    assert tally.rows == 5 and tally.unclaimed == 0.25 + 0.625
    assert tally.half_distance == 9 + 0 + 4  # the second row's nearest key holds a third of its weight


#: The baselines distribution's backends (``pip install -e baselines``): a cumulative bias from the
#: layer input at every key (FoX), and rows that do not sum to one (stick-breaking).
BASELINES = pytest.mark.skipif(importlib.util.find_spec("lengthgen_baselines") is None,
                               reason="not installed: pip install -e baselines")


@pytest.mark.parametrize("backend, pos", [("softmax", "nape"), ("entmax", "nape"), ("asentmax", "nape"),
                                          ("ssmax", "alibi"), ("adaptive_temperature", "rope"),
                                          pytest.param("fox", "nape", marks=BASELINES),
                                          pytest.param("stickbreaking", "nape", marks=BASELINES)])
def test_recomputed_weights_reproduce_every_heads_output(backend: str, pos: str) -> None:
    model = make_model(backend, pos=pos, seed=3).eval()
    ids = torch.randint(0, 10, (2, 40), generator=torch.Generator().manual_seed(0))
    rows = torch.arange(5, 40, 3)
    checked = []

    def check(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], output: torch.Tensor) -> None:
        p, q_pos = head_weights(module, args, kwargs, rows)
        v = args[2]
        keep = torch.isin(args[4], q_pos)
        if backend != "stickbreaking":  # its rows leave what the sticks did not claim
            assert torch.allclose(p.sum(-1), torch.ones_like(p[..., 0]), atol=1e-5)
        assert torch.allclose(p @ v.float(), output[:, :, keep].float(), atol=1e-5)
        checked.append(q_pos.numel())

    with torch.no_grad(), _hooked(model, check):
        model(ids, rows, None)
    assert checked == [len(rows), len(rows)]  # every layer, only the requested rows


def test_a_knock_out_is_the_head_removed_from_the_output_projection() -> None:
    model = make_model("entmax", seed=1).eval()
    ids = torch.randint(0, 10, (2, 30), generator=torch.Generator().manual_seed(1))
    layer_of = {id(block.attn.backend): i for i, block in enumerate(model.blocks)}
    with torch.no_grad(), _hooked(model, _knock_out(layer_of, 1, 2)):
        silenced = model(ids)
    d_head = model.blocks[1].attn.d_head
    with torch.no_grad():
        model.blocks[1].attn.out.weight[:, 2 * d_head:3 * d_head] = 0
        removed = model(ids)
    assert torch.allclose(silenced, removed, atol=1e-6)


def test_profiles_cover_every_head_and_an_unused_head_costs_nothing(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    torch.set_num_threads(1)
    frame = execute(tiny_config(), tmp_path, progress=False)
    from lengthgen.harness.recorded.saved import load_model, load_saved_run

    run = load_saved_run(tmp_path / frame["run_id"].iloc[0])
    task = get_task("copy")
    model = load_model(run, run.config, task.vocab.size, torch.device("cpu"))
    with torch.no_grad():
        model.blocks[0].attn.out.weight[:, :model.blocks[0].attn.d_head] = 0  # head 0 of layer 0 unused
    accuracy, heads = profile_heads(model, task, 8, 6, 10_000, torch.device("cpu"))
    n_heads = model.blocks[0].attn.n_heads
    assert [(h.layer, h.head) for h in heads] == [(i, j) for i in range(2) for j in range(n_heads)]
    assert heads[0].accuracy_without == pytest.approx(accuracy)
    assert all(1 <= h.keys_for_mass and 0 < h.top_weight <= 1 and 0 < h.distance_share <= 1 for h in heads)
    assert all(0 <= h.half_weight_distance < 8 and h.unclaimed < 1e-6 for h in heads)  # softmax rows
    assert all(h.bias_per_token is None for h in heads)


def test_command_prints_one_line_per_head(tmp_path: Path, tiny_config: Callable[..., RunConfig]) -> None:
    torch.set_num_threads(1)
    frame = execute(tiny_config(), tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    result = runner.invoke(app, ["heads", str(run_dir), "--factor", "2", "--samples", "4"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert lines[0].startswith(f"{run_dir.name} at 2x (length 12, 4 test samples): token accuracy")
    config = frame["config_json"].iloc[0]
    import json

    arch = json.loads(config)["arch"]
    n = arch["n_layers"] * arch["n_heads"]
    assert len(lines) == 2 + n + 1 + n  # copy names its positions' roles: one more line per head
    assert "half weight within" in lines[1] and "unclaimed" not in lines[1]  # softmax rows sum to one
    assert {line.split()[2] for line in lines[2:2 + n]} <= {"ALiBi", "NoPE"}
    assert lines[2 + n].startswith("what each head's most-weighted key is")
    assert all(" right: " in line and " | wrong: " in line for line in lines[3 + n:])
    # without the knock-outs: the same lines but for their accuracy, which is not measured
    quick = runner.invoke(app, ["heads", str(run_dir), "--factor", "2", "--samples", "4", "--no-knock-out"])
    assert quick.exit_code == 0, quick.output
    fast = quick.output.strip().splitlines()
    assert [line.rsplit(maxsplit=1)[0] for line in fast[2:2 + n]] == [
        line.rsplit(maxsplit=1)[0] for line in lines[2:2 + n]]
    assert {line.split()[-1] for line in fast[2:2 + n]} == {"—"} and fast[2 + n:] == lines[2 + n:]


def test_probes_read_a_kept_checkpoint(tmp_path: Path, tiny_config: Callable[..., RunConfig]) -> None:
    """``heads`` and ``positions`` take ``--checkpoint N``: the kept weights the selection chose give
    the selected model's report, named as that checkpoint; a step not kept is refused in one line."""
    torch.set_num_threads(1)
    frame = execute(tiny_config(**{"train.keep_every": 2}), tmp_path, progress=False)
    run_dir, best = tmp_path / frame["run_id"].iloc[0], int(frame["best_step"].iloc[0])
    for probe in ("heads", "positions"):
        args = [probe, str(run_dir), "--factor", "2", "--samples", "4"]
        selected = runner.invoke(app, args)
        kept = runner.invoke(app, [*args, "--checkpoint", str(best)])
        assert selected.exit_code == 0 and kept.exit_code == 0, kept.output
        first, *rest = kept.output.strip().splitlines()
        assert first.startswith(f"{run_dir.name} [checkpoint={best}] at 2x")
        assert rest == selected.output.strip().splitlines()[1:]
        missing = runner.invoke(app, [*args, "--checkpoint", "3"])
        assert missing.exit_code == 2 and "kept no checkpoint at step 3; choose one of 2, 4" in missing.stderr


@BASELINES
def test_a_fox_run_shows_each_heads_forget_gate(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """With constant gates f_h = σ(b_h) every increment is log σ(b_h): the column is exactly that."""
    from lengthgen.harness.recorded.heads import HeadsReport
    from lengthgen.harness.recorded.saved import load_model, load_saved_run
    from lengthgen.output import heads_lines

    torch.set_num_threads(1)
    frame = execute(tiny_config(attn="fox"), tmp_path, progress=False)
    run = load_saved_run(tmp_path / frame["run_id"].iloc[0])
    task = get_task("copy")
    model = load_model(run, run.config, task.vocab.size, torch.device("cpu"))
    n_heads = model.blocks[0].attn.n_heads
    gate_bias = torch.linspace(-2.0, 3.0, n_heads)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.backend.gate.weight.zero_()
            block.attn.backend.gate.bias.copy_(gate_bias)
    accuracy, heads = profile_heads(model, task, 8, 6, 10_000, torch.device("cpu"))
    expected = torch.nn.functional.logsigmoid(gate_bias).tolist() * 2
    assert [h.bias_per_token for h in heads] == pytest.approx(expected, rel=1e-6)
    lines = heads_lines(HeadsReport("r", 8, 1, 6, accuracy, tuple(heads)), "", 0.9)
    assert lines[1].split()[-3:] == ["bias", "per", "token"]
    assert [float(line.split()[-1]) for line in lines[2:2 + len(heads)]] == pytest.approx(expected, abs=1e-4)


@BASELINES
def test_a_stick_breaking_run_shows_the_weight_its_rows_leave(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """The ablation option whose own token breaks the stick too (the paper's rows sum to one)."""
    from lengthgen.config import build_run_config

    torch.set_num_threads(1)
    tiny = tiny_config()
    config = build_run_config("copy", "stickbreaking", attn_options={"current": "key"}, start=tiny)
    frame = execute(config, tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    result = runner.invoke(app, ["heads", str(run_dir), "--factor", "2", "--samples", "4"])
    assert result.exit_code == 0, result.output
    header, *heads = result.output.strip().splitlines()[1:]
    assert header.split()[-1] == "unclaimed"
    arch = json.loads(frame["config_json"].iloc[0])["arch"]
    leftovers = [float(line.split()[-1]) for line in heads[:arch["n_layers"] * arch["n_heads"]]]
    assert all(0 <= left < 1 for left in leftovers) and max(leftovers) > 0.01, leftovers


@pytest.mark.parametrize("args, expected", [
    (["--factor", "0"], "factor and samples must be at least 1"),
    (["--samples", "0"], "factor and samples must be at least 1"),
    ([], "is not a run folder (it has no config.json)"),  # the empty folder itself
])
def test_bad_arguments_and_a_folder_without_a_run_are_one_line(
    tmp_path: Path, args: list[str], expected: str, one_line_error: Callable[..., None]
) -> None:
    one_line_error(runner.invoke(app, ["heads", str(tmp_path), *args]), expected)


def test_roles_of_the_top_key_cover_every_scored_token_once_per_head(
    tmp_path: Path, tiny_config: Callable[..., RunConfig]
) -> None:
    """MQMTAR names the roles of positions: each head's tally counts every scored answer token once,
    split by the model's answer being right or wrong, and the command prints them."""
    from lengthgen.harness.recorded.heads import profile_run

    torch.set_num_threads(1)
    frame = execute(tiny_config("mqmtar", **{"train.train_length": 16}), tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    report = profile_run(run_dir, 2, 5, "cpu")
    task = get_task("mqmtar")
    scored = 5 * task.config.n_queries * task.config.value_len
    for head in report.heads:
        assert sum(head.roles.values()) == scored
        right = sum(n for (ok, _), n in head.roles.items() if ok)
        assert right == round(report.accuracy * scored)
        assert {role for _, role in head.roles} <= {
            "matching pair", "pair sharing key token 1", "pair sharing key token 2", "other pair", "filler",
            "start, separator or queries"}
    result = runner.invoke(app, ["heads", str(run_dir), "--factor", "2", "--samples", "5"])
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    n_heads = len(report.heads)
    assert lines[2 + n_heads].startswith("what each head's most-weighted key is")
    assert all(" right: " in line and " | wrong: " in line for line in lines[3 + n_heads:])
    assert len(lines) == 3 + 2 * n_heads


def test_a_task_variant_is_profiled_and_named(tmp_path: Path, tiny_config: Callable[..., RunConfig]) -> None:
    """``--param`` profiles the same weights on a task variant (MQMTAR's planted near misses), says
    so in the header, and refuses a variant with another vocabulary, as ``lengthgen eval`` does."""
    from lengthgen.harness.recorded.saved import open_trained

    torch.set_num_threads(1)
    frame = execute(tiny_config("mqmtar", **{"train.train_length": 16}), tmp_path, progress=False)
    run_dir = tmp_path / frame["run_id"].iloc[0]
    trained = open_trained(run_dir, 4, 2, "cpu", {"near_misses": 1})
    assert trained.task.config.near_misses == 1 and trained.length == 64
    result = runner.invoke(app, ["heads", str(run_dir), "--factor", "4", "--samples", "3",
                                 "--param", "near_misses=1"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"{run_dir.name} [near_misses=1] at 4x (length 64, 3 test samples)")
    refused = runner.invoke(app, ["heads", str(run_dir), "--param", "alphabet=8"])
    assert refused.exit_code == 2 and "changes the task's vocabulary" in refused.output, refused.output
    positions = runner.invoke(app, ["positions", str(run_dir), "--factor", "4", "--samples", "3",
                                    "--param", "near_misses=1"])
    assert positions.exit_code == 0, positions.output
    assert positions.output.startswith(f"{run_dir.name} [near_misses=1] at 4x")
