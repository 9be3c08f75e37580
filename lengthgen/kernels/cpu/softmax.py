"""Exact softmax-family attention on CPU through the CPU flash-attention kernel, ALiBi included.

Why this tool. ``torch.nn.functional.scaled_dot_product_attention`` is the fastest exact softmax
attention this CPU has (tiled, vectorized exp, never an n×n tensor), but it takes no ALiBi slope
and no query-row subset. Its CPU kernel, ``aten._scaled_dot_product_flash_attention_for_cpu``, also
returns each row's log-sum-exp, which lets one row's attention be split over key ranges computed
separately and merged exactly. Measured alternatives (``benchmarks/README.md``):
``torch.nn.attention.flex_attention`` with an ALiBi ``score_mod`` compiles on this CPU but ran at
2× SDPA after 45 s of compilation (and 18 s to build its block mask at 16,384); a BLAS + numba
kernel needs one scalar ``exp`` per score (numba has no vector math library here), about 7 ns
against SDPA's ~1 ns per score.

How:

* heads without a slope, full causal rows: one causal SDPA-kernel call over all their rows (the
  only call that uses every core; the rest runs single-threaded glue and per-block workers);
* every other case, per block of sorted query rows starting at position p (sloped heads within
  4× of each other together): the keys every row of the block sees (``[lo, p]``) go through the
  kernel non-causally; the keys after p that only the later rows see (under 256 of them) are
  scored directly with the exact bias — or, for heads without a slope and consecutive rows,
  through the kernel as a causal square; the parts merge by their log-sum-exps. Softmax ignores
  a per-row constant, so inside a kernel call the bias −m(i − j) becomes +m(j − p) — one extra
  q/k channel (q gets m/scale, k gets j − p ≤ 0); the true row constant −m(i − p) is added back
  to the part's log-sum-exp. The keys a row cares about sit near p, where that channel is small,
  so fp32 rounds it to about 1e-6; where it is large the part's weight is negligible anyway;
* ALiBi heads skip keys further left than ``lo``: for row i, z_ij − max_j z_ij ≤ 2·scale·|q_i|·max|k|
  − m(i − j), so the keys beyond the window carry at most ``WINDOW_EPS`` of the row's weight
  (bounded, not guessed), which leaves the output within 2·WINDOW_EPS·max|v| of exact;
* adaptive temperature: a first pass gives each row's entropy H = LSE − E_p[z], θ = poly(H); the
  second pass is plain softmax of θ·z (q and the slope channel times θ). In float32 the first
  pass is ``cpu/entropy.py`` (BLAS score tiles and one vectorized numba pass: no P·V, and windowed
  ALiBi heads without the kernel's small per-block calls; see ``Passes``); in float64, or
  without numba, it is a kernel pass that attends to [k, j − p] instead of v. Either
  accumulates in fp32, so H carries an error of a few 1e-6 nats, which θ's polynomial
  (slope ≈ 2) and θ·z turn into output errors up to about 2e-5 on peaked rows, against about
  1e-6 for plain softmax; an fp64 first pass cost 3.2× the fp32 one.

A cumulative bias c_i − c_j (Forgetting Attention's gates, ``problem.py``) enters like a slope: one
more channel, c_ref − c_j with c_ref at the block's first row (taken in float64, so small for the
keys near the block), and c_i − c_ref added back to the log-sum-exp; the later keys of a block are
scored directly, each row against its own reference. Where c spans at most ``FOLD_RANGE`` the
heads without a slope keep their one causal call (reference c_0); where it never increases (log
gates) it gets a window like ALiBi's, from the first key within reach of the row's own key.

Diagnostics: the entropy of the diagnostic rows from one more entropy pass over just those rows
(the same first-pass machinery, with their θ), their support by counting, on BLAS score blocks,
the keys whose p = exp(θz − LSE) is a positive float32.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from lengthgen.functional.precision import compute_dtype
from lengthgen.functional.temperature import theta_from_entropy
from lengthgen.kernels import chunking
from lengthgen.kernels.cpu.blocks import run_blocks
from lengthgen.kernels.cpu.entropy import add_cumulative_bias, softmax_lse_entropy
from lengthgen.kernels.cpu.jit import COUNT_ABOVE
from lengthgen.kernels.diagnostics import normalize_entropy as _normalize
from lengthgen.kernels.normalizers import AdaptiveTemperature, Normalizer
from lengthgen.kernels.problem import AttnProblem, score_block

__all__ = ["Passes", "fused_path", "unavailable_reason"]

#: Bound on the weight an ALiBi row may lose to its window (relative to the row's total).
WINDOW_EPS = 2.0**-30
#: Query rows per kernel call: the CPU kernel's largest query split.
FLASH_ROWS = 256
#: A cumulative bias whose values span at most this goes into one causal kernel call over all rows as
#: the channel c_0 − c_j: float32 rounds a channel value of size |c| by |c|·6e-8, so at most 1e-6
#: of a weight. Wider, every block of rows takes its own reference c_first, like ALiBi's j − p.
FOLD_RANGE = 16.0


def _flash_op():  # noqa: ANN202
    return getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def unavailable_reason() -> str:
    """Why the CPU flash kernel cannot be used ('' when it can)."""
    return "" if _flash_op() is not None else f"torch {torch.__version__} has no CPU flash-attention kernel"


@dataclass(frozen=True)
class Passes:
    """How the path computes what the flash kernel does not give; the engine chooses
    (``lengthgen.kernels.engine``).

    ``numba_entropy``: entropy passes (adaptive temperature's first pass, the diagnostics) through
    ``cpu/entropy.py`` (BLAS score tiles, one numba pass) rather than the flash kernel with values
    [k, j − p]; for float32 inputs when that kernel is available (float64 keeps the flash kernel's
    fp64 arithmetic). Measured at 65,536 tokens, 2 heads each: without a slope 7.3 s against the
    flash kernel's 9.3 s (which also computes a 32-wide P·V this pass does not need); with slopes 1
    and 1/2 the flash kernel runs one small call per block of rows, 3.6× slower.
    ``numba_count``: the support count of the diagnostic rows by the numba pass of ``cpu/jit.py``
    rather than the same count in torch.
    """

    numba_entropy: bool
    numba_count: bool


@dataclass
class _Part:
    """One key range of a block of rows: log-sum-exp, and the output or the entropy (in nats) of
    the rows' weights restricted to this range."""

    lse: Tensor
    out: Tensor | None = None
    entropy: Tensor | None = None


def _merge(a: _Part, b: _Part) -> _Part:
    """Two disjoint key ranges of the same rows: p = w_a·p_a + w_b·p_b, w = exp(LSE_part − LSE).

    The entropy merges as H = Σ w·H_part − Σ w·log w, which keeps every term small (subtracting
    two large log-sum-exps of the whole row lost about 1e-5 in fp32).
    """
    lse = torch.logaddexp(a.lse, b.lse)
    wa, wb = torch.exp(a.lse - lse), torch.exp(b.lse - lse)
    out = None if a.out is None or b.out is None else a.out * wa[..., None] + b.out * wb[..., None]
    entropy = None
    if a.entropy is not None and b.entropy is not None:
        entropy = (
            torch.where(wa > 0, wa * a.entropy, 0.0) + torch.where(wb > 0, wb * b.entropy, 0.0)
            - torch.xlogy(wa, wa) - torch.xlogy(wb, wb)
        )
    return _Part(lse, out, entropy)


def _pad_last(t: Tensor, size: int) -> Tensor:
    return t if t.shape[-1] == size else torch.nn.functional.pad(t, (0, size - t.shape[-1]))


@dataclass(frozen=True)
class _Rows:
    """A block of query rows of one head group: q (B, h, R, D), positions (R,), θ (B, h, R)."""

    q: Tensor
    pos: Tensor
    theta: Tensor | None

    def scaled_q(self) -> Tensor:
        return self.q if self.theta is None else self.q * self.theta[..., None]

    def factor(self) -> Tensor | float:
        return 1.0 if self.theta is None else self.theta


def _kernel_part(
    rows: _Rows, k: Tensor, v: Tensor, slopes: Tensor | None, ref: int, first_key: int, scale: float,
    want_entropy: bool, causal_square: bool = False, parallel: bool = False, cum: Tensor | None = None,
) -> _Part:
    """Rows over keys first_key … first_key + Nk − 1 through the CPU kernel.

    ``slopes`` (h,) or None. A slope enters as the channel +θ·slope·(j − ref) (q gets
    θ·slope/scale, k gets j − ref); the log-sum-exp is returned in true units (−θ·slope·(pos − ref)
    added back). ``cum`` (B, h, all keys) float64, or None: the cumulative bias c_pos − c_j enters
    the same way, as the channel θ·(c_ref − c_j) (q gets θ/scale, k gets c_ref − c_j, taken in
    float64 and small near ref) and θ·(c_pos − c_ref) added back. ``want_entropy``: the
    values are [k, j − ref] and the entropy LSE − E_p[θz] is returned instead of an output (the
    entropy pass where ``cpu/entropy.py`` is not chosen), taken in the kernel's units where both
    terms are small. ``causal_square``: rows and keys are the same positions, masked
    causally inside the kernel. ``parallel``: a call big enough for every core (the rest runs
    single-threaded, see ``_intra_op_threads``).
    """
    q = rows.scaled_q()
    n_keys = k.shape[2]
    if slopes is not None:
        rel = torch.arange(first_key - ref, first_key - ref + n_keys, dtype=k.dtype).view(1, 1, -1, 1)
        channel = (rows.theta[..., None] if rows.theta is not None else q.new_ones(())) * (
            slopes.to(q.dtype).view(1, -1, 1, 1) / scale
        )
        q = torch.cat((q, channel.expand(*q.shape[:3], 1)), dim=-1)
        k = torch.cat((k, rel.expand(*k.shape[:3], 1)), dim=-1)
    if cum is not None:
        key_bias = cum[..., ref : ref + 1] - cum[..., first_key : first_key + n_keys]
        unit = rows.theta[..., None] / scale if rows.theta is not None else q.new_full((), 1.0 / scale)
        q = torch.cat((q, unit.to(q.dtype).expand(*q.shape[:3], 1)), dim=-1)
        k = torch.cat((k, key_bias.to(k.dtype)[..., None].expand(*k.shape[:3], 1)), dim=-1)
    values = k if want_entropy else v
    width = max(q.shape[-1], values.shape[-1])
    args = (_pad_last(q, width), _pad_last(k, width), _pad_last(values, width), 0.0, causal_square)
    if parallel:
        with _intra_op_threads(_PARALLEL_THREADS):
            out, lse = _flash_op()(*args, scale=scale)
    else:
        out, lse = _flash_op()(*args, scale=scale)
    shift = 0.0  # the true row constant −θ·slope·(pos − ref)
    if slopes is not None:
        shift = -slopes.to(lse.dtype).view(1, -1, 1) * rows.factor() * (rows.pos - ref).to(lse.dtype)
    if cum is not None:
        shift = shift + rows.factor() * (cum[..., rows.pos] - cum[..., ref : ref + 1]).to(lse.dtype)
    if not want_entropy:
        return _Part(lse + shift, out=out[..., : v.shape[-1]])
    return _Part(lse + shift, entropy=lse - scale * torch.linalg.vecdot(q, out[..., : q.shape[-1]]))


def _direct_part(
    rows: _Rows, k: Tensor, v: Tensor, slopes: Tensor | None, first_key: int, scale: float,
    want_entropy: bool, cum: Tensor | None = None,
) -> _Part:
    """Rows over the short key span first_key … scored directly: exact causal mask and bias."""
    shifted = None if cum is None else cum[..., first_key:]
    z = score_block(rows.q, k, rows.pos - first_key, slopes, scale, causal=True, cumulative=shifted)
    if rows.theta is not None:
        z.mul_(rows.theta[..., None])
    lse = torch.logsumexp(z, dim=-1)
    p = torch.exp(z - lse[..., None]).nan_to_num_(0.0)  # a row with no key here: −inf − −inf
    if want_entropy:
        mean = torch.linalg.vecdot(p, z.nan_to_num(0.0, neginf=0.0))
        return _Part(lse, entropy=torch.where(torch.isfinite(lse), lse - mean, 0.0))
    return _Part(lse, out=torch.matmul(p, v))


def _blocks(pos: list[int], batch: int) -> list[tuple[int, int]]:
    """Consecutive sorted rows whose later keys (after the first row's) span under FLASH_ROWS keys.

    At most FLASH_ROWS rows, and the directly scored part within the chunking budget
    (rows × span × batch ≤ CHUNK_ENTRIES). Bounding the span
    keeps the work outside the kernel below FLASH_ROWS keys per row however sparse the rows are.
    """
    limit = max(1, min(FLASH_ROWS, chunking.CHUNK_ENTRIES))
    blocks = []
    start = 0
    while start < len(pos):
        stop = start + 1
        while stop < len(pos) and stop - start < limit:
            span = pos[stop] - pos[start]
            if span >= FLASH_ROWS or (stop + 1 - start) * span * batch > chunking.CHUNK_ENTRIES:
                break
            stop += 1
        blocks.append((start, stop))
        start = stop
    return blocks


def _window(slope: float, scale: float, q_norm: float, k_norm: float) -> int:
    """Keys beyond this distance carry at most WINDOW_EPS of a row's weight (see module docs)."""
    reach = 2.0 * scale * q_norm * k_norm + math.log(1.0 / WINDOW_EPS) - math.log(-math.expm1(-slope))
    return int(math.ceil(reach / slope)) + 1


def _folds_globally(cum: Tensor | None) -> bool:
    """A cumulative bias whose values all lie within FOLD_RANGE of each other: one channel c_0 − c_j
    for every row stays small enough for float32 (see FOLD_RANGE)."""
    return cum is None or float(cum.amax() - cum.amin()) <= FOLD_RANGE


def _cumulative_start(
    cum: Tensor, first: int, scale: float, q_norm: Tensor, k_norm: list[float], start: int, stop: int
) -> int:
    """The first key that can carry more than WINDOW_EPS of a row's weight under a non-increasing
    cumulative bias: every earlier key j scores at most 2·scale·|q|·|k| + (c_first − c_j) above the
    row's own key, so the at most first + 1 of them with c_first − c_j below −reach weigh at most
    WINDOW_EPS together."""
    reach = [2.0 * scale * float(q_norm[h, start:stop].max()) * k_norm[h] + math.log((first + 1) / WINDOW_EPS)
             for h in range(len(k_norm))]
    bound = -cum[..., first] - torch.tensor(reach, dtype=cum.dtype)  # (B, h): −c_j ≥ this is inside
    return int(torch.searchsorted(-cum, bound[..., None].contiguous()).min())


def _head_group(
    q: Tensor, k: Tensor, v: Tensor, theta: Tensor | None, prob: AttnProblem, slopes: Tensor,
    want_entropy: bool, cum: Tensor | None = None,
) -> _Part:
    """Softmax attention of a group of heads with these ``slopes`` (h,) and cumulative bias ``cum``
    (B, h, Nk) or None; q: (B, h, Nq, D), rows sorted by position."""
    pos, scale = prob.q_positions, prob.scale
    sloped = slopes if bool(slopes.any()) else None
    if not prob.causal:  # every row sees every key; the engine sends no slope or cumulative bias here
        return _kernel_part(_Rows(q, pos, theta), k, v, None, 0, 0, scale, want_entropy, parallel=True)
    if prob.full_rows and sloped is None and _folds_globally(cum):
        return _kernel_part(_Rows(q, pos, theta), k, v, None, 0, 0, scale, want_entropy, causal_square=True,
                            parallel=True, cum=cum)
    B, h, nq, _ = q.shape
    result = _Part(
        q.new_empty((B, h, nq)),
        None if want_entropy else q.new_empty((B, h, nq, v.shape[-1])),
        q.new_empty((B, h, nq)) if want_entropy else None,
    )
    pos_list = pos.tolist()
    slope_list = slopes.tolist()
    # A non-increasing cumulative bias only lowers keys further from their row, so the slopes'
    # window still holds under it and it has a window of its own; any other one could raise them.
    monotone = cum is None or bool((cum[..., 1:] <= cum[..., :-1]).all())
    windowed = sloped is not None and min(slope_list) > 0.0 and monotone
    cum_windowed = cum is not None and monotone
    if windowed or cum_windowed:
        q_norm = torch.linalg.vector_norm(q, dim=-1).amax(dim=0)  # (h, Nq)
        k_norm = torch.linalg.vector_norm(k, dim=-1).amax(dim=(0, 2)).tolist()  # (h,)

    def work(start: int, rows: int, _keys: int, _none: int, _buf: Tensor) -> int:
        """One block of rows, every head of the group: shared keys through the kernel, later
        keys merged in."""
        stop = start + rows
        first, last = pos_list[start], pos_list[stop - 1]
        lo = 0
        if windowed:
            lo = max(0, first - max(
                _window(slope_list[head], scale, float(q_norm[head, start:stop].max()), k_norm[head])
                for head in range(h)
            ))
        if cum_windowed:
            assert cum is not None
            lo = max(lo, _cumulative_start(cum, first, scale, q_norm, k_norm, start, stop))
        theta_rows = None if theta is None else theta[:, :, start:stop]
        block = _Rows(q[:, :, start:stop], pos[start:stop], theta_rows)
        shared = slice(lo, first + 1)  # keys every row of the block sees
        part = _kernel_part(block, k[:, :, shared], v[:, :, shared], sloped, first, lo, scale, want_entropy,
                            cum=cum)
        _store(result, part, start, stop)
        if last > first:
            later_theta = None if theta_rows is None else theta_rows[:, :, 1:]
            later = _Rows(block.q[:, :, 1:], block.pos[1:], later_theta)
            span = slice(first + 1, last + 1)  # keys only the later rows see
            ks, vs = k[:, :, span], v[:, :, span]
            # consecutive rows: a causal square, unless a bias needs each row's own reference (one
            # reference for the square would put channel values of c's whole drop across the
            # block next to the keys that matter, where float32 rounds them by 1e-5)
            if sloped is None and cum is None and last - first == rows - 1:
                tail = _kernel_part(later, ks, vs, None, 0, first + 1, scale, want_entropy, True)
            else:
                tail = _direct_part(later, ks, vs, sloped, first + 1, scale, want_entropy, cum)
            _store(result, _merge(_slice(part, 1), tail), start + 1, stop)
        return 0

    items = [(start, stop - start, 1, 0) for start, stop in _blocks(pos_list, B * h)]
    run_blocks(work, items, 0, _PARALLEL_THREADS)
    return result


def _slice(part: _Part, start: int) -> _Part:
    """The rows start … of a part."""
    return _Part(
        part.lse[:, :, start:],
        None if part.out is None else part.out[:, :, start:],
        None if part.entropy is None else part.entropy[:, :, start:],
    )


def _store(result: _Part, part: _Part, start: int, stop: int) -> None:
    result.lse[:, :, start:stop] = part.lse
    if result.out is not None and part.out is not None:
        result.out[:, :, start:stop] = part.out
    if result.entropy is not None and part.entropy is not None:
        result.entropy[:, :, start:stop] = part.entropy


def _attend(
    q: Tensor, k: Tensor, v: Tensor, theta: Tensor | None, prob: AttnProblem, want_entropy: bool,
    passes: Passes,
) -> _Part:
    """Every head, by head group (``_head_groups``), for sorted query rows."""
    B, H, nq, _ = q.shape
    lse = q.new_empty((B, H, nq))
    out = None if want_entropy else q.new_empty((B, H, nq, v.shape[-1]))
    entropy = q.new_empty((B, H, nq)) if want_entropy else None
    for heads in _head_groups(prob.slopes.tolist()):
        index = torch.tensor(heads)

        def pick(t: Tensor | None, index: Tensor = index, every: bool = len(heads) == H) -> Tensor | None:
            return t if t is None or every else t.index_select(1, index)

        slopes = prob.slopes[index].to(q.dtype)
        group = (pick(q), pick(k), pick(v), pick(theta))
        cum = pick(prob.cumulative)
        if want_entropy and passes.numba_entropy:
            sub = replace(prob, H=len(heads), slopes=prob.slopes[index], cumulative=cum)
            lse_g, entropy_g = softmax_lse_entropy(group[0], group[1], sub, WINDOW_EPS,  # type: ignore[arg-type]
                                                   theta=group[3], threads=_PARALLEL_THREADS)
            part = _Part(lse_g.to(q.dtype), entropy=entropy_g.to(q.dtype))
        else:
            part = _head_group(*group, prob, slopes, want_entropy, cum)  # type: ignore[arg-type]
        lse[:, heads] = part.lse
        if out is not None and part.out is not None:
            out[:, heads] = part.out
        if entropy is not None and part.entropy is not None:
            entropy[:, heads] = part.entropy
    return _Part(lse, out, entropy)


def _head_groups(slopes: list[float]) -> list[list[int]]:
    """Heads without a slope together (one causal call); sloped heads together while their slopes
    are within 4× of each other (one call per block for all of them: the steepest head's window
    grows to the gentlest's, which costs less than a second round of small calls)."""
    flat = [h for h, s in enumerate(slopes) if s == 0.0]
    groups = [flat] if flat else []
    current: list[int] = []
    for h in sorted((h for h, s in enumerate(slopes) if s != 0.0), key=lambda h: -slopes[h]):
        if current and slopes[current[0]] > 4 * slopes[h]:
            groups.append(current)
            current = []
        current.append(h)
    return groups + ([current] if current else [])


def _attend_rows(
    q: Tensor, k: Tensor, v: Tensor, theta: Tensor | None, prob: AttnProblem, want_entropy: bool,
    passes: Passes,
) -> _Part:
    """``_attend`` for query rows in any order (sorted for the blocks, results in the given order)."""
    pos = prob.q_positions
    if bool((pos[1:] >= pos[:-1]).all()):
        return _attend(q, k, v, theta, prob, want_entropy, passes)
    order = torch.argsort(pos, stable=True)
    picked = None if theta is None else theta[:, :, order]
    part = _attend(q[:, :, order], k, v, picked, replace(prob, q_positions=pos[order]), want_entropy, passes)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return _Part(
        part.lse[:, :, inverse],
        None if part.out is None else part.out[:, :, inverse],
        None if part.entropy is None else part.entropy[:, :, inverse],
    )


@torch.no_grad()
def fused_path(
    q: Tensor, k: Tensor, v: Tensor, prob: AttnProblem, normalizer: Normalizer, rows: Tensor | None,
    *, passes: Passes,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The engine's ``fused`` path for ``Softmax`` and ``AdaptiveTemperature`` on CPU."""
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    if q.device.type != "cpu":
        raise ValueError(f"the fused CPU path runs on CPU tensors, got {q.device}")
    if not prob.causal and (prob.has_alibi or prob.cumulative is not None):
        raise ValueError("the fused softmax path takes ALiBi slopes and cumulative biases only with causal "
                         "masking")
    global _PARALLEL_THREADS
    cd = compute_dtype(q.dtype)
    _PARALLEL_THREADS = torch.get_num_threads()
    with _intra_op_threads(1):
        qc, kc, vc = q.to(cd), k.to(cd), v.to(cd)
        theta = None
        if isinstance(normalizer, AdaptiveTemperature):
            first = _attend_rows(qc, kc, kc, None, prob, want_entropy=True, passes=passes)
            assert first.entropy is not None
            theta = theta_from_entropy(first.entropy)
        result = _attend_rows(qc, kc, vc, theta, prob, want_entropy=False, passes=passes)
        assert result.out is not None
        out = result.out.to(v.dtype)
        if rows is None:
            return out, None, None
        entropy, support = _diagnostics(qc, kc, prob, rows, result.lse, theta, passes)
        return out, entropy, support


#: The caller's thread count while the path runs single-threaded glue (``_intra_op_threads``).
_PARALLEL_THREADS = torch.get_num_threads()


@contextmanager
def _intra_op_threads(n: int) -> Iterator[None]:
    """Run the glue single-threaded: only the one big kernel call (``_kernel_part`` with
    ``parallel``) and the worker threads of ``run_blocks`` use the cores. On a busy 2-core machine
    each small multi-threaded torch op waited for a descheduled OpenMP thread (measured: a quarter
    of the path's time at 16,384 tokens)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _diagnostics(
    q: Tensor, k: Tensor, prob: AttnProblem, rows: Tensor, lse: Tensor, theta: Tensor | None, passes: Passes
) -> tuple[Tensor, Tensor]:
    """Entropy and support of the diagnostic rows, without materializing their weights.

    Entropy: H = LSE − E_p[θz] from one more entropy pass over just these rows (as adaptive
    temperature's first pass, ``_attend`` with ``want_entropy``). Support: the keys whose
    p = exp(θz − LSE) is a positive float32, counted on BLAS score blocks (``_count_above``).
    """
    chosen_theta = None if theta is None else theta[:, :, rows]
    sub = replace(prob, Nq=rows.numel(), q_positions=prob.q_positions[rows], full_rows=False)
    again = _attend_rows(q[:, :, rows], k, k, chosen_theta, sub, want_entropy=True, passes=passes)
    assert again.entropy is not None
    entropy = _normalize(again.entropy, sub.visible())
    info = torch.finfo(torch.float32)
    underflow = math.log(info.smallest_normal * info.eps / 2)  # exp(x) > 0 in fp32 iff x > this
    threshold = lse[:, :, rows] + underflow
    if chosen_theta is not None:
        threshold = threshold / chosen_theta
    support = _count_above(q[:, :, rows] * prob.scale, k, sub, threshold, passes.numba_count)
    return entropy, support


def _count_above(qs: Tensor, k: Tensor, prob: AttnProblem, threshold: Tensor, numba_count: bool) -> Tensor:
    """Per row, the visible keys with scaled score + ALiBi bias (+ cumulative bias) above ``threshold``
    (B, H, R), by the numba pass or (``numba_count`` False) the same count in torch."""
    B, H, R, _ = qs.shape
    counts = torch.zeros((B, H, R), dtype=torch.float32)
    pos = prob.q_positions
    pos_list = pos.tolist()
    slopes = prob.slopes.tolist()
    blocks = chunking.plan_chunks(pos_list, prob.Nk, prob.causal, 1, reused_buffer=True)
    cum = prob.cumulative
    kernel = COUNT_ABOVE.get() if numba_count else None
    qf, kf, thr = qs.float(), k.float(), threshold.float()

    def work(bh: int, start: int, rows: int, keys: int, buf: Tensor) -> int:
        b, h = divmod(bh, H)
        scores = buf[: rows * keys].view(rows, keys)
        torch.mm(qf[b, h, start : start + rows], kf[b, h, :keys].t(), out=scores)
        row_pos = pos[start : start + rows]
        if cum is not None:
            add_cumulative_bias(scores, cum[b, h], row_pos, 0)
        if kernel is not None:
            kernel(scores.numpy(), row_pos.numpy(), slopes[h], thr[b, h, start : start + rows].numpy(),
                   counts[b, h, start : start + rows].numpy())
        else:
            j = torch.arange(keys)
            z = scores - slopes[h] * (row_pos[:, None] - j[None, :])
            above = (z > thr[b, h, start : start + rows, None]) & (j[None, :] <= row_pos[:, None])
            counts[b, h, start : start + rows] = above.sum(-1).float()
        return 0

    items = [(bh, start, stop - start, keys) for bh in range(B * H) for start, stop, keys in blocks]
    buffer = max((stop - start) * keys for start, stop, keys in blocks)
    run_blocks(work, items, buffer, _PARALLEL_THREADS)
    return counts

