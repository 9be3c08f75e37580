"""What each attention head does at one length, and whether the model still needs it there.

Why. Two backends can reach the same in-distribution score with different circuits, and only some
circuits survive a longer input: on copy, a head that finds the source symbol by its content keeps
working at 2x, one that finds it from position features averaged over the whole prefix does not.
Exact match cannot tell them apart; this report can. For every head, over the predictions the
evaluation scores (the same test set, ``harness/evaluate.test_batches``), it measures

* how concentrated the head's weights are: the number of keys that hold 90% of a row's weight, and
  the largest weight;
* where the head looks: the most common distance back from the query to its most-weighted key,
  and the share of rows that look exactly there; and how far back its weight reaches, the distance
  within which half of a row's weight lies (a head that forgets the far past, as a forget gate or a
  stick-breaking row can, keeps it short at any length);
* for rows that need not sum to one (stick-breaking's), the weight a row leaves to no key;
* for a backend with a cumulative bias (FoX's forget gates), its mean increment per token: the
  log-gate by which a key's score falls for every token between it and the query (0: no forgetting);
* what the model loses without it: token accuracy with that head's output set to zero
  (a knock-out, one forward pass per head);
* for tasks that name the roles of positions (``Task.key_role``, e.g. MQMTAR's "matching pair" and
  "pair sharing key token 2"), what its most-weighted key is, counted separately over the answer
  tokens the model gets right and wrong: whether a wrong answer comes from a head that found the
  right key but spread its weight (dispersion) or from one that picked a near miss.

The weights are recomputed from the q, k the backend receives (its query scale applied) through
the backend's own normalizer, so they are exactly the ones the model used (tested against the
head's output).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from lengthgen.attention.backend import AttentionBackend
from lengthgen.harness.batches import ModelBatch, score
from lengthgen.harness.evaluate import TEST_SEED, test_batches
from lengthgen.harness.recorded.saved import open_trained
from lengthgen.kernels.problem import prepare, score_block
from lengthgen.model import Transformer
from lengthgen.registry import reading_data
from lengthgen.tasks.base import Task

#: The share of a row's weight the concentration measure counts keys up to.
MASS = 0.9
#: Attention weights held at once (batch x heads x scored rows x keys, fp32): bounds the batch.
WEIGHT_BUDGET = 2**25


def keys_holding(p: Tensor, mass: float = MASS) -> Tensor:
    """For rows of weights ``p`` (…, Nk), the fewest keys whose weights add up to ``mass`` of the
    row's weight (its sum: one for a normalized row, less for a stick-breaking row)."""
    ordered = p.sort(dim=-1, descending=True).values
    total = ordered.sum(-1, keepdim=True)
    return ((ordered.cumsum(-1) < mass * total - 1e-6).sum(-1) + 1).clamp(max=p.shape[-1])


def half_weight_distance(p: Tensor, q_pos: Tensor) -> Tensor:
    """For rows of weights ``p`` (…, R, Nk) of queries at positions ``q_pos`` (R,), the smallest
    distance d such that the keys q − d..q hold at least half of the row's weight.

    With C_j the weight on keys 0..j, the keys within d hold total − C_{q−d−1}; so d is q minus the
    number of keys j whose C_j is at most half the total (C never decreases). A row with no weight
    counts 0."""
    before = p.cumsum(-1)
    half = before[..., -1:] / 2
    return (q_pos - (before <= half).sum(-1)).clamp(min=0)


@dataclass
class HeadTally:
    """Running sums over the scored rows one head has seen."""

    rows: int = 0
    keys: float = 0.0
    top_weight: float = 0.0
    half_distance: float = 0.0
    unclaimed: float = 0.0
    bias_sum: float = 0.0  # increments of a cumulative bias, over every position it was computed at
    bias_positions: int = 0
    distances: Counter[int] = field(default_factory=Counter)

    def add(self, p: Tensor, q_pos: Tensor, scored: Tensor) -> None:
        """``p`` (B, R, Nk) weights of rows at positions ``q_pos`` (R,); ``scored`` (B, R) bool."""
        top, where = p.max(dim=-1)
        self.rows += int(scored.sum())
        self.keys += float(keys_holding(p)[scored].sum())
        self.top_weight += float(top[scored].sum())
        self.half_distance += float(half_weight_distance(p, q_pos)[scored].sum(dtype=torch.float64))
        self.unclaimed += float((1 - p.sum(-1, dtype=torch.float64))[scored].clamp(min=0).sum())
        self.distances.update((q_pos[None, :] - where)[scored].tolist())


