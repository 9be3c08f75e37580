"""Plugins end to end: the installed example distribution, broken and colliding plugins (through
real ``*.dist-info`` directories on ``sys.path``), ``file.py:Class`` / ``module:Class`` specs,
and the example backend passing the generic backend suite.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

import lengthgen.api as api
from lengthgen.attention import ATTENTION, validate_backend
from lengthgen.cli import app
from lengthgen.registry import PluginLoadError, PluginWarning, Registry, UnknownNameError
from lengthgen.tasks import TASKS, validate_task
from lengthgen.testing import CHECKS, check_backend

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "lengthgen-plugin-example"
EXAMPLE_SRC = EXAMPLE / "src" / "lengthgen_example_plugin"
EXAMPLE_DIST = "lengthgen-example-plugin"
#: Small enough for a few seconds on a shared 2-core CPU.
#: The tiny run of these tests: two steps, evaluated at 1× only.
PLUGIN_RUN = {"train.steps": 2, "eval.max_factor": 1, "eval.samples": 4, "train.train_length": 8}

runner = CliRunner()


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models: a second thread only adds overhead (and thrashes on a shared, loaded CPU)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _example_installed() -> bool:
    try:
        metadata.distribution(EXAMPLE_DIST)
    except metadata.PackageNotFoundError:
        return False
    return True


needs_example = pytest.mark.skipif(
    not _example_installed(),
    reason=f"{EXAMPLE_DIST} not installed (pip install -e examples/lengthgen-plugin-example)",
)


def invoke(args: list[str]) -> tuple[int, str]:
    result = runner.invoke(app, args)
    return result.exit_code, result.output


# -- a fake installed distribution with good, broken and colliding plugins ----------------------
PLUGIN_MODULE = "lg_t7_plugins"

PLUGIN_SOURCE = textwrap.dedent(
    '''
    import torch

    from lengthgen.api import AttentionBackend


    class Good(AttentionBackend):
        name = "lg_good"
        description = "good plugin backend (test)"

        def normalize(self, scores):
            return torch.softmax(scores.float(), dim=-1).to(scores.dtype)


    class Other(Good):
        description = "the same entry-point name from a second distribution (test)"


    class Abstract(AttentionBackend):
        name = "lg_abstract"
        description = "forgot normalize"


    class NoName(Good):
        name = 42


    def not_a_backend():
        return 1
    '''
)

BROKEN = {
    "lg_import_error": "ModuleNotFoundError",
    "lg_explodes": "RuntimeError: exploded on import",
    "lg_exits": "SystemExit: 3",
    "lg_wrong_type": "not a subclass",
    "lg_abstract": "abstract",
    "lg_no_name": "no string attribute 'name'",
}


def make_distribution(root: Path, dist: str, groups: dict[str, dict[str, str]]) -> None:
    """What pip leaves behind: ``<dist>-0.1.dist-info`` with METADATA and entry_points.txt.

    As in wheels, the folder name spells the distribution with underscores: importlib.metadata
    takes the name from the folder up to the first ``-``.
    """
    info = root / f"{dist.replace('-', '_')}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = []
    for group, entries in groups.items():
        lines += [f"[{group}]"] + [f"{name} = {value}" for name, value in entries.items()] + [""]
    (info / "entry_points.txt").write_text("\n".join(lines))


@pytest.fixture
def plugin_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two distributions' worth of plugins (not yet on sys.path)."""
    root = tmp_path_factory.mktemp("plugins")
    (root / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE)
    (root / "lg_t7_explodes.py").write_text('raise RuntimeError("exploded on import\\nsecond line")\n')
    (root / "lg_t7_exits.py").write_text("import sys\nsys.exit(3)\n")
    make_distribution(root, "lg-t7-plugins", {
        "lengthgen.attention": {
            "lg_good": f"{PLUGIN_MODULE}:Good",
            "lg_import_error": "lg_t7_no_such_module:Backend",
            "lg_explodes": "lg_t7_explodes:Backend",
            "lg_exits": "lg_t7_exits:Backend",
            "lg_wrong_type": f"{PLUGIN_MODULE}:not_a_backend",
            "lg_abstract": f"{PLUGIN_MODULE}:Abstract",
            "lg_no_name": f"{PLUGIN_MODULE}:NoName",
            "softmax": f"{PLUGIN_MODULE}:Good",  # collides with a built-in
        },
        "lengthgen.tasks": {"lg_backend_as_task": f"{PLUGIN_MODULE}:Good"},
    })
    second = root / "second"
    make_distribution(second, "lg-t7-second", {"lengthgen.attention": {"lg_good": f"{PLUGIN_MODULE}:Other"}})
    return root


