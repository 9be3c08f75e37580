"""Bad input outside the result rows: Python API arguments of the wrong type or value, terminals
that cannot print Unicode, text files that are not UTF-8, and paths whose bytes are not."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lengthgen
from lengthgen.errors import UserError
from lengthgen.harness.storage.results import write_parquet_atomic

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "leaderboard" / "ablations" / "quick-preset"


# -- row 12: the Python API raises the CLI's one-line UserError for every bad argument ------------

def _deep(value: Any) -> Any:
    """``"DEEP"`` anywhere in ``value`` → a list nested 100,000 deep (built without recursion)."""
    if value == "DEEP":
        deep: list[Any] = []
        for _ in range(100_000):
            deep = [deep]
        return deep
    return {k: _deep(v) for k, v in value.items()} if isinstance(value, dict) else value


def run(**kwargs: Any) -> Callable[[Path], object]:
    return lambda out: lengthgen.run(**{"task": "copy", "attn": "softmax", "out": out, **_deep(kwargs)})


def sweep(**kwargs: Any) -> Callable[[Path], object]:
    given = _deep(kwargs)
    return lambda out: lengthgen.sweep(**{"task": "copy", "attn": "softmax", "out": out / "s", **given})


API_CASES: dict[str, tuple[Callable[[Path], object], str]] = {
    "task=3": (run(task=3), "task must be a name (text), got 3; valid: "),
    "attn=None": (run(attn=None), "attn must be a name (text), got None; valid: "),
    "pos=[]": (run(pos=[]), "pos must be a name (text)"),
    "task_params='x'": (run(task_params="x"), "task_params must be a mapping of names to values"),
    "attn_options=5": (run(attn_options=5), "attn_options must be a mapping of names to values"),
    "out=None": (run(out=None), "out must be a path (text), got None"),
    "out=''": (run(out=""), "out is empty: give a folder"),
    "device='tpu'": (run(device="tpu"), "unknown device 'tpu'; valid devices: auto, cpu, cuda"),
    "seed='1'": (run(seed="1"), "seed must be an integer"),
    "seeds=5": (sweep(seeds=5), "seeds must be a list of integers"),
    "seeds=['0']": (sweep(seeds=["0"]), "seeds must be a list of integers"),
    "jobs=0": (sweep(jobs=0), "jobs (--jobs) must be a whole number of at least 1, got 0"),
    "jobs=1.5": (sweep(jobs=1.5), "jobs (--jobs) must be a whole number of at least 1"),
    "launcher='slurm'": (sweep(launcher="slurm"), "unknown launcher 'slurm'; valid launchers: local, ray"),
    "sweep task=7": (sweep(task=7), "task must be a name or a list of names"),
    "sweep device='tpu'": (sweep(device="tpu"), "unknown device 'tpu'"),
    "load_results missing": (lambda out: lengthgen.load_results(out / "none"), "no such file or folder"),
    "load_results 3": (lambda out: lengthgen.load_results(3), "path must be a path (text), got 3"),
    "evaluate missing": (lambda out: lengthgen.evaluate(out / "nonexistent"), "is not a folder"),
    "evaluate task_params": (lambda out: lengthgen.evaluate(out, task_params="x"), "task_params must be a"),
    # third round: a structure nested deeper than any parser's recursion (RecursionError before)
    "task_params deep": (run(task_params={"x": "DEEP"}), "task_params nests lists or tables deeper than 32"),
    "attn_options deep": (run(attn_options={"alpha": "DEEP"}), "attn_options nests lists or tables deeper"),
    "a dotted field deep": (run(**{"train.betas": "DEEP"}), "nests lists or tables deeper than 32 levels"),
    "sweep task_params deep": (sweep(task_params={"x": "DEEP"}), "task_params nests lists or tables deeper"),
}



@pytest.mark.parametrize("case", list(API_CASES))
def test_the_api_raises_one_line_user_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             case: str) -> None:
    call, expected = API_CASES[case]
    monkeypatch.chdir(tmp_path)  # out='' must never train into the current folder
    with pytest.raises(UserError) as caught:
        call(tmp_path)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message
    assert list(tmp_path.iterdir()) == []


# -- row 14: encodings -----------------------------------------------------------------------------
def cli(*args: str | bytes, encoding: str | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**ENV, **({"PYTHONIOENCODING": encoding} if encoding else {})}
    return subprocess.run([sys.executable, "-m", "lengthgen.cli", *args], capture_output=True, env=env,
                          timeout=300)


@pytest.mark.parametrize(("args", "encoding", "expected"), [
    (("run", "--help"), "ascii", b"L*this"),
    (("sweep", "--help"), "ascii", b"--seeds"),
    (("attns",), "latin-1", b"alpha-entmax"),
    (("attns",), "ascii", b"sigma"),
    (("tasks", "--describe", "mqmtar"), "ascii", b"mqmtar"),
    (("tasks",), "ascii", b"max_retrieval"),
])
def test_help_and_tables_degrade_to_ascii(args: tuple[str, ...], encoding: str, expected: bytes) -> None:
    done = cli(*args, encoding=encoding)
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert expected in done.stdout
    done.stdout.decode(encoding)  # every byte is in the terminal's encoding


def test_an_out_path_that_is_not_utf8(tmp_path: Path) -> None:
    bad = os.fsencode(tmp_path) + b"/runs\xff"
    for args in ((b"run", b"--task", b"copy", b"--attn", b"softmax", b"--out", bad),
                 (b"leaderboard", os.fsencode(QUICK), b"--out", bad),
                 (b"plot", os.fsencode(QUICK), b"--task", b"copy", b"-o", bad + b".svg")):
        done = cli(*args)
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and len(lines) == 1, done.stderr
        assert lines[0].startswith(b"error: ") and b"runs\\xff" in lines[0] and b"not valid UTF-8" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_an_about_file_that_is_not_utf8(tmp_path: Path) -> None:
    from tests.leaderboard_rows import make_rows

    write_parquet_atomic(make_rows({("softmax", 0): [1.0, 0.5]}), tmp_path / "main" / "data" / "r.parquet")
    ablation = tmp_path / "abl" / "one"
    write_parquet_atomic(make_rows({("softmax", 0): [1.0, 0.5]}), ablation / "data" / "r.parquet")
    (ablation / "ABOUT.md").write_bytes("# Réglage\n\nLatin-1 text.\n".encode("latin-1"))
    done = cli("leaderboard", str(tmp_path / "main"), "--out", str(tmp_path / "out"), "--ablations",
               str(tmp_path / "abl"))
    lines = done.stderr.decode().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    expected = f"error: {ablation / 'ABOUT.md'} is not UTF-8 text (byte 0xe9 at position 3); save it as UTF-8"
    assert lines[0] == expected
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [
    ("sample", "--task", "copy", "--length", "8", "--param", "x=" + "[" * 100_000),
    ("run", "--task", "copy", "--attn", "softmax", "--set", "train.betas=" + "[" * 100_000),
    ("sweep", "--task", "copy", "--attn", "softmax", "--set", "train.betas=" + "[" * 100_000, "--dry-run"),
    ("run", "--task", "copy", "--attn", "entmax", "--attn-option", "alpha=" + "[" * 40 + "]" * 40),
])
def test_a_deeply_nested_value_on_the_command_line_is_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    """Third round: 100,000 nested brackets gave a RecursionError traceback."""
    done = cli(*args, "--out", str(tmp_path / "o")) if args[0] != "sample" else cli(*args)
    lines = done.stderr.decode().strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert "nests lists or tables deeper than 32 levels" in lines[0] and not (tmp_path / "o").exists()
