"""A CPU training step reuses freed tensor memory once ``reuse_freed_memory`` ran, where glibc's
defaults keep mapping some of it afresh (each side in a fresh process: the setting is
process-wide). Measured on the paper-tasks MQMTAR ASEntmax step, whose score-sized tensors (7 MB)
are what the setting is for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lengthgen.harness.host_memory import reuse_freed_memory

STEPS = """
import json, resource, sys, torch
if sys.argv[1] == "reuse":
    from lengthgen.harness.host_memory import reuse_freed_memory
    assert reuse_freed_memory()
from lengthgen.config import build_run_config
from lengthgen.harness.batches import ModelBatch, masked_loss
from lengthgen.harness.run import build
torch.set_num_threads(1)
task, model = build(build_run_config("mqmtar", "asentmax", preset="paper-tasks"))
optimizer = torch.optim.AdamW(model.parameters())
batches = [ModelBatch.from_task(task.sample(64, 64, seed=(0, s), split="train"), "cpu") for s in range(4)]
faults = []
for i in range(12):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    batch = batches[i % 4]
    loss = masked_loss(model(batch.input_ids, batch.query_positions), batch)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _faults(mode: str) -> list[int]:
    """Minor page faults of each of 12 training steps, in a fresh process."""
    done = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(done.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator only")
def test_training_steps_reuse_freed_memory_instead_of_faulting_it_in() -> None:
    if not reuse_freed_memory():
        pytest.skip("not glibc")
    reused, default = _faults("reuse"), _faults("default")
    # after the first 4 steps (the heap grows to its working size); measured: ~1,000 against ~20,000
    assert 4 * sum(reused[4:]) < sum(default[4:]), (reused, default)
