"""Plan files are input to check: a plan someone downloads to rebuild a board sets only what a plan
is for. No variable of its numerics pin, no name of its sweeps and no path in it runs code, reads
outside its folder or reaches the page unescaped; every size is bounded; the provenance git call
is not steered by inherited ``GIT_*`` variables."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lengthgen import limits, provenance
from lengthgen.errors import UserError
from lengthgen.plans.plan import ablations_dir, load_plan, timings_dirs
from tests.hostile import payload_plugin

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}


@pytest.fixture
def plan_text(tiny_settings: Callable[..., dict[str, Any]]) -> Callable[..., str]:
    """``plan_text(head="", sweep="")``: a valid plan of one tiny run, with ``head`` before its
    sweep and ``sweep`` inside it."""
    settings = "{ " + ", ".join(f'"{k}" = {v}' for k, v in tiny_settings().items()) + " }"

    def text(head: str = "", sweep: str = "") -> str:
        return (f"{head}\n[[sweep]]\nname = \"tiny\"\ntask = [\"copy\"]\nattn = [\"softmax\"]\n"
                f"set = {settings}\n{sweep}\n")

    return text


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command in a fresh Python (a sitecustomize.py or LD_PRELOAD acts at start-up)."""
    return subprocess.run([sys.executable, "-m", "lengthgen.cli", *args], capture_output=True, text=True,
                          env=ENV, timeout=timeout, cwd=REPO)


