"""A generic test-suite for attention backends: the checks every built-in passes, for plugins too.

Call it from your own tests::

    from lengthgen.testing import check_backend

    def test_my_backend():
        check_backend(MyBackend)                  # a class ...
        check_backend("relu2", margin=0.5)        # ... or a registered name / file.py:Class spec

``check_backend`` runs every check below and raises ``AssertionError`` naming the backend, the
check and the setting that failed. Each check is also a public function, so a backend that
legitimately breaks one property can run the others (or pass ``skip=("reference",)``).

The checks, on tiny shapes (a second or two on a CPU):

* ``weights``    rows of ``normalize`` are finite, non-negative, exactly zero on masked (future)
                 keys and sum to 1 (``normalized=False`` for e.g. sigmoid attention: each ≤ 1);
* ``reference``  the execution path equals ``normalize(scores) @ v`` computed by hand (the scores
                 with the backend's ``cumulative_bias``, when it has one);
* ``paths``      the chunked long-evaluation path equals the materialized one (outputs and
                 attention diagnostics), with one and with several query rows per chunk;
* ``subset``     computing only some query rows equals slicing the full computation;
* ``causal``     through the whole model, changing a token changes nothing before it;
* ``positions``  ``causal`` and ``subset`` hold under every position scheme (NAPE, ALiBi,
                 RoPE, NoPE), on both paths, in training and evaluation mode;
* ``gradients``  gradients are finite, also for extreme (×50) scores;
* ``training``   a few optimizer steps on a fixed batch reduce the loss.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn.functional as F

from lengthgen.attention import ATTENTION
from lengthgen.attention.backend import (
    AttentionBackend,
    AttentionStats,
    BackendOptions,
    LayerSpec,
    score_block,
)
from lengthgen.attention.positions import POSITION_SCHEMES, get_position_scheme
from lengthgen.kernels import chunking
from lengthgen.model import ModelConfig, Transformer

BackendLike = type[AttentionBackend] | str

#: Every check ``check_backend`` runs, in order.
CHECKS: tuple[str, ...] = (
    "weights", "reference", "paths", "subset", "causal", "positions", "gradients", "training",
)

#: Small shapes: enough heads for NAPE's two halves, rows enough for several chunks.
N_HEADS, D_HEAD, BATCH, SEQ, VOCAB = 4, 8, 2, 19, 12


def resolve_backend(backend: BackendLike) -> type[AttentionBackend]:
    """A backend class from a class, a registered name, or a ``file.py:Class`` / ``module:Class``."""
    from lengthgen.attention import validate_backend

    cls = ATTENTION.get(backend) if isinstance(backend, str) else backend
    try:
        validate_backend(cls)
    except TypeError as exc:
        raise AssertionError(f"not a usable backend: {exc}") from None
    if not (inspect.isclass(cls.Options) and issubclass(cls.Options, BackendOptions)):
        raise AssertionError(f"{cls.__name__}.Options must subclass lengthgen.api.BackendOptions")
    return cls


def make_backend(
    backend: BackendLike, pos: str = "nape", options: dict[str, Any] | None = None
) -> AttentionBackend:
    """One backend for a layer of ``N_HEADS`` heads under position scheme ``pos``."""
    cls = resolve_backend(backend)
    scheme = get_position_scheme(pos)
    spec = LayerSpec(
        n_heads=N_HEADS, d_model=N_HEADS * D_HEAD, d_head=D_HEAD,
        scaled_heads=tuple(scheme.scaled_heads(N_HEADS)),
    )
    return cls(spec, cls.Options(**(options or {})))


def make_model(backend: BackendLike, pos: str = "nape", options: dict[str, Any] | None = None,
               seed: int = 0) -> Transformer:
    """A tiny 2-layer model whose every layer carries ``backend``.

    The model is built as usual and its backends swapped afterwards, so classes that are not
    registered under any name (defined in a test, say) work too.
    """
    cls = resolve_backend(backend)
    config = ModelConfig(vocab_size=VOCAB, n_layers=2, d_model=N_HEADS * D_HEAD, n_heads=N_HEADS,
                         d_ff=64, attn="softmax", pos=pos)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Transformer(config, seed=seed)
        opts = cls.Options(**(options or {}))
        for block in model.blocks:
            block.attn.backend = cls(block.attn.backend.spec, opts)
    return model


@contextmanager
def forced_chunking(chunk_entries: int = 1) -> Iterator[None]:
    """Make every call made without gradients take a long-sequence path, in small blocks.

    ``chunk_entries`` is the score budget per block (rows × keys × heads scored together); 1 means
    one query row per block. Built-in backends then run their fused kernels, plugins the generic
    chunked path.
    """
    names = ("MATERIALIZE_LIMIT", "CHUNK_ENTRIES", "MIN_CHUNK_ROWS")
    saved = [getattr(chunking, name) for name in names]
    for name, value in zip(names, (0, chunk_entries, 1), strict=True):
        setattr(chunking, name, value)
    try:
        yield
    finally:
        for name, value in zip(names, saved, strict=True):
            setattr(chunking, name, value)


def _chunk_settings(n_keys: int) -> list[int]:
    """One row per chunk, and a few rows per chunk (so chunk boundaries fall mid-sequence)."""
    return [1, BATCH * N_HEADS * n_keys * 5]


def _inputs(pos: str, seed: int, n: int = SEQ, amplitude: float = 1.0) -> dict[str, torch.Tensor | None]:
    gen = torch.Generator().manual_seed(seed)
    scheme = get_position_scheme(pos)
    q, k, v = (torch.randn(BATCH, N_HEADS, n, D_HEAD, generator=gen) for _ in range(3))
    slopes = torch.tensor(scheme.slopes(N_HEADS)) if scheme.has_bias() else None
    return {
        "q": q * amplitude, "k": k * amplitude, "v": v,
        "x": torch.randn(BATCH, n, N_HEADS * D_HEAD, generator=gen),
        "q_pos": torch.arange(n), "slopes": slopes,
    }


def _close(got: torch.Tensor, want: torch.Tensor, what: str, atol: float = 1e-5) -> None:
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}")
    if not torch.isfinite(got).all():
        raise AssertionError(f"{what}: non-finite values")
    err = float((got.detach().double() - want.detach().double()).abs().max()) if got.numel() else 0.0
    if err > atol:
        raise AssertionError(f"{what}: max abs difference {err:.3g} > {atol:g}")


def _modes(module: torch.nn.Module) -> Iterator[str]:
    """Run the body once in training and once in evaluation mode; restores the mode."""
    was = module.training
    for mode in ("train", "eval"):
        module.train(mode == "train")
        yield mode
    module.train(was)


# -- the checks ---------------------------------------------------------------------------------
def check_weights(backend: BackendLike, normalized: bool = True, **options: Any) -> None:
    """Rows are finite, ≥ 0, zero on masked keys, sum to 1 (or each ≤ 1 when not normalized)."""
    layer = make_backend(backend, "nape", options)
    for amplitude in (1.0, 8.0):  # ordinary and very peaked scores (q·k ~ 64)
        t = _inputs("nape", 1, amplitude=amplitude)
        rows = torch.tensor([0, 1, 7, SEQ - 1])  # row 0 sees one key; a subset, as in evaluation
        scores = score_block(t["q"][:, :, rows], t["k"], rows, t["slopes"], 1.0 / math.sqrt(D_HEAD))
        masked = torch.isinf(scores) & (scores < 0)
        for mode in _modes(layer):
            with torch.no_grad():
                p = layer.normalize(scores)
            where = f"weights ({mode} mode, |q|,|k| ×{amplitude:g})"
            if p.shape != scores.shape:
                raise AssertionError(f"{where}: shape {tuple(p.shape)} != scores {tuple(scores.shape)}")
            if not torch.isfinite(p).all():
                raise AssertionError(f"{where}: non-finite weights")
            if (p < 0).any():
                raise AssertionError(f"{where}: negative weight {float(p.min()):.3g}")
            if (p[masked] != 0).any():
                raise AssertionError(f"{where}: nonzero weight on a future (masked) key")
            sums = p.double().sum(-1)
            if normalized:
                _close(sums, torch.ones_like(sums), f"{where}: row sums", atol=1e-4)
            elif (p > 1 + 1e-6).any():
                raise AssertionError(f"{where}: weight above 1")


def check_reference(backend: BackendLike, **options: Any) -> None:
    """The execution path (``attend``, perhaps overridden) equals ``normalize(scores) @ v``."""
    layer = make_backend(backend, "nape", options)
    t = _inputs("nape", 2)
    for mode in _modes(layer):
        with torch.no_grad():
            got = layer(t["q"], t["k"], t["v"], t["x"], t["q_pos"], t["slopes"])
            scale = layer.query_scale(t["x"], t["q_pos"])
            q = t["q"] if scale is None else t["q"] * scale.unsqueeze(-1)
            increments = layer.cumulative_bias(t["x"])
            cum = None if increments is None else torch.cumsum(increments.double(), dim=-1)
            scores = score_block(q, t["k"], t["q_pos"], t["slopes"], 1.0 / math.sqrt(D_HEAD), cumulative=cum)
            want = torch.matmul(layer.normalize(scores), t["v"])
        _close(got, want, f"reference ({mode} mode): attend vs normalize(scores) @ v", atol=1e-4)


def check_paths(backend: BackendLike, **options: Any) -> None:
    """Chunked evaluation equals the materialized path, outputs and diagnostics alike."""
    layer = make_backend(backend, "nape", options)
    t = _inputs("nape", 3)
    args = (t["q"], t["k"], t["v"], t["x"], t["q_pos"], t["slopes"])
    for mode in _modes(layer):
        full_stats = AttentionStats()
        with torch.no_grad():
            full = layer(*args, full_stats)
        for entries in _chunk_settings(SEQ):
            stats = AttentionStats()
            with forced_chunking(entries), torch.no_grad():
                chunked = layer(*args, stats)
            where = f"paths ({mode} mode, chunk budget {entries})"
            _close(chunked, full, f"{where}: chunked vs materialized output")
            if stats.rows != full_stats.rows:
                raise AssertionError(f"{where}: diagnostics over {stats.rows} rows, not {full_stats.rows}")
            _close(torch.tensor([stats.entropy, stats.support]),
                   torch.tensor([full_stats.entropy, full_stats.support]), f"{where}: diagnostics", 1e-4)


def check_subset(backend: BackendLike, pos: str = "nape", **options: Any) -> None:
    """Computing only some query rows (as the last layer does) equals slicing all rows."""
    layer = make_backend(backend, pos, options)
    t = _inputs(pos, 4)
    rows = torch.tensor([0, 3, 4, 10, SEQ - 1])
    keys = {"x_keys": t["x"]} if layer.has_cumulative_bias() else {}  # a cumulative bias reads every key
    for mode in _modes(layer):
        with torch.no_grad():
            full = layer(t["q"], t["k"], t["v"], t["x"], t["q_pos"], t["slopes"])[:, :, rows]
        for entries in [None, *_chunk_settings(SEQ)]:
            with forced_chunking(entries) if entries else _nothing(), torch.no_grad():
                part = layer(t["q"][:, :, rows], t["k"], t["v"], t["x"][:, rows], rows, t["slopes"], **keys)
            _close(part, full, f"subset ({pos}, {mode} mode, chunk budget {entries or 'none'})")


@contextmanager
def _nothing() -> Iterator[None]:
    yield


@contextmanager
def _one_thread() -> Iterator[None]:
    """Tiny tensors: extra threads only add overhead, and thrash badly on a shared, loaded CPU."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _tokens(seed: int, n: int = SEQ) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, n), generator=torch.Generator().manual_seed(seed))


