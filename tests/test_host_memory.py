"""Once ``reuse_freed_memory`` ran, a score-sized tensor is served from the heap (where a freed
block stays for the next one) instead of a fresh mapping (unmapped on free, faulted in anew next
time); each side in a fresh process, since the setting is process-wide. The page faults this
saves on a training step are measured in ``benchmarks/README.md``; counting them in a test was
flaky on a loaded machine, so the test checks where the block lives."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lengthgen.harness.host_memory import reuse_freed_memory

WHERE = """
import sys, torch
if sys.argv[1] == "reuse":
    from lengthgen.harness.host_memory import reuse_freed_memory
    assert reuse_freed_memory()
block = torch.empty(16 * 1024 * 1024 // 4)  # a 16 MB score block, the first of its size
address = block.data_ptr()
for line in open("/proc/self/maps"):
    if line.rstrip().endswith("[heap]"):
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= address < high:
            print("heap")
            break
else:
    print("mapping")
"""


def _where(mode: str) -> str:
    done = subprocess.run([sys.executable, "-c", WHERE, mode], capture_output=True, text=True, check=True)
    return done.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_a_score_sized_block_comes_from_the_heap_instead_of_a_fresh_mapping() -> None:
    if not reuse_freed_memory():
        pytest.skip("not glibc")
    assert _where("reuse") == "heap"
    assert _where("default") == "mapping"  # glibc's own threshold starts at 128 KiB