def preload_library(folder: Path, marker: Path) -> Path | None:
    """A shared library whose constructor writes ``marker`` in every process that loads it."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = folder / "mark.c"
    source.write_text(textwrap.dedent(f"""
        #include <stdio.h>
        __attribute__((constructor)) static void mark(void) {{
            FILE *f = fopen("{marker}", "w");
            if (f) {{ fputs("loaded", f); fclose(f); }}
        }}
        """))
    library = folder / "libmark.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    return library


# -- 1: a numerics pin that would load code ---------------------------------------------------------
@pytest.mark.parametrize("flags", [("--jobs", "2"), ("--dry-run",), ("--launcher", "ray")],
                         ids=["jobs-2", "dry-run", "ray"])
def test_a_plan_pinning_pythonpath_never_runs_its_sitecustomize(
    tmp_path: Path, flags: tuple[str, ...], plan_text: Callable[..., str], one_line_error: Callable[..., None]
) -> None:
    marker = tmp_path / "sitecustomize-ran"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    plan = tmp_path / "evil.toml"
    plan.write_text(plan_text(f'numerics = {{ PYTHONPATH = "{evil}", ATEN_CPU_CAPABILITY = "avx2" }}'))
    done = cli("sweep", "--plan", str(plan), "--out", str(tmp_path / "out"), *flags, "--quiet")
    expected = ("'PYTHONPATH' is not a numerics pin; a plan may set only ATEN_CPU_CAPABILITY, "
                "MKL_ENABLE_INSTRUCTIONS" if flags[0] != "--launcher" else "drop --launcher")
    one_line_error(done, expected)
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("flags", [("--jobs", "2"), ("--dry-run",)], ids=["jobs-2", "dry-run"])
def test_a_plan_pinning_ld_preload_never_loads_the_library(
    tmp_path: Path, flags: tuple[str, ...], plan_text: Callable[..., str], one_line_error: Callable[..., None]
) -> None:
    marker = tmp_path / "library-loaded"
    library = preload_library(tmp_path, marker)
    if library is None:
        pytest.skip("no C compiler to build the library")
    subprocess.run(["true"], env={**ENV, "LD_PRELOAD": str(library)}, check=True)
    assert marker.is_file()  # the library works: it marks every process that loads it
    marker.unlink()
    plan = tmp_path / "evil.toml"
    plan.write_text(plan_text(f'numerics = {{ LD_PRELOAD = "{library}" }}'))
    done = cli("sweep", "--plan", str(plan), "--out", str(tmp_path / "out"), *flags, "--quiet")
    one_line_error(done, "'LD_PRELOAD' is not a numerics pin")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_a_plan_naming_a_plugin_file_never_imports_it(
    tmp_path: Path, plan_text: Callable[..., str], one_line_error: Callable[..., None]
) -> None:
    """Before: ``attn = ["payload.py:Payload"]`` in a plan ran the file, even with --dry-run."""
    marker = tmp_path / "payload-ran"
    spec = payload_plugin(tmp_path, marker)
    for field in ("attn", "task"):
        plan = tmp_path / f"{field}.toml"
        plan.write_text(plan_text().replace(f'{field} = ["{"softmax" if field == "attn" else "copy"}"]',
                                            f'{field} = ["{spec}"]'))
        for flags in (("--dry-run",), ()):
            done = cli("sweep", "--plan", str(plan), "--out", str(tmp_path / "out"), *flags, "--quiet")
            one_line_error(done, "is not a plain name")
            assert not marker.exists() and not (tmp_path / "out").exists()


# -- every other field --------------------------------------------------------------------------------
#: Each case: (the plan's text, made from the valid one, and the message it gets).
BAD_FIELDS: dict[str, tuple[Callable[[Callable[..., str]], str], str]] = {
    "a seed as text": (lambda text: text(sweep='seeds = ["0"]'), "seeds.0: Input should be a valid integer"),
    "a negative seed": (lambda text: text(sweep="seeds = [-1]"), "greater than or equal to 0"),
    "too many seeds": (lambda text: text(sweep=f"seeds = {list(range(limits.MAX_SEEDS + 1))}"),
                       "at most 10000 items"),
    "too many runs": (lambda text: text(sweep=f"seeds = {list(range(100))}\ngrid = {{ \"train.lr\" = "
                                      f"{[1e-3 + i * 1e-6 for i in range(1001)]} }}"),
                      "the plan makes 100,100 runs, over the limit of 100,000"),
    "an odd screening factor": (lambda text: text(sweep='grid = { "train.lr" = [1e-3, 2e-3] }\n'
                                                 'screen = { max_factor = 3 }'),
                                "must be a power of two, got 3"),
    "a sweep name with a slash": (lambda text: text().replace('name = "tiny"', 'name = "../x"'),
                                  "is not a plain name"),
    "a title of two lines": (lambda text: text('title = "board\\n# injected"'), "holds a control character"),
    "a long hardware note": (lambda text: text(f'hardware = "{"x" * 5000}"'), "is 5,000 characters long"),
    "ablations outside": (lambda text: text('ablations = "../elsewhere"'),
                          "is not a folder inside the plan's folder"),
    "ablations absolute": (lambda text: text('ablations = "/etc"'),
                           "is not a folder inside the plan's folder"),
    "timings outside": (lambda text: text('timings = ["data", "../elsewhere"]'),
                        "is not a folder inside the plan's folder"),
    "nine timings folders": (lambda text: text(f"timings = {[f'f{i}' for i in range(9)]}"),
                             "at most 8 items"),
    "deep nesting": (lambda text: text(f"x = {'[' * 100_000}"),
                     "nests lists or tables deeper than 32 levels"),
    "a 2 MB plan": (lambda text: text(f"# {'x' * 2_000_000}"),
                    "over the limit of 1,048,576 for a text file"),
    "nesting just past the limit": (lambda text: text(sweep=f'param = {{ deep = {"[" * 40 + "]" * 40} }}'),
                                    "nests lists or tables deeper than 32 levels"),
}


@pytest.mark.parametrize("case", list(BAD_FIELDS))
def test_each_plan_field_is_checked_in_one_line(
    tmp_path: Path, case: str, plan_text: Callable[..., str]
) -> None:
    make, expected = BAD_FIELDS[case]
    text = make(plan_text)
    plan = tmp_path / "plan.toml"
    plan.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=None) as caught:
        load_plan(plan)
    message = str(caught.value)
    assert expected in message and "\n" not in message and len(message) < 1000, message


def test_ablations_and_timings_through_a_link_out_of_the_plans_folder_are_refused(
    tmp_path: Path, plan_text: Callable[..., str]
) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    folder = tmp_path / "board"
    folder.mkdir()
    (folder / "ablations").symlink_to(outside)
    plan = folder / "plan.toml"
    plan.write_text(plan_text('ablations = "ablations"'))
    with pytest.raises(UserError, match="outside the plan's folder"):
        ablations_dir(load_plan(plan), plan)
    plan.write_text(plan_text('timings = ["ablations"]'))  # the folders an estimate reads: the same rule
    with pytest.raises(UserError, match="outside the plan's folder"):
        timings_dirs(load_plan(plan), plan)
    (folder / "ablations").unlink()
    (folder / "ablations").mkdir()
    assert timings_dirs(load_plan(plan), plan) == [folder / "ablations"]
    plan.write_text(plan_text('ablations = "ablations"'))
    assert ablations_dir(load_plan(plan), plan) == folder / "ablations"


def test_a_fifo_as_the_plan_is_refused_without_waiting(
    tmp_path: Path, one_line_error: Callable[..., None]
) -> None:
    fifo = tmp_path / "plan.toml"
    os.mkfifo(fifo)
    done = cli("sweep", "--plan", str(fifo), "--out", str(tmp_path / "out"), "--dry-run", timeout=60)
    one_line_error(done, "is not a regular file")


def test_the_provenance_git_call_ignores_inherited_git_settings(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: GIT_CONFIG_KEY_0=core.fsmonitor made `git status` run a command, with one job too."""
    marker = tmp_path / "fsmonitor-ran"
    for name, value in {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.fsmonitor",
                        "GIT_CONFIG_VALUE_0": f"touch {marker}; false"}.items():
        monkeypatch.setenv(name, value)
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("no git checkout")
    steered = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True)
    if not marker.exists():
        pytest.skip("this git does not run core.fsmonitor commands")
    marker.unlink()
    assert steered is not None
    commit, dirty = provenance.checkout.__wrapped__()  # type: ignore[attr-defined]
    assert commit and dirty is not None and not marker.exists()
    assert provenance.data_commit(REPO / "leaderboard" / "data") != "unknown" and not marker.exists()


def test_an_ablation_whose_about_is_a_link_is_refused(tmp_path: Path) -> None:
    from lengthgen.harness.storage.results import write_parquet_atomic
    from lengthgen.leaderboard.ablations import load_ablations
    from tests.leaderboard_rows import make_rows

    secret = tmp_path / "secret.md"
    secret.write_text("# TOP SECRET\n\nnot for the page\n", encoding="utf-8")
    ablation = tmp_path / "ablations" / "a"
    write_parquet_atomic(make_rows({("softmax", 0): [1.0, 0.5]}), ablation / "data" / "rows.parquet")
    (ablation / "ABOUT.md").symlink_to(secret)
    with pytest.raises(UserError, match="ABOUT.md is a symbolic link"):
        load_ablations(tmp_path / "ablations")
