"""A plan's numerics pin: ``sweep --plan`` sets the plan's environment variables before torch loads,
so its rows record the pinned instruction sets; a different value already set is refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen.cli import app
from lengthgen.errors import UserError
from lengthgen.plans import numerics
from lengthgen.plans.numerics import pin_numerics
from lengthgen.plans.plan import load_plan

PINS = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}

#: A plan of one tiny run (its settings on one line: TOML's inline table).
SETTINGS = {"train.steps": 2, "train.batch_size": 8, "train.val_samples": 8, "arch.d_model": 32,
            "arch.d_ff": 64, "eval.samples": 4, "eval.min_samples": 4, "eval.max_factor": 2}
PLAN = """
title = "pinned board"
numerics = { ATEN_CPU_CAPABILITY = "default" }

[[sweep]]
name = "mr"
task = ["max_retrieval"]
attn = ["softmax"]
""" + "set = { " + ", ".join(f'"{key}" = {value}' for key, value in SETTINGS.items()) + " }\n"


def test_pins_are_set_where_the_environment_has_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(numerics, "READERS", ("a_module_not_loaded",))  # as in a fresh CLI process
    env = {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}  # already as pinned: kept
    line = pin_numerics(PINS, env, machine="x86_64")
    assert env == PINS
    assert line == "numerics: pinned by the plan, ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2"


def test_a_different_value_in_the_environment_is_refused() -> None:
    env = {"ATEN_CPU_CAPABILITY": "avx512"}
    with pytest.raises(UserError, match="pins ATEN_CPU_CAPABILITY=default but the environment sets "
                                        "ATEN_CPU_CAPABILITY=avx512"):
        pin_numerics(PINS, env, machine="x86_64")
    assert env == {"ATEN_CPU_CAPABILITY": "avx512"}


def test_a_pin_after_torch_loaded_is_refused() -> None:
    assert "torch" in sys.modules  # this test process has loaded it
    with pytest.raises(UserError, match="must be set before torch"):
        pin_numerics(PINS, {}, machine="x86_64")
    assert pin_numerics(PINS, dict(PINS), machine="x86_64")  # already set as pinned: nothing to do


def test_other_machines_are_told_and_left_alone() -> None:
    env: dict[str, str] = {}
    line = pin_numerics(PINS, env, machine="aarch64")
    assert env == {} and line is not None and "this aarch64 machine computes with its own" in line
    assert pin_numerics({}, env, machine="x86_64") is None


@pytest.mark.parametrize(("pin", "message"), [
    ('"aten cpu" = "avx2"', "'aten cpu' is not a numerics pin; a plan may set only ATEN_CPU_CAPABILITY, "),
    ('PYTHONPATH = "evil"', "'PYTHONPATH' is not a numerics pin"),
    ('LD_PRELOAD = "/tmp/x.so"', "'LD_PRELOAD' is not a numerics pin"),
    ('GIT_CONFIG_COUNT = "1"', "'GIT_CONFIG_COUNT' is not a numerics pin"),
    ('ATEN_CPU_CAPABILITY = "avx2; x"', "ATEN_CPU_CAPABILITY = 'avx2; x' is not a value it takes"),
    ('NUMBA_CPU_NAME = "../../x"', "NUMBA_CPU_NAME = '../../x' is not a value it takes"),
    ("ATEN_CPU_CAPABILITY = 2", "ATEN_CPU_CAPABILITY = 2 is not a value it takes"),
])
def test_a_plan_pins_known_variables_to_values_of_their_pattern(tmp_path: Path, pin: str,
                                                                message: str) -> None:
    path = tmp_path / "plan.toml"
    path.write_text(PLAN.replace('ATEN_CPU_CAPABILITY = "default"', pin), encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(message)):
        load_plan(path)



@pytest.mark.parametrize("pins", [{"PYTHONPATH": "evil"}, {"NUMBA_CPU_NAME": "../x"}])
def test_pin_numerics_sets_nothing_else_whoever_calls_it(pins: dict[str, str]) -> None:
    env: dict[str, str] = {}
    with pytest.raises(UserError, match="numerics: .* (is not a numerics pin|is not a value it takes)"):
        pin_numerics(pins, env, machine="x86_64")
    assert env == {}


def test_every_pin_of_the_published_plans_is_allowed() -> None:
    for name in ("plan.toml", "budget.toml"):
        numerics.check_pins(load_plan(Path(__file__).resolve().parents[1] / "leaderboard" / name).numerics)


def test_sweep_plan_runs_with_the_pinned_numerics(tmp_path: Path) -> None:
    """End to end, in a fresh Python: the rows record the capability the plan pins, not the host's."""
    path = tmp_path / "plan.toml"
    path.write_text(textwrap.dedent(PLAN), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run([sys.executable, "-m", "lengthgen.cli", "sweep", "--plan", str(path), "--out",
                           str(tmp_path / "board"), "--quiet"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "numerics: pinned by the plan, ATEN_CPU_CAPABILITY=default" in done.stderr
    rows = pd.concat(pd.read_parquet(f) for f in (tmp_path / "board" / "data").glob("*.parquet"))
    assert len(rows) == 2 and set(rows["cpu_isa"].str.split(",").str[0]) == {"torch DEFAULT"}
    # the environment sets another value: one line, exit 2, nothing run
    refused = CliRunner().invoke(app, ["sweep", "--plan", str(path), "--out", str(tmp_path / "other")],
                                 env={"ATEN_CPU_CAPABILITY": "avx2"})
    assert refused.exit_code == 2 and not (tmp_path / "other").exists()
    assert "the plan pins ATEN_CPU_CAPABILITY=default but the environment sets" in refused.output
