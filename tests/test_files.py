"""The one atomic writer: whole files or none, no temporary file left on failure, the user's umask;
and what the commands do when the disk fills up or a folder cannot be written."""

from __future__ import annotations

import errno
import io
import itertools
import os
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from lengthgen import files
from lengthgen.cli import app
from lengthgen.config import RunConfig
from lengthgen.files import atomic_write, new_folder
from lengthgen.harness import run as harness_run
from lengthgen.harness.run import execute

runner = CliRunner()

#: The tiny run of these tests: three steps, evaluated at 1× and 2× on 4 samples.
FILES_RUN = {"train.steps": 3, "train.train_length": 6, "eval.max_factor": 2, "eval.samples": 4}
COPY = ["--task", "copy", "--attn", "softmax"]


def leftovers(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if p.name.endswith(".tmp")]


@pytest.fixture
def umask() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def test_writes_bytes_text_and_callables(tmp_path: Path) -> None:
    assert atomic_write(tmp_path / "a" / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"
    assert atomic_write(tmp_path / "t.txt", "é\n").read_text(encoding="utf-8") == "é\n"
    frame = pd.DataFrame({"x": [1, 2]})
    atomic_write(tmp_path / "f.parquet", lambda handle: frame.to_parquet(handle, index=False))
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "f.parquet"), frame)
    assert leftovers(tmp_path) == []


def test_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = atomic_write(tmp_path / "r.txt", "old")

    def half_then_crash(handle: io.BufferedWriter) -> None:
        handle.write(b"half of the new")
        raise RuntimeError("crash while writing")

    with pytest.raises(RuntimeError):
        atomic_write(target, half_then_crash)
    assert target.read_text() == "old" and leftovers(tmp_path) == []
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write(folder, "x")
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_permissions_follow_the_umask(tmp_path: Path, mask: int, mode: int) -> None:
    previous = os.umask(mask)
    try:
        written = atomic_write(tmp_path / "p.bin", b"x")
        opened = tmp_path / "opened.bin"
        opened.write_bytes(b"x")  # what a plain open() makes
    finally:
        os.umask(previous)
    assert stat.S_IMODE(written.stat().st_mode) == mode == stat.S_IMODE(opened.stat().st_mode)


def test_every_output_of_run_sweep_plot_and_leaderboard_is_shared_like_model_pt(
    tmp_path: Path, umask: None, tiny_flags: Callable[..., list[str]]
) -> None:
    sweep = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", *COPY, *tiny_flags(FILES_RUN), "--out", str(sweep)])
    assert result.exit_code == 0, result.output
    board = runner.invoke(app, ["leaderboard", str(sweep), "--out", str(tmp_path / "board")])
    plot = runner.invoke(app, ["plot", str(sweep), "--task", "copy", "-o", str(tmp_path / "p.png")])
    assert board.exit_code == 0 and plot.exit_code == 0, board.output + plot.output
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    names = {p.name for p in written}
    assert {"results.parquet", "config.json", "model.pt", "accuracy_vs_length.png", "train_history.json",
            "README.md", "leaderboard.csv", "p.png"} <= names
    assert any(p.parent.name == "data" for p in written)
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {oct(0o644)}


def failing_fsync(after: int) -> object:
    """``os.fsync`` that reports a full disk from the (after+1)-th file on."""
    calls = {"n": 0}
    real = os.fsync

    def fsync(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd)

    return fsync


def test_disk_full_during_a_run_is_one_line_and_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_flags: Callable[..., list[str]]
) -> None:
    # config.json, the training state and train_history.json fit; model.pt does not
    monkeypatch.setattr(files.os, "fsync", failing_fsync(after=3))
    monkeypatch.setattr(files, "_sync_folder", lambda folder: None)
    out = tmp_path / "runs"
    result = runner.invoke(app, ["run", *COPY, *tiny_flags(FILES_RUN), "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: No space left on device: ") and lines[-1].endswith("model.pt")
    assert "Traceback" not in result.output
    assert leftovers(tmp_path) == []
    (run_dir,) = out.iterdir()
    # the training state stays: once there is room, the run resumes from it instead of step 0
    names = sorted(p.name for p in run_dir.iterdir())
    assert names == ["config.json", "train_history.json", "train_state.pt"]


def test_disk_full_at_once_leaves_no_empty_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_flags: Callable[..., list[str]]
) -> None:
    monkeypatch.setattr(files.os, "fsync", failing_fsync(after=0))
    out = tmp_path / "new" / "runs"
    result = runner.invoke(app, ["run", *COPY, *tiny_flags(FILES_RUN), "--out", str(out)])
    assert result.exit_code == 2 and "No space left on device" in result.stderr
    assert not (tmp_path / "new").exists()
    sweep = tmp_path / "sweep"
    result = runner.invoke(app, ["sweep", *COPY, *tiny_flags(FILES_RUN), "--out", str(sweep)])
    assert result.exit_code == 2 and "No space left on device" in result.stderr
    assert leftovers(tmp_path) == [] and not (sweep / "data").exists()


