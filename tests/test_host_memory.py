"""Freed score-sized tensors are reused without page faults once ``reuse_freed_memory`` ran, and
are not without it (each side in a fresh process: the setting is process-wide)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lengthgen.harness.host_memory import reuse_freed_memory

ROUNDS = """
import resource, sys, torch
if sys.argv[1] == "reuse":
    from lengthgen.harness.host_memory import reuse_freed_memory
    assert reuse_freed_memory()

def step():  # a step's worth of 7 MB tensors, made and freed
    blocks = [torch.ones(7_000_000 // 4) for _ in range(3)]
    del blocks

for _ in range(3):  # the heap grows to its working size
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    done = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True, check=True)
    return int(done.stdout.strip())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_freed_score_blocks_are_reused_without_page_faults() -> None:
    if not reuse_freed_memory():
        pytest.skip("not glibc")
    reused, default = _faults("reuse"), _faults("default")
    assert reused < 100 < default  # 7 MB is 1,709 pages: the default maps every block afresh
