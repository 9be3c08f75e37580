"""``benchmarks/gpu.py --smoke``: the GPU benchmark's every section at tiny sizes on CPU (Triton under
the interpreter), so the script a GPU session runs is known to work before one is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("compile", "training", "kernels", "correctness", "evaluation", "passes")


@pytest.mark.slow
def test_gpu_benchmark_smoke_writes_every_section(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # on a CPU the script sets TRITON_INTERPRET=1 itself
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--out-dir", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("gpu-*-smoke.json")
    result = json.loads(path.read_text())
    sections = result["sections"]
    assert tuple(sections) == SECTIONS and result["order"] == list(SECTIONS)
    assert all(section["status"] == "ok" for section in sections.values())
    assert sections["compile"]["rows"] == [{"skipped": "the Triton interpreter compiles nothing"}]
    assert "aborted" not in result and not list(tmp_path.glob("*.tmp"))
    assert sections["correctness"]["ok"] and all(row["ok"] for row in sections["correctness"]["rows"])
    kernels = {row["impl"]: row for row in sections["kernels"]["rows"]}
    assert kernels["entmax1.5"]["forward_ms"] > 0 and kernels["sdpa"]["forward_backward_ms"] > 0
    # adasplash is timed when it imports (and a GPU runs it), else skipped with the reason.
    assert "adasplash1.5" in kernels or sections["kernels"]["skipped"]["adasplash1.5"]
    passes = sections["passes"]["rows"]
    assert {row["regime"] for row in passes} == {"random", "peaked", "flat"}
    assert all(row["passes_median"] >= 2 and 0 < row["bwd_tile_share"] <= 1 for row in passes)
    training = sections["training"]["rows"]
    assert len(training) == 12 and all(row["steps_per_s"] > 0 and row["tflops"] > 0 for row in training)
    assert {(row["preset"], row["attn"], row["precision"]) for row in training} >= {
        ("paper-tasks", "asentmax", "fp32"), ("paper", "softmax", "bf16")}
    evaluation = sections["evaluation"]["rows"]
    assert [row["attn"] for row in evaluation] == ["asentmax", "softmax"]
    assert all(row["seconds"] > 0 and row["weights"] == "untrained" for row in evaluation)
    assert result["seconds"]["total"] > 0 and "compile" in result["seconds"]


def _gpu_module():
    """benchmarks/gpu.py as a module (it is a script, not part of the package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_benchmark", ROOT / "benchmarks" / "gpu.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


def test_the_json_on_disk_has_every_case_as_soon_as_it_is_measured(tmp_path: Path) -> None:
    gpu = _gpu_module()
    path = tmp_path / "gpu.json"
    report = gpu.Report(path, {"environment": {}, "sections": {}})
    report.open("training")
    budget = gpu.Budget(100.0)
    assert report.start(budget, {"attn": "softmax"})
    report.add({"attn": "softmax", "steps_per_s": 12.5})
    on_disk = json.loads(path.read_text())
    row = {"attn": "softmax", "steps_per_s": 12.5}
    assert on_disk["sections"]["training"] == {"status": "running", "rows": [row]}
    assert not report.start(gpu.Budget(-1.0), {"attn": "asentmax"})  # budget spent: recorded as skipped
    report.close({"task": "mqmtar"}, 3.0)
    on_disk = json.loads(path.read_text())["sections"]["training"]
    assert on_disk["status"] == "ok" and on_disk["task"] == "mqmtar" and on_disk["seconds"] == 3.0
    assert on_disk["rows"][1] == {"attn": "asentmax", "skipped": "time budget spent"}
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]  # the temporary file was renamed


_HUNG_CASE = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("gpu_benchmark", sys.argv[1])
gpu = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = gpu
spec.loader.exec_module(gpu)
report = gpu.Report(gpu.Path(sys.argv[2]), {"environment": {}, "sections": {}})
report.open("training")
report.add({"attn": "softmax", "steps_per_s": 12.5})
report.close({}, 1.0)
report.open("kernels")
assert report.start(gpu.Budget(100.0), {"n": 4096, "impl": "entmax1.5"})
gpu.arm_watchdog(report, 0.5, 2.0)  # fires after 0.5 s, reports the limit as 2 s
time.sleep(60)  # a case that hangs (or compiles for minutes): only the watchdog ends it
"""


def test_a_run_stopped_by_its_hard_limit_leaves_a_valid_json(tmp_path: Path) -> None:
    """The watchdog ends a run whose case outlives the hard limit: what was measured stays, and the
    JSON says which case was running (a hung case, so the test does not depend on speed)."""
    path = tmp_path / "gpu.json"
    proc = subprocess.run([sys.executable, "-c", _HUNG_CASE, str(ROOT / "benchmarks" / "gpu.py"), str(path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["aborted"] == "hard limit of 2 s reached"
    training, kernels = result["sections"]["training"], result["sections"]["kernels"]
    assert training == {"status": "ok", "rows": [{"attn": "softmax", "steps_per_s": 12.5}], "seconds": 1.0}
    assert kernels["status"] == "aborted" and kernels["running_case"] == "n=4096 impl=entmax1.5"
    assert [p.name for p in tmp_path.iterdir()] == ["gpu.json"]
