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
SECTIONS = ("correctness", "kernels", "passes", "training", "evaluation")


@pytest.mark.slow
def test_gpu_benchmark_smoke_writes_every_section(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # on a CPU the script sets TRITON_INTERPRET=1 itself
    command = [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--smoke", "--out-dir", str(tmp_path)]
    proc = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (path,) = tmp_path.glob("gpu-*-smoke.json")
    result = json.loads(path.read_text())
    sections = result["sections"]
    assert tuple(sections) == SECTIONS
    assert all(section["status"] == "ok" for section in sections.values())
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