def check_causal(backend: BackendLike, pos: str = "nape", **options: Any) -> None:
    """Through the full model: changing token t leaves every logit before t unchanged."""
    model = make_model(backend, pos, options)
    ids = _tokens(5)
    for t in (1, SEQ // 2, SEQ - 1):
        changed = ids.clone()
        changed[:, t] = (ids[:, t] + 1) % VOCAB
        for mode in _modes(model):
            for entries in (None, 1):
                context = forced_chunking(entries) if entries else _nothing()
                with context, torch.set_grad_enabled(mode == "train" and entries is None):
                    before, after = model(ids), model(changed)
                where = f"causal ({pos}, {mode} mode, {'chunked' if entries else 'materialized'})"
                _close(after[:, :t], before[:, :t], f"{where}: logits before changed position {t}")
                if torch.equal(after[:, t], before[:, t]):
                    raise AssertionError(f"{where}: changing token {t} changed nothing (vacuous check)")


def check_model_subset(backend: BackendLike, pos: str = "nape", **options: Any) -> None:
    """Through the full model: ``query_positions`` logits equal the same rows of the full logits."""
    model = make_model(backend, pos, options)
    ids, rows = _tokens(6), torch.tensor([2, 9, 10, SEQ - 1])
    for mode in _modes(model):
        for entries in (None, 1):
            with forced_chunking(entries) if entries else _nothing(), torch.no_grad():
                full, part = model(ids)[:, rows], model(ids, query_positions=rows)
            path = "chunked" if entries else "materialized"
            _close(part, full, f"subset through the model ({pos}, {mode} mode, {path})")


def check_positions(
    backend: BackendLike, positions: Iterable[str] = tuple(POSITION_SCHEMES), **options: Any
) -> None:
    """Causality and row subsets hold under every position scheme."""
    for pos in positions:
        check_causal(backend, pos, **options)
        check_subset(backend, pos, **options)
        check_model_subset(backend, pos, **options)


def check_gradients(backend: BackendLike, **options: Any) -> None:
    """Finite gradients for ordinary inputs through the model, and for extreme scores."""
    model = make_model(backend, "nape", options)
    model.train()
    logits = model(_tokens(7))
    F.cross_entropy(logits.transpose(1, 2), _tokens(8)).backward()
    for name, param in model.named_parameters():
        if param.grad is not None and not torch.isfinite(param.grad).all():
            raise AssertionError(f"gradients: non-finite gradient of {name}")
    if not model.blocks[0].attn.qkv.weight.grad.abs().sum() > 0:
        raise AssertionError("gradients: no gradient reaches the query/key/value projections")
    layer = make_backend(backend, "nape", options)
    t = _inputs("nape", 9, amplitude=50.0 ** 0.5)  # scores ~ 50× ordinary
    q, k, v = (t[n].clone().requires_grad_(True) for n in ("q", "k", "v"))  # type: ignore[union-attr]
    out = layer(q, k, v, t["x"], t["q_pos"], t["slopes"])
    out.square().sum().backward()
    for n, tensor in (("q", q), ("k", k), ("v", v)):
        if tensor.grad is None or not torch.isfinite(tensor.grad).all():
            raise AssertionError(f"gradients: non-finite or missing gradient of {n} for extreme scores")


def check_training(backend: BackendLike, steps: int = 12, **options: Any) -> None:
    """A few Adam steps on one fixed batch (memorize next tokens) lower the loss."""
    model = make_model(backend, "nape", options, seed=1)
    model.train()
    ids = _tokens(10, n=12)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(ids[:, :-1]).transpose(1, 2), ids[:, 1:])
        if not torch.isfinite(loss):
            raise AssertionError(f"training: loss became {float(loss)}")
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if not losses[-1] < losses[0] - 0.05:
        raise AssertionError(f"training: loss did not go down ({losses[0]:.3f} → {losses[-1]:.3f})")


