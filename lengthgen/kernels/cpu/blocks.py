"""Running (head, query block) work items of the fused CPU row kernels on worker threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels import chunking
from lengthgen.kernels.problem import AttnProblem

__all__ = ["RowJob", "as_f32", "run_blocks"]


def as_f32(t: Tensor) -> np.ndarray:
    """A float32 numpy view (or copy) of a CPU tensor."""
    return t.detach().to(torch.float32).numpy()


def run_blocks(
    work: Callable[..., int], blocks: Sequence[tuple[int, ...]], buf_len: int, threads: int | None
) -> int:
    """Run ``work(*block, buf)`` on worker threads, biggest blocks first; returns the summed results.

    A block is (head, first row, rows, keys). Each worker runs its BLAS call and the (GIL-free)
    numba kernel single-threaded, so the workers never wait on each other: one shared OpenMP pool
    would put a barrier in every block, and on a busy machine a descheduled pool thread stalled
    all the others (measured 5-20× slowdowns). ``buf`` is a per-thread float32 score buffer.
    """
    n_threads = max(1, min(threads or torch.get_num_threads(), len(blocks)))
    order = sorted(blocks, key=lambda b: -b[-1] * b[-2])
    if n_threads == 1:
        buf = torch.empty(buf_len, dtype=torch.float32)
        return sum(work(*b, buf) for b in order)
    lock = threading.Lock()
    queue = iter(order)
    totals = [0] * n_threads
    errors: list[BaseException] = []

    def worker(slot: int) -> None:
        try:
            torch.set_num_threads(1)  # this thread's OpenMP ICV (and MKL's, restored below)
            buf = torch.empty(buf_len, dtype=torch.float32)
            while True:
                with lock:
                    b = next(queue, None)
                if b is None or errors:
                    return
                totals[slot] += work(*b, buf)
        except BaseException as exc:  # re-raised in the caller
            errors.append(exc)

    saved = torch.get_num_threads()
    pool = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(n_threads)]
    try:
        for t in pool:
            t.start()
        for t in pool:
            t.join()
    finally:
        torch.set_num_threads(saved)
    if errors:
        raise errors[0]
    return sum(totals)




@dataclass
class RowJob:
    """What a BLAS + numba row kernel needs, prepared once: fp32 arrays per batch·head, the
    output buffers, the rows' positions, and the bounds behind the ALiBi windows.

    The preparation is numpy (single-threaded): on a busy machine every small torch op wakes its
    OpenMP pool, which cost more than the whole kernel in measurements.
    """

    prob: AttnProblem
    #: (BH, Nq, D) queries times their head's factor; (BH, Nk, D) keys; (BH, Nk, Dv) values.
    qs: Tensor
    kf: Tensor
    vf: np.ndarray
    #: (BH, Nq, Dv) output and (BH, Nq) entropy and support, filled by the kernels.
    out: np.ndarray
    ent: np.ndarray
    sup: np.ndarray
    #: (Nq,) rows whose diagnostics are wanted; positions; visible keys.
    want: np.ndarray
    pos: np.ndarray
    nvis: np.ndarray
    #: (H,) ALiBi slope in the kernel's score units, per head.
    slope: np.ndarray
    q_norm: np.ndarray
    k_norm: np.ndarray

    @classmethod
    def prepare(
        cls, q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, query_factor: np.ndarray,
        slope_factor: np.ndarray, rows: Tensor | None,
    ) -> RowJob:
        """``query_factor``, ``slope_factor`` (H,): each head's queries and slope are multiplied by
        them, to put the scores in the kernel's units."""
        if q.device.type != "cpu":
            raise ValueError(f"the fused path runs on CPU tensors, got {q.device}")
        B, H, Nq, Nk, D = prob.B, prob.H, prob.Nq, prob.Nk, prob.D
        BH, Dv = B * H, v.shape[-1]
        factor = np.tile(query_factor.astype(np.float32), B)
        qs = np.ascontiguousarray(as_f32(q).reshape(BH, Nq, D) * factor[:, None, None])
        kn = np.ascontiguousarray(as_f32(k).reshape(BH, Nk, D))
        want = np.zeros(Nq, np.bool_)
        if rows is not None:
            want[rows.cpu().numpy()] = True
        return cls(
            prob=prob, qs=torch.from_numpy(qs), kf=torch.from_numpy(kn),
            vf=np.ascontiguousarray(as_f32(v).reshape(BH, Nk, Dv)),
            out=np.zeros((BH, Nq, Dv), np.float32), ent=np.zeros((BH, Nq), np.float32),
            sup=np.zeros((BH, Nq), np.float32), want=want,
            pos=prob.q_positions.cpu().numpy().astype(np.int64),
            nvis=prob.visible().cpu().numpy().astype(np.int64),
            slope=prob.slopes.numpy() * slope_factor,
            q_norm=np.sqrt((qs.astype(np.float64) ** 2).sum(-1)),
            k_norm=np.sqrt((kn.astype(np.float64) ** 2).sum(-1)).max(-1) if Nk else np.zeros(BH),
        )

    def window_start(self, bh: int, r0: int, r1: int, extra: float) -> int:
        """First key rows r0 … r1 − 1 can need under a causal ALiBi head (0 otherwise).

        Every score satisfies |z_ij + slope·(i − j)| ≤ |q_i|·max|k| (kernel units), so a key more
        than (2|q_i|·max|k| + 1)/slope + ``extra`` positions back scores at least 1 + slope·extra
        below the row's own key; each kernel passes the ``extra`` that makes such keys irrelevant.
        """
        slope = self.slope[bh % self.prob.H]
        if slope <= 0.0 or not self.prob.causal:
            return 0
        bound = (2.0 * float(self.q_norm[bh, r0:r1].max()) * float(self.k_norm[bh]) + 1.0) * (1 + 1e-3)
        first = int(self.pos[r0:r1].min())
        return max(0, min(int(first - bound / slope - extra), first))

    def run(self, work: Callable[..., int], threads: int | None, max_rows: int) -> int:
        """Plan per-head blocks (``chunking.plan_chunks``, one reused buffer per thread) and run."""
        prob = self.prob
        blocks = chunking.plan_chunks(self.pos.tolist(), prob.Nk, prob.causal, 1, max_rows=max_rows,
                                      reused_buffer=True)
        items = [(bh, start, stop - start, keys)
                 for bh in range(prob.B * prob.H) for start, stop, keys in blocks]
        return run_blocks(work, items, max((stop - start) * keys for start, stop, keys in blocks), threads)

    def result(self, v: Tensor, rows: Tensor | None) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """(output in v's dtype, entropy and support of the diagnostic rows)."""
        B, H, Nq = self.prob.B, self.prob.H, self.prob.Nq
        out = torch.from_numpy(self.out).view(B, H, Nq, -1).to(v.dtype)
        if rows is None:
            return out, None, None
        r = rows.cpu()
        return (out, torch.from_numpy(self.ent).view(B, H, Nq)[:, :, r],
                torch.from_numpy(self.sup).view(B, H, Nq)[:, :, r])
