"""The Python API: the README's notebook example runs (with tiny settings), and the functions
behave like the commands they mirror."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import lengthgen
from lengthgen.errors import UserError, UserNotice
from lengthgen.harness.storage.results import COLUMNS

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_example() -> str:
    """The first ``python`` block of the README's "From Python" section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("### From Python"):]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README has no python example"
    return match.group(1)


def test_the_readme_example_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_settings: Callable[..., dict[str, Any]]
) -> None:
    code = readme_example()
    tiny = f"steps=3, eval_samples=8, train_length=8, **{tiny_settings({})!r}"  # the tiny model
    assert code.count("steps=300") == 2  # the settings the test shrinks
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(code.replace("steps=300", tiny), str(README), "exec"), namespace)
    grid, rows = namespace["grid"], namespace["rows"]
    assert isinstance(grid, pd.DataFrame) and isinstance(rows, pd.DataFrame)
    assert sorted(set(grid["factor"])) == [1, 2, 4, 8]
    assert set(rows["attn"]) == {"softmax", "asentmax"} and set(rows["seed"]) == {0, 1}
    assert sorted(set(rows["factor"])) == [1, 2, 4, 8, 16]  # swept to 8x, then evaluated to 16x
    assert len(rows) == 4 * 5 and tuple(rows.columns[: len(COLUMNS)]) == COLUMNS
    assert (Path("runs").is_dir() and Path("runs/sweeps/notebook/data").is_dir())  # under runs/, ignored


def test_the_names_are_functions_even_next_to_the_sweeps_module() -> None:
    import lengthgen.sweeps  # noqa: F401  (a submodule import must not shadow the function)

    for name in ("run", "sweep", "evaluate", "load_results"):
        assert callable(getattr(lengthgen, name)) and name in dir(lengthgen)
    assert lengthgen.sweep.__module__ == "lengthgen.notebook"
    with pytest.raises(AttributeError):
        lengthgen.no_such_thing  # noqa: B018


def test_bad_settings_raise_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="unknown setting 'stpes'"):
        lengthgen.run(task="copy", attn="softmax", stpes=3, out=tmp_path)
    with pytest.raises(UserError, match="train.lr: Input should be a finite number"):
        lengthgen.run(task="copy", attn="softmax", out=tmp_path, **{"train.lr": float("nan")})
    with pytest.raises(UserError, match="valid tasks"):
        lengthgen.sweep(task=["copy", "nope"], attn="softmax", out=tmp_path)
    with pytest.raises(UserError, match="unknown tracker 'tensorboard_typo'; valid trackers: tensorboard"):
        lengthgen.run(task="copy", attn="softmax", out=tmp_path, log="tensorboard_typo")
    assert list(tmp_path.iterdir()) == []


def test_load_results_skips_a_bad_file(tmp_path: Path) -> None:
    rows = lengthgen.run(task="copy", attn="softmax", out=tmp_path, steps=2, max_factor=2,
                         eval_samples=4, train_length=4, **{"arch.d_model": 32, "train.batch_size": 8})
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 but not really")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = lengthgen.load_results(tmp_path)
    assert any(issubclass(w.category, UserNotice) and "broken.parquet" in str(w.message) for w in caught)
    pd.testing.assert_frame_equal(loaded[rows.columns].reset_index(drop=True),
                                  rows.reset_index(drop=True), check_dtype=False)


def test_an_unknown_number_format_is_refused_before_evaluating(tmp_path: Path) -> None:
    rows = lengthgen.run(task="copy", attn="softmax", out=tmp_path, steps=2, max_factor=1,
                         eval_samples=4, train_length=4, **{"arch.d_model": 32, "train.batch_size": 8})
    run_dir = tmp_path / rows["run_id"].iloc[0]
    before = (run_dir / "results.parquet").read_bytes()
    with pytest.raises(UserError, match="unknown precision 'fp16'; choose one of fp32, bf16"):
        lengthgen.evaluate(run_dir, precision="fp16")
    with pytest.raises(UserError, match="checkpoint must be a training step"):
        lengthgen.evaluate(run_dir, checkpoint="last")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="kept no checkpoint at step 2; it keeps none"):
        lengthgen.evaluate(run_dir, checkpoint=2)
    assert (run_dir / "results.parquet").read_bytes() == before