def check_backend(
    backend: BackendLike,
    *,
    normalized: bool = True,
    positions: Iterable[str] = tuple(POSITION_SCHEMES),
    skip: Iterable[str] = (),
    **options: Any,
) -> list[str]:
    """Run every check in ``CHECKS`` (except ``skip``) on ``backend`` with ``options``.

    Returns the names of the checks that ran; raises ``AssertionError`` on the first failure,
    prefixed with the backend's name.
    """
    cls = resolve_backend(backend)
    skipped = set(skip)
    unknown = skipped - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; valid checks: {', '.join(CHECKS)}")
    cls.Options(**options)  # bad options fail here, as a validation error, not as a check
    runners: dict[str, Callable[[], None]] = {
        "weights": lambda: check_weights(cls, normalized, **options),
        "reference": lambda: check_reference(cls, **options),
        "paths": lambda: check_paths(cls, **options),
        "subset": lambda: (check_subset(cls, "nape", **options), check_model_subset(cls, "nape", **options)),
        "causal": lambda: check_causal(cls, "nape", **options),
        # NAPE, the default scheme, is already covered by ``subset`` and ``causal``
        "positions": lambda: check_positions(cls, [p for p in positions if p != "nape"], **options),
        "gradients": lambda: check_gradients(cls, **options),
        "training": lambda: check_training(cls, **options),
    }
    ran = []
    for name in CHECKS:
        if name in skipped:
            continue
        try:
            with torch.random.fork_rng(), _one_thread():
                torch.manual_seed(0)
                runners[name]()
        except AssertionError as exc:
            origin = f"{cls.__module__}.{cls.__qualname__}"
            raise AssertionError(f"backend {cls.name!r} ({origin}): {exc}") from None
        ran.append(name)
    return ran


__all__ = [
    "CHECKS",
    "check_backend",
    "check_causal",
    "check_gradients",
    "check_model_subset",
    "check_paths",
    "check_positions",
    "check_reference",
    "check_subset",
    "check_training",
    "check_weights",
    "forced_chunking",
    "make_backend",
    "make_model",
    "resolve_backend",
]