@dataclass(frozen=True)
class HeadProfile:
    layer: int
    head: int
    position: str  # what position information the head gets: "ALiBi 1/2", "RoPE", "NoPE"
    keys_for_mass: float  # mean number of keys holding MASS of a row's weight
    top_weight: float  # mean largest weight
    distance: int  # most common distance back to the most-weighted key
    distance_share: float  # share of rows whose most-weighted key is at that distance
    half_weight_distance: float  # mean distance within which half of a row's weight lies
    unclaimed: float  # mean weight a row gives no key (0 for rows that sum to one)
    bias_per_token: float | None  # mean increment of the backend's cumulative bias (None: it has none)
    accuracy_without: float | None  # token accuracy with this head's output zeroed (None: not measured)
    #: (answer token right?, role of the most-weighted key) -> rows; empty if the task names no roles
    roles: dict[tuple[bool, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class HeadsReport:
    run_id: str
    length: int
    factor: int
    n_samples: int
    accuracy: float  # token accuracy of the intact model on the same predictions
    heads: tuple[HeadProfile, ...]


def _backends(model: Transformer) -> list[AttentionBackend]:
    return [block.attn.backend for block in model.blocks]


@contextmanager
def _hooked(model: Transformer, hook: Any) -> Iterator[None]:
    """``hook(backend, args, kwargs, output)`` on every layer's backend: the keyword arguments carry
    ``x_keys``, the layer input at every key a cumulative bias (FoX's gates) is computed from."""
    handles = [backend.register_forward_hook(hook, with_kwargs=True) for backend in _backends(model)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def bias_increments(backend: AttentionBackend, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> Tensor | None:
    """The increments (B, H, Nk) of the backend's cumulative bias in this forward call, or None."""
    x = args[3]
    x_keys = kwargs.get("x_keys", args[7] if len(args) > 7 else None)
    return backend.cumulative_bias(x if x_keys is None else x_keys)


def head_weights(backend: AttentionBackend, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                 rows: Tensor, increments: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The weights (B, H, R, Nk) a backend gave the query rows at positions ``rows``, recomputed
    from the arguments of its forward call (``AttentionBackend.forward``'s, positional and keyword),
    and those rows' positions (R,). ``increments``: the call's :func:`bias_increments`, when the
    caller has them already (computed here otherwise)."""
    q, k, v, x, q_pos, slopes = args[:6]
    if increments is None:
        increments = bias_increments(backend, args, kwargs)
    keep = torch.isin(q_pos, rows)
    q, x, q_pos = q[:, :, keep], x[:, keep], q_pos[keep]
    scale = backend.query_scale(x, q_pos)
    if scale is not None:
        q = q * scale.unsqueeze(-1).to(q.dtype)
    problem = prepare(q, k, v, True, slopes, None, q_pos, bias_increments=increments)
    scores = score_block(q.float(), k.float(), q_pos, problem.slopes_or_none(), problem.scale, True,
                         problem.cumulative)
    return backend.normalizer().probs(scores), q_pos


def _position_labels(model: Transformer) -> list[str]:
    attn = model.blocks[0].attn
    if attn.scheme.rope:
        return ["RoPE"] * attn.n_heads
    slopes = attn.slopes.tolist() if attn.slopes is not None else [0.0] * attn.n_heads
    return [f"ALiBi {_slope(s)}" if s else "NoPE" for s in slopes]


def _slope(s: float) -> str:
    inverse = 1.0 / s
    return f"1/{round(inverse)}" if abs(inverse - round(inverse)) < 1e-6 and inverse > 1 else f"{s:.3g}"


@torch.no_grad()
def profile_heads(model: Transformer, task: Task, length: int, n_samples: int, batch_tokens: int,
                  device: torch.device, knock_out: bool = True) -> tuple[float, list[HeadProfile]]:
    """Token accuracy and one profile per (layer, head) on ``n_samples`` test samples of ``length``;
    ``knock_out``: also the accuracy without each head (a forward pass per head and batch)."""
    model.eval()
    backends = _backends(model)
    n_heads = model.blocks[0].attn.n_heads
    tallies = [[HeadTally() for _ in range(n_heads)] for _ in backends]
    hits = [[0] * n_heads for _ in backends]
    right = scored = 0
    layer_of = {id(backend): i for i, backend in enumerate(backends)}
    roles: list[list[Counter[tuple[bool, str]]]] = [[Counter() for _ in range(n_heads)] for _ in backends]
    for batch in test_batches(task, length, n_samples, batch_tokens, device):
        tops: dict[int, tuple[Tensor, Tensor]] = {}
        with _hooked(model, _measuring(tallies, layer_of, batch, tops)):
            logits = model(batch.input_ids, batch.query_positions, None)
        intact = score(logits, batch)
        right, scored = right + intact.tokens_right, scored + intact.tokens_scored
        _count_roles(task, batch, logits.argmax(-1) == batch.targets, tops, roles)
        for layer in range(len(backends) if knock_out else 0):
            for h in range(n_heads):
                with _hooked(model, _knock_out(layer_of, layer, h)):
                    hits[layer][h] += score(model(batch.input_ids, batch.query_positions, None),
                                            batch).tokens_right
    labels = _position_labels(model)
    profiles = []
    for layer, row in enumerate(tallies):
        for h, tally in enumerate(row):
            distance, count = tally.distances.most_common(1)[0]
            profiles.append(HeadProfile(
                layer, h, labels[h], tally.keys / tally.rows, tally.top_weight / tally.rows, int(distance),
                count / tally.rows, tally.half_distance / tally.rows, tally.unclaimed / tally.rows,
                tally.bias_sum / tally.bias_positions if tally.bias_positions else None,
                hits[layer][h] / scored if knock_out else None, dict(roles[layer][h])))
    return right / scored, profiles


def _measuring(tallies: list[list[HeadTally]], layer_of: dict[int, int], batch: ModelBatch,
               tops: dict[int, tuple[Tensor, Tensor]]) -> Any:
    """A forward hook that adds each head's weights on ``batch``'s scored rows to its tally and
    keeps, per layer, the most-weighted key of every head and row with the rows' positions."""

    def hook(module: AttentionBackend, args: tuple[Any, ...], kwargs: dict[str, Any], output: Tensor) -> None:
        increments = bias_increments(module, args, kwargs)
        p, q_pos = head_weights(module, args, kwargs, batch.query_positions, increments)
        keep = torch.isin(batch.query_positions, q_pos)
        for h, tally in enumerate(tallies[layer_of[id(module)]]):
            tally.add(p[:, h], q_pos, batch.mask[:, keep])
            if increments is not None:
                tally.bias_sum += float(increments[:, h].sum(dtype=torch.float64))
                tally.bias_positions += increments[:, h].numel()
        tops[layer_of[id(module)]] = (p.argmax(dim=-1), q_pos)

    return hook


def _count_roles(task: Task, batch: ModelBatch, right: Tensor, tops: dict[int, tuple[Tensor, Tensor]],
                 roles: list[list[Counter[tuple[bool, str]]]]) -> None:
    """Adds the role of each head's most-weighted key on every scored row, by whether the model's
    answer token there is right (``right``: (B, Nq) over ``batch.query_positions``)."""
    ids = batch.input_ids.cpu().numpy()
    rows = batch.query_positions.tolist()
    for layer, (top, q_pos) in tops.items():
        for r, row in enumerate(q_pos.tolist()):
            column = rows.index(row)
            for b in range(ids.shape[0]):
                if not bool(batch.mask[b, column]):
                    continue
                for h in range(top.shape[1]):
                    role = task.key_role(ids[b], row, int(top[b, h, r]))
                    if role is None:
                        return
                    roles[layer][h][(bool(right[b, column]), role)] += 1


def _knock_out(layer_of: dict[int, int], layer: int, head: int) -> Any:
    """A forward hook that zeroes one head's output in one layer."""

    def hook(module: AttentionBackend, args: tuple[Any, ...], kwargs: dict[str, Any],
             output: Tensor) -> Tensor | None:
        if layer_of[id(module)] != layer:
            return None
        silenced = output.clone()
        silenced[:, head] = 0
        return silenced

    return hook


def _batch_tokens(task: Task, length: int, model: Transformer) -> int:
    """Tokens per batch that keep one layer's weights of the scored rows within WEIGHT_BUDGET."""
    sample = task.sample(1, length, seed=TEST_SEED, split="eval")
    tokens, rows = sample.input_ids.shape[1], int(sample.loss_mask.any(axis=0).sum())
    per_sample = model.blocks[0].attn.n_heads * max(1, rows) * tokens
    return max(1, WEIGHT_BUDGET // per_sample) * tokens


@reading_data()  # names from the folder's config: data, as in open_trained
def profile_run(run_dir: Path, factor: int, n_samples: int, device: str | torch.device = "auto",
                task_params: Mapping[str, Any] | None = None, knock_out: bool = True,
                checkpoint: int | None = None) -> HeadsReport:
    """Load the trained run in ``run_dir`` (its selected weights, or those kept after ``checkpoint``
    steps) and profile its heads at L·``factor``."""
    trained = open_trained(run_dir, factor, n_samples, device, task_params, checkpoint)
    batch_tokens = _batch_tokens(trained.task, trained.length, trained.model)
    accuracy, heads = profile_heads(trained.model, trained.task, trained.length, n_samples, batch_tokens,
                                    trained.device, knock_out)
    return HeadsReport(trained.run.run_id, trained.length, factor, n_samples, accuracy, tuple(heads))
