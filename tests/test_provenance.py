"""Every result row says which code made it: the checkout's commit, local changes, the numerics
version and the computing libraries' versions, checked against git and the libraries themselves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numba
import numpy
import pytest
import torch

from lengthgen import provenance
from lengthgen.config import build_run_config
from lengthgen.harness.run import execute

REPO = Path(__file__).resolve().parents[1]


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture(scope="module")
def in_checkout() -> None:
    try:
        _git("rev-parse", "HEAD")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not running from a git checkout")


def test_the_checkout_is_git_s_view_of_it(in_checkout: None) -> None:
    commit, dirty = provenance.checkout()
    assert commit == _git("rev-parse", "HEAD")
    assert dirty == bool(_git("status", "--porcelain", "--untracked-files=no", "--", "lengthgen", "baselines",
                              "examples"))


def test_a_change_to_the_checkout_s_plugins_makes_it_dirty(tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: only the package folder was checked, so a FoX row made with an edited baselines/
    recorded a clean commit. Data elsewhere in the checkout (a campaign's results) stays clean."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       capture_output=True, check=True)

    for name in ("pyproject.toml", "lengthgen/provenance.py", "baselines/src/fox.py", "leaderboard/data.csv"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "c")
    monkeypatch.setattr(provenance, "__file__", str(tmp_path / "lengthgen" / "provenance.py"))
    provenance.checkout.cache_clear()
    try:
        (tmp_path / "leaderboard/data.csv").write_text("y\n")
        assert provenance.checkout()[1] is False
        provenance.checkout.cache_clear()
        (tmp_path / "baselines/src/fox.py").write_text("y\n")
        assert provenance.checkout()[1] is True
    finally:
        provenance.checkout.cache_clear()


def test_a_run_records_the_code_that_made_it(tmp_path: Path, in_checkout: None) -> None:
    config = build_run_config("flip_flop", "softmax", overrides={
        "train.steps": 2, "train.batch_size": 4, "train.val_samples": 4, "eval.samples": 2,
        "eval.max_factor": 2, "arch.d_model": 16, "arch.d_ff": 32})
    rows = execute(config, tmp_path, progress=False)
    assert list(rows.columns[-len(provenance.COLUMNS):]) == list(provenance.COLUMNS)
    assert set(rows["git_commit"]) == {_git("rev-parse", "HEAD")}
    assert set(rows["numerics_version"]) == {provenance.NUMERICS_VERSION}
    assert set(rows["numpy_version"]) == {numpy.__version__}
    assert set(rows["numba_version"]) == {numba.__version__}
    assert set(rows["git_dirty"]) == {provenance.checkout()[1]}
    assert set(rows["torch_threads"]) == {torch.get_num_threads()}


def test_outside_a_checkout_nothing_is_made_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A copy of the package in a folder that is no git checkout records no commit."""
    monkeypatch.setattr(provenance, "__file__", str(tmp_path / "lengthgen" / "provenance.py"))
    (tmp_path / "lengthgen").mkdir()
    provenance.checkout.cache_clear()
    try:
        assert provenance.checkout() == (None, None)
    finally:
        provenance.checkout.cache_clear()