def test_disk_full_while_plotting_or_publishing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_flags: Callable[..., list[str]]
) -> None:
    sweep = tmp_path / "sweep"
    assert runner.invoke(app, ["sweep", "--task", "copy", "--attn", "softmax", *tiny_flags(FILES_RUN),
                               "--out", str(sweep)]).exit_code == 0
    monkeypatch.setattr(files.os, "fsync", failing_fsync(after=0))
    plot = runner.invoke(app, ["plot", str(sweep), "--task", "copy", "-o", str(tmp_path / "figs" / "p.png")])
    assert plot.exit_code == 2 and plot.stderr.startswith("error: No space left on device")
    assert not (tmp_path / "figs").exists()  # no 0-byte figure, no empty folder
    board = runner.invoke(app, ["leaderboard", str(sweep), "--out", str(tmp_path / "board")])
    assert board.exit_code == 2 and len(board.stderr.strip().splitlines()) == 1
    assert leftovers(tmp_path) == [] and not (tmp_path / "board").exists()


def test_a_successful_rerun_removes_a_stale_error_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_config: Callable[..., RunConfig]
) -> None:
    config = tiny_config(run=FILES_RUN)

    def broken_train(*args: object, **kwargs: object) -> None:
        raise RuntimeError("simulated crash")

    with monkeypatch.context() as patch:
        patch.setattr(harness_run, "train", broken_train)
        failed = execute(config, tmp_path, progress=False)
    run_dir = tmp_path / failed["run_id"].iloc[0]
    assert list(failed["status"]) == ["failed"]
    assert "simulated crash" in (run_dir / "error.txt").read_text()
    ok = execute(config, tmp_path, progress=False)
    assert (ok["status"] == "ok").all() and not (run_dir / "error.txt").exists()


def test_new_folder_removes_only_what_it_made(tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(RuntimeError), new_folder(kept / "a" / "b"):
        raise RuntimeError
    assert kept.is_dir() and not (kept / "a").exists()
    with pytest.raises(RuntimeError), new_folder(kept / "c" / "d") as folder:
        (folder / "x").write_text("x")
        raise RuntimeError
    assert (kept / "c" / "d" / "x").is_file()


# -- real file systems: a full one and a read-only one (tmpfs; needs permission to mount) ----------
def mount_tmpfs(path: Path, options: str) -> bool:
    if sys.platform != "linux" or os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, f"lengthgen-test-{uuid.uuid4().hex[:6]}",
                           str(path)], capture_output=True)
    return done.returncode == 0


@contextmanager
def tmpfs(path: Path, options: str) -> Iterator[Path]:
    if not mount_tmpfs(path, options):
        pytest.skip(f"needs root and tmpfs to mount a file system with {options}")
    try:
        yield path
    finally:
        subprocess.run(["umount", str(path)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "disk", "size=48k") as disk:
        yield disk


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    with tmpfs(tmp_path / "ro", "size=64k,ro") as disk:
        yield disk


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "lengthgen.cli", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_really_full_disk(small_disk: Path, tiny_flags: Callable[..., list[str]]) -> None:
    done = cli("run", "--task", "copy", "--attn", "softmax", *tiny_flags(FILES_RUN), "--out",
               str(small_disk / "runs"))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("error: No space left on device") and "Traceback" not in done.stderr
    assert leftovers(small_disk) == []


def test_a_read_only_folder(
    read_only_disk: Path, tmp_path: Path, tiny_flags: Callable[..., list[str]]
) -> None:
    for args in (["run", *COPY, *tiny_flags(FILES_RUN), "--out", str(read_only_disk)],
                 ["sweep", *COPY, *tiny_flags(FILES_RUN), "--out", str(read_only_disk / "s")],
                 ["plot", str(tmp_path), "--task", "copy", "-o", str(read_only_disk / "p.png")]):
        done = cli(*args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
        assert "not writable" in done.stderr


def test_a_results_file_replaced_while_it_is_read_comes_out_whole(tmp_path: Path) -> None:
    """A reader beside a writer that keeps replacing the file (a run saving its rows after every
    length) gets the old rows or the new ones, never an error: one open per read."""
    import threading

    from lengthgen.harness.storage.results import read_parquet_file

    path = tmp_path / "results.parquet"
    frames = [pd.DataFrame({"factor": list(range(n))}) for n in (3, 50)]
    atomic_write(path, lambda handle: frames[0].to_parquet(handle, index=False))
    stop = threading.Event()

    def replace_forever() -> None:
        for i in itertools.count():
            if stop.is_set():
                return
            atomic_write(path, frames[i % 2].to_parquet(index=False))

    writer = threading.Thread(target=replace_forever)
    writer.start()
    try:
        sizes = {len(read_parquet_file(path)) for _ in range(1500)}
    finally:
        stop.set()
        writer.join()
    assert sizes <= {3, 50} and sizes  # about 2% of path reads (pd.read_parquet) fail here