def _fresh_plugins(registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a global registry forget its plugins (kept: built-ins) until the test ends."""
    registry._ensure_builtins()
    monkeypatch.setattr(registry, "_entries", {n: e for n, e in registry._entries.items() if e.builtin})
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    monkeypatch.setattr(registry, "broken", {})


@pytest.fixture
def installed_plugins(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The fake distributions on sys.path and the global registries reset to built-ins only."""
    monkeypatch.syspath_prepend(str(plugin_dir / "second"))
    monkeypatch.syspath_prepend(str(plugin_dir))
    for registry in (ATTENTION, TASKS):
        _fresh_plugins(registry, monkeypatch)
    yield plugin_dir
    for name in (PLUGIN_MODULE, "lg_t7_explodes", "lg_t7_exits"):
        sys.modules.pop(name, None)


def test_broken_plugins_listed_in_one_line_each(installed_plugins: Path) -> None:
    with pytest.warns(PluginWarning, match="'softmax'.*ignored.*built-in"):
        code, out = invoke(["attns"])
    assert code == 0, out
    lines = out.splitlines()
    for builtin in ("softmax", "ssmax", "topk", "asentmax"):
        assert any(line.split()[0] == builtin and "[broken" not in line for line in lines)
    assert any(line.split()[0] == "lg_good" and "good plugin backend" in line for line in lines)
    for name, error in BROKEN.items():
        mine = [line for line in lines if line.split()[0] == name]
        assert len(mine) == 1 and "[broken plugin]" in mine[0] and error in mine[0], (name, mine)
    assert "second line" not in out
    # built-ins win: the name still means the built-in
    assert ATTENTION.get("softmax").__module__ == "lengthgen.attention.softmax_family"
    code, out = invoke(["tasks"])
    assert code == 0 and "copy" in out
    broken_task = [line for line in out.splitlines() if line.startswith("lg_backend_as_task")]
    assert len(broken_task) == 1 and "[broken plugin]" in broken_task[0]


def test_two_plugins_with_one_name(installed_plugins: Path) -> None:
    with pytest.warns(PluginWarning):
        names = ATTENTION.names()
    assert "lg_good" in names
    # the first distribution on sys.path wins; the other is reported, naming the winner
    assert ATTENTION.get("lg_good").__name__ == "Good"
    assert "DuplicateNameError" in ATTENTION.broken["lg_good"]
    assert f"{PLUGIN_MODULE}:Good, from lg-t7-plugins" in ATTENTION.broken["lg_good"]


def test_runs_unaffected_by_broken_plugins(
    installed_plugins: Path, tmp_path: Path, tiny_flags: Callable[..., list[str]]
) -> None:
    out_dir = tmp_path / "runs"
    with pytest.warns(PluginWarning):
        code, out = invoke(["run", "--task", "copy", "--attn", "lg_good", *tiny_flags(PLUGIN_RUN),
                            "--out", str(out_dir)])
    assert code == 0, out
    code, out = invoke(["run", "--task", "copy", "--attn", "softmax", *tiny_flags(PLUGIN_RUN),
                        "--out", str(out_dir)])
    assert code == 0, out
    frames = pd.concat(pd.read_parquet(p) for p in out_dir.glob("*/results.parquet"))
    assert sorted(frames["attn"]) == ["lg_good", "softmax"] and (frames["status"] == "ok").all()
    code, out = invoke(["run", "--task", "copy", "--attn", "lg_abstract", *tiny_flags(PLUGIN_RUN),
                        "--out", str(out_dir)])
    assert code == 2
    error = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "failed to load" in error[0] and "abstract" in error[0]


def test_cli_process_survives_broken_plugins(plugin_dir: Path) -> None:
    """A fresh ``lengthgen attns`` process: exit 0, a one-line warning, one line per broken plugin."""
    paths = [str(plugin_dir), str(plugin_dir / "second"), os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "lengthgen.cli", "attns"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: plugin attention backend 'softmax'")
    assert sum("[broken plugin]" in line for line in proc.stdout.splitlines()) == len(BROKEN) + 1
    assert "softmax" in proc.stdout and "lg_good" in proc.stdout


# -- the real example distribution ----------------------------------------------------------------
@needs_example
def test_example_distribution_discovered() -> None:
    dist = metadata.distribution(EXAMPLE_DIST)
    groups = {(ep.group, ep.name) for ep in dist.entry_points}
    assert {("lengthgen.attention", "relu2"), ("lengthgen.tasks", "parity")} <= groups
    for group, kind, validate, name in [
        ("lengthgen.attention", "attention backend", validate_backend, "relu2"),
        ("lengthgen.tasks", "task", validate_task, "parity"),
    ]:
        registry = Registry(kind, group, validate=validate)  # empty: only what entry points give
        assert name in registry.names(), registry.broken
        entry = next(e for e in registry.entries() if e.name == name)
        assert not entry.builtin and f"entry point {name!r}" in entry.origin
        assert entry.obj.__module__.startswith("lengthgen_example_plugin.")
    code, out = invoke(["attns"])
    assert code == 0 and any(line.split()[0] == "relu2" for line in out.splitlines() if line.strip())
    code, out = invoke(["tasks"])
    assert code == 0 and any(line.startswith("parity ") for line in out.splitlines())
    code, out = invoke(["attns", "--describe", "relu2"])  # a plugin's options, as its Options define them
    assert code == 0 and out.splitlines()[0].startswith("relu2: ") and "[lengthgen-example-plugin " in out
    assert "    margin = 1.0  keys more than this below the row max get weight 0" in out.splitlines()


def test_attns_describe_lists_each_option_with_its_default() -> None:
    """Every field of a backend's Options, in order, with its default and description; a backend
    without options says so; an unknown name is the registry's one-line error (exit 2)."""
    from lengthgen.attention import ATTENTION

    code, out = invoke(["attns", "--describe", "asentmax"])
    fields = ATTENTION.get("asentmax").Options.model_fields
    listed = [line.split(" = ")[0].strip() for line in out.splitlines()[2:]]
    assert code == 0 and listed == list(fields) and "    alpha = 1.5  entmax" in out
    code, out = invoke(["attns", "--describe", "softmax"])
    assert code == 0 and out.splitlines()[1:] == ["  options (set with --attn-option key=value):",
                                                  "    (none)"]
    code, out = invoke(["attns", "--describe", "nosuch"])
    assert code == 2 and "valid attention backends: " in out and "softmax" in out


@needs_example
def test_example_run_end_to_end(tmp_path: Path) -> None:
    """What CI runs: the example's task with the example's backend."""
    args = ["run", "--task", "parity", "--attn", "relu2", "--steps", "20", "--max-factor", "2",
            "--eval-samples", "8", "--quiet", "--out", str(tmp_path)]
    code, out = invoke(args)
    assert code == 0, out
    (run_dir,) = tmp_path.iterdir()
    assert run_dir.name.startswith("parity-relu2-nape-s0-")
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert list(frame["eval_length"]) == [16, 32] and (frame["status"] == "ok").all()
    assert set(frame["attn"]) == {"relu2"} and set(frame["task"]) == {"parity"}
    assert (frame["attn_support"] > 0).all()  # diagnostics come for free
    assert (run_dir / "accuracy_vs_length.png").is_file()


def test_example_backend_passes_the_suite() -> None:
    """Loaded straight from the example's source file: no installation needed."""
    spec = f"{EXAMPLE_SRC / 'relu2.py'}:ReLU2Attention"
    assert check_backend(spec) == list(CHECKS)
    assert check_backend(spec, margin=0.25, skip=["training", "positions"])


# -- ad-hoc specs --------------------------------------------------------------------------------
def test_file_specs_run_end_to_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tiny_flags: Callable[..., list[str]]
) -> None:
    """``./file.py:Class`` for both task and backend; the run folder is visible and sane."""
    (tmp_path / "my_task.py").write_text((EXAMPLE_SRC / "parity.py").read_text())
    (tmp_path / "my_attn.py").write_text((EXAMPLE_SRC / "relu2.py").read_text())
    monkeypatch.chdir(tmp_path)
    task_spec, attn_spec = "./my_task.py:Parity", "./my_attn.py:ReLU2Attention"
    assert "relu2" not in ATTENTION._entries or ATTENTION.get(attn_spec) is not ATTENTION.get("relu2")
    code, out = invoke(["run", "--task", task_spec, "--attn", attn_spec, "--attn-option", "margin=0.5",
                        *tiny_flags(PLUGIN_RUN), "--out", "runs"])
    assert code == 0, out
    (run_dir,) = (tmp_path / "runs").iterdir()
    # safe_name: no separators, and no leading dot (that would hide the folder)
    assert run_dir.name.startswith("my_task.py_Parity-._my_attn.py_ReLU2Attention-nape-s0-"), run_dir.name
    frame = pd.read_parquet(run_dir / "results.parquet")
    assert (frame["status"] == "ok").all()
    assert set(frame["task"]) == {task_spec} and set(frame["attn"]) == {attn_spec}
    assert ATTENTION.get(attn_spec) is ATTENTION.get(attn_spec)  # imported once


def test_module_spec() -> None:
    assert ATTENTION.get("lengthgen.attention.softmax_family:TopK") is ATTENTION.get("topk")


def test_bad_file_specs(tmp_path: Path, tiny_flags: Callable[..., list[str]]) -> None:
    path = tmp_path / "broken_attn.py"
    path.write_text("import torch\nraise ValueError('bad plugin\\nmore')\n")
    for _ in range(2):  # a failed import leaves nothing half-initialized behind
        with pytest.raises(PluginLoadError, match="ValueError: bad plugin$"):
            ATTENTION.get(f"{path}:Anything")
    assert not any(getattr(m, "__file__", None) == str(path) for m in list(sys.modules.values()))
    good = tmp_path / "good_attn.py"
    good.write_text((EXAMPLE_SRC / "relu2.py").read_text())
    with pytest.raises(PluginLoadError, match="ReLU2Attention") as err:
        ATTENTION.get(f"{good}:Relu2")  # a typo: the message lists the classes there
    assert "\n" not in str(err.value)
    with pytest.raises(PluginLoadError, match="not a subclass"):
        ATTENTION.get(f"{good}:ReLU2Options")
    code, out = invoke(["run", "--task", "copy", "--attn", f"{path}:X", *tiny_flags(PLUGIN_RUN),
                        "--out", str(tmp_path)])
    assert code == 2 and out.count("\n") == 1 and out.startswith("error: cannot load")
    with pytest.raises(UnknownNameError):
        ATTENTION.get("no_such_backend")


# -- the API module ------------------------------------------------------------------------------
def test_api_exports() -> None:
    for name in api.__all__:
        assert getattr(api, name) is not None
    assert api.AttentionBackend in ATTENTION.get("softmax").__mro__  # the built-ins' own base class
    assert issubclass(TASKS.get("copy"), api.Task)
    doc = api.__doc__ or ""
    for promise in ("normalize", "query_scale", "chunked", "diagnostics", "leaderboard", "file.py:ClassName"):
        assert promise in doc
