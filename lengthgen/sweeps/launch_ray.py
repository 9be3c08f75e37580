"""The Ray launcher: one Ray task per run, on a cluster or on a local Ray instance."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pandas as pd

from lengthgen.config import RunConfig
from lengthgen.errors import UserError, exception_line
from lengthgen.sweeps.dataset import record_if_missing, run_key
from lengthgen.sweeps.launch_local import OnDone
from lengthgen.sweeps.worker import RunOutcome, failed_frame, outcome_of, run_one

__all__ = ["launch_ray"]


def _ray_task(config: RunConfig, out: str, device: str, threads: int | None,
              cwd: str, log: str | None) -> tuple[RunOutcome, pd.DataFrame]:
    return run_one(config, out, device, threads, cwd, log)


def launch_ray(todo: Sequence[RunConfig], out: str, device: str, jobs: int | None, address: str | None,
               on_done: OnDone, log: str | None = None) -> None:
    """One Ray task per run: one GPU each where the cluster has GPUs, else CPUs.

    Connects to ``address`` (or a cluster this process already joined), otherwise starts a local
    instance with ``jobs`` CPUs. Each task writes its own data file; the driver writes it from the
    returned rows too when the worker's file is not visible here (nodes without a shared disk).
    """
    try:
        import ray
    except ImportError:
        raise UserError("--launcher ray needs Ray: pip install 'lengthgen[ray]'") from None
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address)
        else:
            ray.init(num_cpus=jobs, include_dashboard=False)
        started = True
    try:
        resources = ray.cluster_resources()
        if resources.get("GPU", 0) >= 1 and device != "cpu":
            options: dict[str, Any] = {"num_gpus": 1, "num_cpus": 1}
            threads = None
        else:
            cpus = int(resources.get("CPU", 1))
            per_run = max(1, cpus // jobs) if jobs else 1
            options, threads = {"num_cpus": per_run}, per_run
        remote = ray.remote(_ray_task).options(**options)
        cwd = os.getcwd()
        pending = {remote.remote(c, out, device, threads, cwd, log): c for c in todo}
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    config = pending.pop(ref)
                    try:
                        outcome, frame = ray.get(ref)
                        record_if_missing(config, out, frame)
                    except Exception as exc:  # the task or its worker died (crash, node loss, OOM kill)
                        cause = getattr(exc, "cause", exc)
                        if isinstance(cause, UserError):  # the same for every run: stop
                            raise UserError(str(cause)) from None
                        frame = failed_frame(config, f"ray task died: {exception_line(exc)}")
                        record_if_missing(config, out, frame)
                        outcome = outcome_of(run_key(config), frame, 0.0)
                    on_done(outcome)
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()
