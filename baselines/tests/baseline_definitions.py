"""The two baselines written out from their papers in float64, one query row and one key at a time.

Independent of lengthgen's code on purpose: no cumulative sums, no log-space tricks, no engine. The
forget-gate bias is summed gate by gate; the stick is broken key by key, nearest first.
"""

from __future__ import annotations

import math

import torch


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def scores(q: torch.Tensor, k: torch.Tensor, i: int, slope: float = 0.0) -> list[float]:
    """<q, k_j>/√d − slope·(i − j) for the keys j ≤ i of one head, q the row's query (D,)."""
    dots = (k[: i + 1].double() @ q.double()).tolist()
    return [dots[j] / math.sqrt(q.shape[-1]) - slope * (i - j) for j in range(i + 1)]


def fox_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_f: list[float], i: int,
            slope: float = 0.0) -> torch.Tensor:
    """Forgetting Attention's output for query i of one head: softmax over j ≤ i of
    z_j + Σ_{j<t≤i} log f_t (the gates summed from the query back to each key)."""
    z = scores(q, k, i, slope)
    biased = [0.0] * (i + 1)
    decay = 0.0
    for j in range(i, -1, -1):
        biased[j] = z[j] + decay
        decay += log_f[j]
    top = max(biased)
    e = [math.exp(b - top) for b in biased]
    total = sum(e)
    return torch.tensor([ej / total for ej in e], dtype=torch.float64) @ v[: i + 1].double()


def stick_weights(z: list[float], current: str = "leftover") -> list[float]:
    """Stick-breaking weights of one row whose last key is the query's own token: keys, nearest
    first, break off σ(z) of the stick left; the own token takes what is left (leftover) or breaks
    like the others (key)."""
    i = len(z) - 1
    w = [0.0] * len(z)
    stick = 1.0
    for j in range(i - 1 if current == "leftover" else i, -1, -1):
        beta = sigmoid(z[j])
        w[j] = beta * stick
        stick *= 1.0 - beta
    if current == "leftover":
        w[i] = stick
    return w


def stick_row(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int, current: str = "leftover",
              slope: float = 0.0) -> torch.Tensor:
    w = stick_weights(scores(q, k, i, slope), current)
    return torch.tensor(w, dtype=torch.float64) @ v[: i + 1].double()


def attention(row: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
              **per_head: object) -> torch.Tensor:
    """(B, H, len(positions), Dv) from ``row(q_i, k, v, ..., i)`` per batch, head and query row;
    ``per_head`` values are indexed [b][h] when they are lists (gates) and [h] for slopes."""
    B, H = q.shape[:2]
    out = torch.zeros(B, H, len(positions), v.shape[-1], dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            for r, i in enumerate(positions.tolist()):
                extra = {}
                for key, value in per_head.items():
                    extra[key] = value[b][h] if key == "log_f" else value[h]  # type: ignore[index]
                out[b, h, r] = row(q[b, h, r], k[b, h], v[b, h], i=i, **extra)  # type: ignore[operator]
    return out
