"""Progress in a log (no terminal): a few plain lines, never carriage returns."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lengthgen import progress


def test_a_line_every_tenth_of_the_way_or_every_30_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(float(t) for t in range(0, 100_000, 1))
    monkeypatch.setattr(progress.time, "perf_counter", lambda: next(clock))
    out = io.StringIO()
    lines = progress.LogLines(1000, "train copy/softmax", "steps", file=out)
    for _ in range(1000):  # one second per step: the 30-second rule fires first
        lines.update(1)
    text = out.getvalue()
    assert "\r" not in text
    written = text.splitlines()
    assert len(written) == 34 and written[-1].startswith("train copy/softmax: 1000/1000 steps (100%)")
    quick = io.StringIO()
    fast = progress.LogLines(1000, "eval", "samples", file=quick)
    monkeypatch.setattr(progress.time, "perf_counter", lambda: 5.0)  # no time passes: every 10%
    fast.set_postfix(loss="0.1", refresh=False)
    for _ in range(1000):
        fast.update(1)
    assert len(quick.getvalue().splitlines()) == 10 and quick.getvalue().endswith("loss=0.1\n")


def test_progress_is_a_bar_only_in_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "in_terminal", lambda file=None: False)
    assert isinstance(progress.display(10, "x"), progress.LogLines)
    assert isinstance(progress.display(10, "x", live_only=True), progress.Silent)
    assert isinstance(progress.display(10, "x", enabled=False), progress.Silent)
    logged = progress.display(10, "x", enabled="log")  # a run inside a sweep: lines at each tenth only
    assert isinstance(logged, progress.LogLines) and logged.every_seconds is None
    monkeypatch.setattr(progress, "in_terminal", lambda file=None: True)
    assert isinstance(progress.display(10, "x", enabled="log"), progress.Silent)  # the sweep's bar is there


def _logged(tmp_path: Path, *args: str) -> str:
    """What ``lengthgen ARGS`` (a tiny flip_flop model) writes with stdout and stderr in a file."""
    log = tmp_path / "command.log"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as handle:
        done = subprocess.run(
            [sys.executable, "-c", "from lengthgen.cli import main; main()", *args, "--task", "flip_flop",
             "--attn", "softmax", "--set", "arch.d_model=32", "--set", "arch.d_ff=64"],
            stdout=handle, stderr=subprocess.STDOUT, env=env, timeout=600, check=False)
    text = log.read_text(encoding="utf-8")
    assert done.returncode == 0, text
    assert "\r" not in text
    return text


def test_a_sweep_logged_to_a_file_says_where_each_run_stands(tmp_path: Path) -> None:
    """`nohup lengthgen sweep … > log`: hour-long runs leave a line per tenth of training each."""
    text = _logged(tmp_path, "sweep", "--seeds", "0,1", "--steps", "100", "--max-factor", "2",
                   "--eval-samples", "8", "--set", "train.val_every=20", "--out", str(tmp_path / "sweep"))
    for seed in (0, 1):
        lines = re.findall(rf"train flip_flop-softmax-nape-s{seed}-[0-9a-f]{{8}}: (\d+)/100 steps.*", text)
        assert lines == [str(n) for n in range(10, 101, 10)], text
        run = rf"flip_flop-softmax-nape-s{seed}-[0-9a-f]{{8}}"
        evaluated = re.findall(rf"eval {run}: (\d+)x \(length (\d+)\): "
                               r"\d+\.\d% exact match over 8 samples in \d+ (?:s|min)", text)
        assert evaluated == [("1", "32"), ("2", "64")], text  # one line per length, each when it is done
    assert "val=" in text


def test_a_run_logged_to_a_file_stays_short(tmp_path: Path) -> None:
    """`nohup lengthgen run … > log`: one header, a line per tenth of training, the table."""
    text = _logged(tmp_path, "run", "--steps", "200", "--max-factor", "4", "--eval-samples", "16",
                   "--out", str(tmp_path / "runs"))
    assert len(text.splitlines()) < 25, text
    assert re.search(r"train flip_flop-softmax-nape-s0-[0-9a-f]{8}: 200/200 steps \(100%\)", text)
    assert re.findall(r"eval flip_flop-softmax-nape-s0-[0-9a-f]{8}: (\d+)x", text) == ["1", "2", "4"], text
