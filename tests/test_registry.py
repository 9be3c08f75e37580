"""The registry: collisions, lookups, entry-point plugins (via a real dist-info on sys.path), file specs."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

from lengthgen.registry import DuplicateNameError, PluginLoadError, Registry, UnknownNameError
from lengthgen.tasks import TASKS, Task, get_task, register_task, validate_task

PLUGIN_MODULE = "lg_fake_plugin_mod"

PLUGIN_SOURCE = '''
"""A task shipped by a separate (fake) distribution."""
import numpy as np

from lengthgen.tasks.base import Task, TaskBatch, Vocab, seq2seq_view


class EchoTask(Task):
    name = "fake_echo"
    description = "Echo a run of zeros (plugin test)."

    @property
    def vocab(self):
        return Vocab.with_specials(["z"])

    @property
    def min_length(self):
        return 1

    @property
    def default_train_length(self):
        return 4

    def _generate(self, rng, n, length, split):
        src = np.full((n, length), 4, dtype=np.int64)
        ids, mask = seq2seq_view(src, src)
        return TaskBatch(ids, mask, [[0] * length] * n, [[0] * length] * n)


class NotATask:
    pass

'''


def make_distribution(
    root: Path, dist: str, entry_points: dict[str, str], group: str = "lengthgen.tasks"
) -> None:
    """Write ``<dist>-0.1.dist-info`` with METADATA and entry_points.txt: what pip would install."""
    info = root / f"{dist}-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = [f"[{group}]"] + [f"{name} = {value}" for name, value in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A sys.path entry holding a plugin module and a distribution advertising its entry points."""
    (tmp_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE)
    (tmp_path / "lg_fake_explode_mod.py").write_text('raise RuntimeError("plugin exploded on import")\n')
    make_distribution(
        tmp_path,
        "lg_fake_plugin",
        {
            "fake_echo": f"{PLUGIN_MODULE}:EchoTask",
            "fake_missing_module": "lg_no_such_module_anywhere:Task",
            "fake_not_a_task": f"{PLUGIN_MODULE}:NotATask",
            "fake_missing_attr": f"{PLUGIN_MODULE}:Nope",
            "fake_explodes": "lg_fake_explode_mod:Task",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, PLUGIN_MODULE, raising=False)
    yield tmp_path
    sys.modules.pop(PLUGIN_MODULE, None)


def fresh_task_registry() -> Registry[type[Task]]:
    """A registry over the real ``lengthgen.tasks`` group, without touching the global one."""
    return Registry("task", "lengthgen.tasks", validate=validate_task)


# --------------------------------------------------------------------------------------------
def test_duplicate_registration_names_both_origins() -> None:
    reg: Registry[type] = Registry("widget", "lengthgen.test_widgets")

    @reg.register("spinner")
    class First:
        pass

    class Second:
        pass

    with pytest.raises(DuplicateNameError) as err:
        reg.register("spinner")(Second)
    message = str(err.value)
    assert f"{First.__module__}:{First.__qualname__}" in message
    assert f"{Second.__module__}:{Second.__qualname__}" in message
    assert reg.get("spinner") is First  # the first registration stands
    reg.register("spinner")(First)  # re-registering the same object is harmless


def test_duplicate_task_name_against_builtin() -> None:
    class FakeCopy(get_task("copy").__class__):
        name = "copy"

    with pytest.raises(DuplicateNameError, match=r"lengthgen\.tasks\.sequence:Copy.*FakeCopy"):
        register_task()(FakeCopy)
    assert TASKS.get("copy").__name__ == "Copy"


def test_unknown_name_lists_valid_names() -> None:
    with pytest.raises(UnknownNameError) as err:
        TASKS.get("no_such_task")
    message = str(err.value)
    assert "no_such_task" in message and "\n" not in message
    for name in TASKS.names():
        assert name in message


def test_register_rejects_non_tasks() -> None:
    with pytest.raises(TypeError, match="not a subclass"):
        register_task("not_a_task")(int)


# --------------------------------------------------------------------------------------------
def test_entry_point_discovery(plugin_path: Path) -> None:
    reg = fresh_task_registry()
    names = reg.names()  # broken plugins are reported, never raised
    assert "fake_echo" in names
    assert not any(n.startswith("fake_") and n != "fake_echo" for n in names)
    echo = reg.get("fake_echo")
    assert issubclass(echo, Task)
    batch = echo().sample(2, 3)
    assert batch.target == [[0, 0, 0], [0, 0, 0]]
    entry = next(e for e in reg.entries() if e.name == "fake_echo")
    assert "entry point 'fake_echo'" in entry.origin and not entry.builtin


def test_broken_entry_points_reported(plugin_path: Path) -> None:
    reg = fresh_task_registry()
    assert "fake_echo" in reg.names()
    assert set(reg.broken) >= {"fake_missing_module", "fake_not_a_task", "fake_missing_attr", "fake_explodes"}
    assert reg.broken["fake_explodes"] == "RuntimeError: plugin exploded on import"
    assert "ModuleNotFoundError" in reg.broken["fake_missing_module"]
    assert "not a subclass" in reg.broken["fake_not_a_task"]
    for message in reg.broken.values():
        assert "\n" not in message
    with pytest.raises(UnknownNameError, match="failed to load"):
        reg.get("fake_not_a_task")


def test_plugin_cannot_shadow_builtin(plugin_path: Path) -> None:
    reg = fresh_task_registry()

    class Builtin(get_task("copy").__class__):
        name = "fake_echo"

    reg.add("fake_echo", Builtin, builtin=True)
    with pytest.warns(UserWarning, match="built-in"):
        reg.names()
    assert reg.get("fake_echo") is Builtin


def test_two_plugins_same_name(plugin_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("second_dist")
    make_distribution(other, "lg_fake_plugin_two", {"fake_echo": f"{PLUGIN_MODULE}:EchoTask2"})
    extra = "\nclass EchoTask2(EchoTask):\n    pass\n"
    (plugin_path / f"{PLUGIN_MODULE}.py").write_text(PLUGIN_SOURCE + extra)
    sys.path.insert(1, str(other))
    try:
        reg = fresh_task_registry()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            names = reg.names()
    finally:
        sys.path.remove(str(other))
    assert "fake_echo" in names
    # whichever distribution loads second is reported, naming the first
    assert "fake_echo" in reg.broken and "also provided by" in reg.broken["fake_echo"]


def test_entry_point_end_to_end_cli(plugin_path: Path) -> None:
    """A separately installed package's task shows up in a fresh ``lengthgen`` process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "lengthgen.cli"]
    listing = subprocess.run([*cmd, "tasks"], env=env, capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "fake_echo" in listing.stdout and "Echo a run of zeros" in listing.stdout
    assert "fake_not_a_task" in listing.stdout and "[broken plugin]" in listing.stdout
    for builtin in ("copy", "mqmtar", "flip_flop"):
        assert builtin in listing.stdout
    sample = subprocess.run(
        [*cmd, "sample", "--task", "fake_echo", "--length", "2"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert sample.returncode == 0, sample.stderr
    assert '"task":"fake_echo"' in sample.stdout


# --------------------------------------------------------------------------------------------
LOCAL_TASK = textwrap.dedent(
    """
    import numpy as np

    from lengthgen.tasks.sequence import Copy


    class DoubleCopy(Copy):
        name = "double_copy"
        description = "Copy twice (local file test)."

        def _transform(self, source):
            return np.concatenate([source, source], axis=1)


    class Helper:
        pass
    """
)


def test_file_spec_loading(tmp_path: Path) -> None:
    path = tmp_path / "my_tasks.py"
    path.write_text(LOCAL_TASK)
    cls = TASKS.get(f"{path}:DoubleCopy")
    assert cls.name == "double_copy"
    assert "double_copy" not in TASKS.names()  # ad hoc: not registered
    batch = get_task(f"{path}:DoubleCopy").sample(1, 3, seed=0)
    assert batch.target[0] == batch.source[0] * 2
    assert TASKS.get(f"{path}:DoubleCopy") is cls  # imported once


def test_module_spec_loading() -> None:
    assert TASKS.get("lengthgen.tasks.sequence:Copy") is TASKS.get("copy")


def test_bad_specs(tmp_path: Path) -> None:
    path = tmp_path / "my_tasks.py"
    path.write_text(LOCAL_TASK)
    with pytest.raises(PluginLoadError, match="no such file"):
        TASKS.get(f"{tmp_path / 'absent.py'}:X")
    with pytest.raises(PluginLoadError, match="DoubleCopy") as err:
        TASKS.get(f"{path}:Missing")
    assert "Helper" in str(err.value)
    with pytest.raises(PluginLoadError, match="not a subclass"):
        TASKS.get(f"{path}:Helper")
    with pytest.raises(PluginLoadError, match="bad spec"):
        TASKS.get(":Copy")
    with pytest.raises(PluginLoadError, match="ModuleNotFoundError"):
        TASKS.get("lg_no_such_module_anywhere:Copy")


# --------------------------------------------------------------------------------------------
TOY_TASK = '''
"""A built-in task that exists only in this test: one new file in lengthgen/tasks/."""
import numpy as np

from lengthgen.tasks import register_task
from lengthgen.tasks.base import Task, TaskBatch, Vocab, seq2seq_view


@register_task()
class Toy(Task):
    name = "toy_last"
    description = "Output the last of a run of bits (a throwaway built-in)."
    length_unit = "bits"
    min_length = 1
    default_train_length = 4

    @property
    def vocab(self):
        return Vocab.with_specials(["0", "1"])

    def _generate(self, rng, n, length, split):
        bits = rng.integers(0, 2, size=(n, length), dtype=np.int64)
        ids, mask = seq2seq_view(bits + 4, bits[:, -1:] + 4)
        return TaskBatch(ids, mask, bits.tolist(), bits[:, -1:].tolist())
'''

TOY_BACKEND = '''
"""A built-in backend that exists only in this test: one new file in lengthgen/attention/."""
import torch

from lengthgen.attention import register_attention
from lengthgen.attention.backend import AttentionBackend


@register_attention()
class Toy(AttentionBackend):
    name = "toy_relu2"
    description = "relu(z - max z + 1)^2, renormalized (a throwaway built-in)"

    def normalize(self, scores):
        z = scores.float()
        w = torch.relu(z - z.amax(dim=-1, keepdim=True) + 1.0).square()
        return w / w.sum(dim=-1, keepdim=True)
'''


def test_a_builtin_task_or_backend_is_one_new_file(tmp_path: Path) -> None:
    """A copy of the package with one decorated task file and one decorated backend file added, and
    nothing else changed: both are listed, and a run trains and evaluates them end to end."""
    import shutil

    import pandas as pd

    import lengthgen

    copy = tmp_path / "src" / "lengthgen"
    shutil.copytree(Path(lengthgen.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "tasks" / "toy_last.py").write_text(TOY_TASK)
    (copy / "attention" / "toy_relu2.py").write_text(TOY_BACKEND)
    env = {**os.environ, "PYTHONPATH": str(copy.parent)}
    cli = [sys.executable, "-m", "lengthgen.cli"]

    def lengthgen_cli(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([*cli, *args], env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return done

    tasks = {line.split()[0]: line for line in lengthgen_cli("tasks").stdout.splitlines()}
    assert "Output the last of a run of bits" in tasks["toy_last"] and "[broken" not in tasks["toy_last"]
    backends = {line.split()[0]: line for line in lengthgen_cli("attns").stdout.splitlines() if line.strip()}
    assert "relu(z - max z + 1)^2" in backends["toy_relu2"]
    lengthgen_cli("run", "--task", "toy_last", "--attn", "toy_relu2", "--steps", "3", "--max-factor", "2",
                  "--eval-samples", "4", "--quiet", "--out", str(tmp_path / "runs"))
    (results,) = (tmp_path / "runs").glob("toy_last-toy_relu2-*/results.parquet")
    rows = pd.read_parquet(results)
    assert list(rows["factor"]) == [1, 2] and (rows["status"] == "ok").all()
    assert set(rows["task"]) == {"toy_last"} and set(rows["attn"]) == {"toy_relu2"}
