"""Triton kernels for causal α-entmax attention (imported lazily: this module needs triton).

Notation: z_ij = scale·<q_i, k_j> − slope_h·(i − j), z' = (α − 1)·z,
x_ij = z'_ij − τ_i, k = 1/(α − 1), p_ij = [x_ij]_+^k, u_ij = p_ij^(2−α) ∝ [x_ij]_+^(k−1),
S(τ) = Σ_j [x_j]_+^k, W = Σ_j x_j^(k−1) and V = Σ_j x_j^(k−2) over the support.

All kernels recompute z' tile by tile from q and k, so nothing of size N×N is ever stored except a
one-byte-per-tile map (BLOCK_M×BLOCK_N tiles). Its bit 0 says "may hold support": some score of the
tile lies above a proven lower bound of τ; its bit 1 says "holds support at the final τ".

The forward is two kernels, one per job, and makes three passes over the key tiles in most row blocks:

* ``_entmax_fwd_threshold`` finds τ. Its *bracket pass* finds each row's maximum and, in the same
  pass, a 16-bin histogram of how far below the maximum the scores lie: bins of a width set per row
  from the spread of its two most recent key tiles (visited first), counted in 4-bit fields of one
  uint64 per lane and shifted when the maximum rises. Counting each bin's scores at its near or far
  edge bounds S at the bin edges, which gives a certified bracket two bins wide, and an estimate τ₁
  interpolated in it (typically within 1% of the gap below the maximum). Its *refinement pass*
  evaluates S, W, V at τ₁ and takes one safeguarded Halley step on h(τ) = S(τ)^(1/k) − 1 to τ₂: h is
  convex and decreasing (an ℓ_k norm of a convex map) and linear when all live scores are equal.
* ``_entmax_fwd_output`` makes the output pass at τ₂ and checks it there. Besides Σ p̃·v it
  accumulates Σ x^(k−1)·v and the nearest scores above and below τ₂. When |S − 1| is above the
  tolerance but the Newton correction ε = (S − 1)/(k·W) is certified, that is no score lies between
  τ₂ and τ₂ + ε and the Taylor remainder ½·k·|k − 1|·ε²·V (bounded with the nearest support score)
  is within the tolerance, the output, τ, log Σp̃, the u-weighted mean of V and the entropy are
  corrected to first order in ε instead of making another pass; otherwise the pass is repeated at
  the next Halley iterate (a few rows in a few blocks).

The bracket pass sets bit 0 against the running maximum − 1 (visiting the recent, often strongest,
tiles first makes it tight for local attention), the refinement pass refreshes it against the
bracket's lower end, and the output pass and both backward kernels skip every tile without support.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _scores(q, k, offs_m, offs_n, N, sc, bias_coef,
            CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, PREC: tl.constexpr):
    """z' tile (BLOCK_M, BLOCK_N) in fp32; invisible keys are −inf."""
    z = tl.dot(q, tl.trans(k), input_precision=PREC) * sc
    if HAS_ALIBI:
        z -= bias_coef * (offs_m[:, None] - offs_n[None, :]).to(tl.float32)
    valid = offs_n[None, :] < N
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    return tl.where(valid, z, float("-inf"))


@triton.jit
def _powers(z, tau, km1, POW_MODE: tl.constexpr):
    """(a, xs, pos) with a = x^(k−1) on the support (0 elsewhere), xs = x there (1 elsewhere).

    POW_MODE 1 (α = 1.5, a = x) and 2 (α = 2, a = 1) skip the log2/exp2 pair of the general case.
    """
    x = z - tau[:, None]
    pos = x > 0.0
    xs = tl.where(pos, x, 1.0)
    if POW_MODE == 1:
        a = tl.where(pos, x, 0.0)
    elif POW_MODE == 2:
        a = pos.to(tl.float32)
    else:
        a = tl.where(pos, tl.exp2(km1 * tl.log2(xs)), 0.0)
    return a, xs, pos


@triton.jit
def _program(H):
    """(block index, batch·head, batch, head) of this program (grid: blocks × batch·heads)."""
    bh = tl.program_id(1)
    return tl.program_id(0), bh, bh // H, bh % H


@triton.jit
def _block(pid, BLOCK: tl.constexpr, N, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Block ``pid`` of BLOCK rows among N: (row offsets, channel offsets, rows in range, real
    channels, the (rows, channels) mask of a tile)."""
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    offs_d = tl.arange(0, BLOCK_D)
    ok = offs < N
    d_ok = offs_d < HEAD_DIM
    return offs, offs_d, ok, d_ok, ok[:, None] & d_ok[None, :]


@triton.jit
def _head(ALPHA, SLOPES, h, scale, HAS_ALIBI: tl.constexpr):
    """Head h's (α, α − 1, k − 1, the score factor scale·(α − 1), the bias factor (α − 1)·slope)."""
    alpha = tl.load(ALPHA + h)
    am1 = alpha - 1.0
    km1 = 1.0 / am1 - 1.0  # k − 1 = (2 − α)/(α − 1)
    sc = scale * am1
    bias_coef = 0.0
    if HAS_ALIBI:
        bias_coef = am1 * tl.load(SLOPES + h)
    return alpha, am1, km1, sc, bias_coef


@triton.jit
def _head_base(PTR, S, b, h):
    """Start of head (b, h) of a (B, H, rows, D) tensor whose strides are the tuple ``S``."""
    return PTR + b * S[0] + h * S[1]


@triton.jit
def _tile(base, offs, S, offs_d, mask):
    """Rows ``offs`` of a head's (rows, D) matrix, zero where ``mask`` is False."""
    return tl.load(base + offs[:, None] * S[2] + offs_d[None, :] * S[3], mask=mask, other=0.0)


@triton.jit
def _put_tile(base, offs, S, offs_d, value, mask):
    """Write ``value`` to rows ``offs`` of a head's (rows, D) matrix, in its dtype, where ``mask``."""
    ptrs = base + offs[:, None] * S[2] + offs_d[None, :] * S[3]
    tl.store(ptrs, value.to(ptrs.dtype.element_ty), mask=mask)


@triton.jit
def _saved_rows(TAU, LOGS, DELTA, bh, N, offs_m, row_ok):
    """Per row: τ and log2 Σp̃ (saved by the forward) and c (computed before the backward)."""
    tau = tl.load(TAU + bh * N + offs_m, mask=row_ok, other=float("inf"))
    logs = tl.load(LOGS + bh * N + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + bh * N + offs_m, mask=row_ok, other=0.0)
    return tau, logs, delta


@triton.jit
def _score_grad(q, kt, vt, do, tau, logs, delta, alpha, km1, offs_m, offs_n, N, sc, bias_coef,
                CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, PREC: tl.constexpr, POW_MODE: tl.constexpr):
    """A tile's (a, xs, ∂L/∂z): dz = u (dO·v − c), u = x^(k−1)·S^(α−2) (see ``_powers``)."""
    z = _scores(q, kt, offs_m, offs_n, N, sc, bias_coef, CAUSAL, HAS_ALIBI, PREC)
    a, xs, pos = _powers(z, tau, km1, POW_MODE)
    g = tl.dot(do, tl.trans(vt), input_precision=PREC)
    dz = a * tl.exp2((alpha - 2.0) * logs)[:, None] * (g - delta[:, None])
    return a, xs, dz


#: Slots per row block in the debug pass log: [passes, tiles of pass 0, tiles of pass 1, ...].
PASS_LOG_WIDTH = tl.constexpr(40)


@triton.jit
def _log_pass(PASS_LOG, bh, pid, NB, pass_idx, tiles):
    """Debug record: ``tiles`` key tiles computed in pass ``pass_idx`` of program (bh, pid)."""
    row = PASS_LOG + (bh * NB + pid) * PASS_LOG_WIDTH
    tl.store(row + 1 + pass_idx, tiles)
    tl.store(row, pass_idx + 1)


#: Integer arguments that change with the sequence length. Triton would otherwise compile one binary
#: per combination of "is 1" and "is a multiple of 16" of each (3 per kernel over a run training at
#: lengths 32..64); the kernels mask every tile against them, so those hints buy nothing.
_LENGTHS = ("NQ", "N", "NB_M", "NB_N")


#: Gap histogram of the bracket pass: NBINS bins counted in 4-bit fields of one uint64 per lane; a
#: lane adds at most one to a field per tile, so the fields are emptied into per-row counts every
#: FIELD_MAX tiles.
NBINS = tl.constexpr(16)
FIELD_MAX = tl.constexpr(15)
#: The histogram spans SPAN × the spread of a row's two most recent tiles (at most 1, the widest the
#: gap to τ can be): wide enough to hold τ in all but a few flat rows, narrow enough that flat rows,
#: whose support lies within a fraction of their spread, get bins finer than 1/16.
SPAN = tl.constexpr(1.5)


@triton.jit
def _key_scores(q, k_base, start_n, offs_n0, SK, offs_d, d_ok, pos_m, N, sc, bias_coef,
                CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, PREC: tl.constexpr):
    """z' of the key tile starting at ``start_n`` (which may be negative: those keys are −inf)."""
    offs_n = start_n + offs_n0
    exists = offs_n >= 0
    kt = _tile(k_base, offs_n, SK, offs_d, (exists & (offs_n < N))[:, None] & d_ok[None, :])
    z = _scores(q, kt, pos_m, offs_n, N, sc, bias_coef, CAUSAL, HAS_ALIBI, PREC)
    return tl.where(exists[None, :], z, float("-inf"))


@triton.jit
def _pow_k(x, k, POW_MODE: tl.constexpr):
    """x^k for x ≥ 0 (0 at 0), k = 1/(α − 1): x² for α = 1.5, x for α = 2."""
    if POW_MODE == 1:
        return x * x
    elif POW_MODE == 2:
        return x
    else:
        return tl.where(x > 0.0, tl.exp2(k * tl.log2(tl.maximum(x, 1e-30))), 0.0)


@triton.jit
def _any_above(z, bound, row_ok):
    """Tile-map bit: does any row in range have a score above its ``bound``?"""
    visible = row_ok[:, None] & (z > float("-inf"))
    finite_bound = tl.where(bound > float("-inf"), bound, -3.0e38)
    above = tl.where(visible, tl.where(visible, z, 0.0) - finite_bound[:, None], float("-inf"))
    return (tl.max(tl.max(above, 1), 0) > 0.0).to(tl.uint8)


@triton.jit
def _histogram_add(hist, z, top, inv_w):
    """Count each score into gap bin b = ⌊(top − z)/w⌋ (4 bits at 4b of its lane's uint64);
    scores NBINS bins or more below ``top``, and invisible keys, are not counted."""
    visible = z > float("-inf")
    finite_top = tl.where(top > float("-inf"), top, 0.0)
    gap = tl.where(visible, (finite_top[:, None] - tl.where(visible, z, 0.0)) * inv_w[:, None], NBINS * 1.0)
    b = tl.minimum(tl.maximum(gap, 0.0), NBINS * 1.0).to(tl.int32)
    one = tl.full(b.shape, 1, tl.uint64)
    inc = one << (4 * tl.minimum(b, NBINS - 1)).to(tl.uint64)
    return hist + tl.where(b < NBINS, inc, tl.zeros_like(inc))


@triton.jit
def _unpack_counts(hist, BLOCK_M: tl.constexpr):
    """Per-row counts (BLOCK_M, NBINS) of the lanes' 4-bit fields."""
    bins = tl.arange(0, NBINS)
    counts = tl.zeros([BLOCK_M, NBINS], tl.float32)
    for b in tl.static_range(NBINS):
        col = tl.sum(((hist >> (4 * b)) & 15).to(tl.float32), 1)
        counts += tl.where(bins[None, :] == b, col[:, None], 0.0)
    return counts


@triton.jit
def _shift_counts(counts, shift, BLOCK_M: tl.constexpr):
    """Move each row's bins ``shift`` (≥ 0, per row) bins further from the top; the far end drops."""
    bins = tl.arange(0, NBINS)
    moved = tl.zeros([BLOCK_M, NBINS], tl.float32)
    for b in tl.static_range(NBINS):
        col = tl.sum(tl.where(bins[None, :] == b, counts, 0.0), 1)
        moved += tl.where(bins[None, :] == (b + shift)[:, None], col[:, None], 0.0)
    return moved


@triton.jit
def _merge_counts(counts, top_rise, hist, BLOCK_M: tl.constexpr):
    """Per-row counts relative to the current top: earlier counts moved by the ``top_rise`` bins
    the top has risen since, plus the lanes' fields."""
    return _shift_counts(counts, top_rise.to(tl.int32), BLOCK_M) + _unpack_counts(hist, BLOCK_M)


@triton.jit
def _bracket_from_counts(counts, top, w, m, n_vis, am1, POW_MODE: tl.constexpr):
    """(τ₁, lo, hi) from a row's gap histogram: S ≤ S_upper, each score at its bin's near edge, so
    the last edge where S_upper < 1 is an upper bound of τ; two bins lower S ≥ S_lower(…) ≥ 1 gives
    the lower bound. τ₁ interpolates S^(1/k), each score at its bin's centre, between two edges."""
    k = 1.0 / am1
    bins = tl.arange(0, NBINS).to(tl.float32)
    span_k = _pow_k(w * NBINS, k, POW_MODE)
    edges_below = tl.zeros_like(m)  # edges where S_upper < 1
    mid_below = tl.zeros_like(m)  # edges where S_centre < 1
    s_below = tl.zeros_like(m)
    s_above = tl.full(m.shape, float("inf"), tl.float32)
    for j in tl.static_range(1, NBINS + 1):
        d = j - bins
        s_upper = span_k * tl.sum(counts * _pow_k(tl.maximum(d, 0.0) / NBINS, k, POW_MODE)[None, :], 1)
        s_mid = span_k * tl.sum(counts * _pow_k(tl.maximum(d - 0.5, 0.0) / NBINS, k, POW_MODE)[None, :], 1)
        edges_below += (s_upper < 1.0).to(tl.float32)
        below = s_mid < 1.0
        mid_below += below.to(tl.float32)
        s_below = tl.where(below, s_mid, s_below)
        s_above = tl.where(below, s_above, tl.minimum(s_above, s_mid))
    missed = edges_below >= NBINS  # τ lies below the histogram's window
    hi = top - edges_below * w
    lo = tl.where(missed, m - 1.0, top - (edges_below + 2.0) * w)
    h_below = tl.exp2(am1 * tl.log2(tl.maximum(s_below, 1e-30)))
    h_above = tl.where(s_above < float("inf"), tl.exp2(am1 * tl.log2(tl.maximum(s_above, 1e-30))), 2.0)
    frac = tl.minimum(tl.maximum((1.0 - h_below) / tl.maximum(h_above - h_below, 1e-30), 0.0), 1.0)
    estimate = top - (mid_below + frac) * w
    # Widened against rounding in the binning (an eighth of a bin, a few ulp of the top), then
    # intersected with the bracket every row has: [max − 1, max − n^(1−α)].
    slack = 0.125 * w + 5e-7 * tl.abs(top)
    lo = tl.maximum(lo - slack, m - 1.0)
    hi = tl.minimum(hi + slack, m - tl.exp2(-am1 * tl.log2(n_vis)))
    lo = tl.minimum(lo, hi)
    estimate = tl.where(missed, hi, tl.minimum(tl.maximum(estimate, lo), hi))
    return estimate, lo, hi


@triton.jit
def _halley_step(tau, lo, hi, s_sum, w_sum, v_sum, am1, km1):
    """(next τ, lo, hi) after testing τ: Halley on h(τ) = S^(1/k) − 1 if it lands in the bracket,
    else Newton, else bisection. h' = −S^(α−2)·W, h'' = (k − 1)·S^(α−2)·(V − W²/S)."""
    ge = s_sum >= 1.0
    # A test that contradicts the bracket (rounding in it) widens it on that side.
    width = tl.maximum(hi - lo, 1e-6 * tl.maximum(tl.abs(tau), 1.0))
    hi = tl.where(ge & (tau >= hi), tau + width, hi)
    lo = tl.where((~ge) & (tau <= lo), tau - width, lo)
    lo = tl.where(ge, tau, lo)
    hi = tl.where(ge, hi, tau)
    ls = tl.log2(tl.maximum(s_sum, 1e-30))
    h_val = tl.exp2(am1 * ls) - 1.0
    s_am2 = tl.exp2((am1 - 1.0) * ls)
    w_safe = tl.where(w_sum > 0.0, w_sum, 1.0)
    s_safe = tl.where(s_sum > 0.0, s_sum, 1.0)
    t_newton = tau + h_val / (s_am2 * w_safe)
    den = 2.0 * s_am2 * w_safe * w_safe - km1 * h_val * (v_sum - w_safe * w_safe / s_safe)
    t_halley = tau + 2.0 * h_val * w_safe / den
    # Inclusive: with one key in the support τ = max − 1 is both the root and the bracket's end.
    ok_h = (t_halley >= lo) & (t_halley <= hi)
    ok_n = (t_newton >= lo) & (t_newton <= hi)
    t_new = tl.where(ok_h, t_halley, tl.where(ok_n, t_newton, 0.5 * (lo + hi)))
    t_new = tl.where(w_sum > 0.0, t_new, 0.5 * (lo + hi))
    return t_new, lo, hi


@triton.jit
def _row_setup(Q, POS, ALPHA, SLOPES, SQ, H, NQ, N, scale, tol,
               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_POS: tl.constexpr):
    """What both forward kernels know about their rows: positions, q, the head's constants, the
    keys they see (``n_end`` for the block, ``n_vis`` per row) and the stopping tolerance."""
    pid_m, bh, b, h = _program(H)
    offs_m, offs_d, row_ok, d_ok, qd_mask = _block(pid_m, BLOCK_M, NQ, BLOCK_D, HEAD_DIM)
    if HAS_POS:
        pos_m = tl.load(POS + offs_m, mask=row_ok, other=0).to(tl.int32)
    else:
        pos_m = offs_m
    q = _tile(_head_base(Q, SQ, b, h), offs_m, SQ, offs_d, qd_mask)
    alpha, am1, km1, sc, bias_coef = _head(ALPHA, SLOPES, h, scale, HAS_ALIBI)
    # Σp is summed from x^k with x^k's rounding error growing like k−1 (fp32 log2/exp2): relax to match.
    tol_a = tol * tl.maximum(km1, 1.0)
    if CAUSAL:
        n_end = tl.minimum(tl.max(tl.where(row_ok, pos_m, 0), 0) + 1, N)
        n_vis = tl.minimum(pos_m + 1, N).to(tl.float32)
    else:
        n_end = N
        n_vis = tl.zeros([BLOCK_M], tl.float32) + N
    return (pid_m, bh, b, h, offs_m, offs_d, row_ok, d_ok, qd_mask, pos_m, q, alpha, am1, km1, sc, bias_coef,
            tol_a, n_end, n_vis)


@triton.jit(do_not_specialize=_LENGTHS)
def _entmax_fwd_threshold(
    Q, K, ALPHA, SLOPES, TAU1, LO, HI, MASK, POS, PASS_LOG,
    SQ, SK,
    H, NQ, N, NB_M, NB_N, scale, tol,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, USE_MASK: tl.constexpr, PREC: tl.constexpr,
    POW_MODE: tl.constexpr, HAS_POS: tl.constexpr, LOG_PASSES: tl.constexpr,
):
    """τ₂ and a certified bracket [lo, hi] of τ for NQ query rows (positions POS with HAS_POS, else
    0 … NQ−1) over N keys, in two passes: the bracket pass, then one refinement pass."""
    (pid_m, bh, b, h, offs_m, offs_d, row_ok, d_ok, qd_mask, pos_m, q, alpha, am1, km1, sc, bias_coef,
     tol_a, n_end, n_vis) = _row_setup(Q, POS, ALPHA, SLOPES, SQ, H, NQ, N, scale, tol,
                                       BLOCK_M, BLOCK_D, HEAD_DIM, CAUSAL, HAS_ALIBI, HAS_POS)
    offs_n0 = tl.arange(0, BLOCK_N)
    k_base = _head_base(K, SK, b, h)
    mask_row = MASK + bh * (NB_M * NB_N) + pid_m * NB_N
    n_tiles = tl.cdiv(n_end, BLOCK_N)
    last = n_tiles - 1

    # ---- bracket pass: row max and gap histogram, most recent tiles first ------------------------
    # The two most recent tiles come first: their spread sets each row's bin width.
    z_a = _key_scores(q, k_base, last * BLOCK_N, offs_n0, SK, offs_d, d_ok, pos_m, N, sc, bias_coef,
                      CAUSAL, HAS_ALIBI, PREC)
    z_b = _key_scores(q, k_base, (last - 1) * BLOCK_N, offs_n0, SK, offs_d, d_ok, pos_m, N, sc,
                      bias_coef, CAUSAL, HAS_ALIBI, PREC)
    m_i = tl.maximum(tl.max(z_a, 1), tl.max(z_b, 1))
    lowest = tl.minimum(tl.min(tl.where(z_a > float("-inf"), z_a, float("inf")), 1),
                        tl.min(tl.where(z_b > float("-inf"), z_b, float("inf")), 1))
    seen = m_i > float("-inf")
    spread = tl.where(seen & (lowest < float("inf")), m_i - lowest, 0.0)
    span = tl.minimum(tl.maximum(SPAN * spread, 2.0 * tl.exp2(-am1 * tl.log2(n_vis))), 1.0)
    w = span / NBINS
    inv_w = NBINS / span
    # Bin edges sit on a per-row grid origin + i·w; `top` = origin + idx·w is the lowest edge ≥ max.
    origin = m_i
    idx = tl.zeros([BLOCK_M], tl.float32)
    top = origin
    hist = tl.zeros([BLOCK_M, BLOCK_N], tl.uint64)
    hist = _histogram_add(hist, z_a, top, inv_w)
    hist = _histogram_add(hist, z_b, top, inv_w)
    if USE_MASK:
        tl.store(mask_row + last, _any_above(z_a, m_i - 1.0, row_ok))
        if last > 0:
            tl.store(mask_row + last - 1, _any_above(z_b, m_i - 1.0, row_ok))
    counts = tl.zeros([BLOCK_M, NBINS], tl.float32)
    counts_idx = idx
    unflushed = 2
    for t in range(2, n_tiles):
        start_n = (last - t) * BLOCK_N
        z = _key_scores(q, k_base, start_n, offs_n0, SK, offs_d, d_ok, pos_m, N, sc, bias_coef,
                        CAUSAL, HAS_ALIBI, PREC)
        m_new = tl.maximum(m_i, tl.max(z, 1))
        # A row's first visible key (row subsets only) starts its grid.
        origin = tl.where((m_i == float("-inf")) & (m_new > float("-inf")), m_new, origin)
        idx_new = tl.where(m_new > float("-inf"), tl.maximum(idx, tl.ceil((m_new - origin) * inv_w)), idx)
        shift = (idx_new - idx).to(tl.int32)
        if tl.max(shift, 0) > 0:
            # The top rose by `shift` bins: every count moves that many bins further from it.
            hist = tl.where(shift[:, None] >= NBINS, tl.zeros_like(hist),
                            hist << (4 * tl.minimum(shift, NBINS - 1)).to(tl.uint64)[:, None])
        idx = idx_new
        m_i = m_new
        top = origin + idx * w
        if unflushed == FIELD_MAX:
            counts = _merge_counts(counts, idx - counts_idx, hist, BLOCK_M)
            counts_idx = idx
            hist = tl.zeros_like(hist)
            unflushed = 0
        hist = _histogram_add(hist, z, top, inv_w)
        unflushed += 1
        if USE_MASK:
            # The running max − 1 is a lower bound of τ: tiles with nothing above it are dead.
            tl.store(mask_row + start_n // BLOCK_N, _any_above(z, m_i - 1.0, row_ok))
    counts = _merge_counts(counts, idx - counts_idx, hist, BLOCK_M)
    if LOG_PASSES:
        _log_pass(PASS_LOG, bh, pid_m, NB_M, 0, n_tiles)
    tau, lo, hi = _bracket_from_counts(counts, top, w, m_i, n_vis, am1, POW_MODE)

    # ---- refinement pass: S, W, V at τ₁, one Halley step ---------------------------------------
    s_sum = tl.zeros([BLOCK_M], tl.float32)
    w_sum = tl.zeros([BLOCK_M], tl.float32)
    v_sum = tl.zeros([BLOCK_M], tl.float32)
    n_live = 0
    for start_n in range(0, n_end, BLOCK_N):
        live = 1
        if USE_MASK:
            live = (tl.load(mask_row + start_n // BLOCK_N) != 0).to(tl.int32)
        if live != 0:
            n_live += 1
            z = _key_scores(q, k_base, start_n, offs_n0, SK, offs_d, d_ok, pos_m, N, sc, bias_coef,
                            CAUSAL, HAS_ALIBI, PREC)
            a, xs, pos = _powers(z, tau, km1, POW_MODE)
            s_sum += tl.sum(a * xs, 1)
            w_sum += tl.sum(a, 1)
            if POW_MODE == 0:
                v_sum += tl.sum(a / xs, 1)
            elif POW_MODE == 1:
                v_sum += tl.sum(pos.to(tl.float32), 1)
            if USE_MASK:
                tl.store(mask_row + start_n // BLOCK_N, _any_above(z, lo, row_ok))
    if LOG_PASSES:
        _log_pass(PASS_LOG, bh, pid_m, NB_M, 1, n_live)
    t_new, lo, hi = _halley_step(tau, lo, hi, s_sum, w_sum, v_sum, am1, km1)
    tau = tl.where(tl.abs(s_sum - 1.0) <= tol_a, tau, t_new)
    rows = bh * NQ + offs_m
    tl.store(TAU1 + rows, tau, mask=row_ok)
    tl.store(LO + rows, lo, mask=row_ok)
    tl.store(HI + rows, hi, mask=row_ok)


@triton.jit
def _no_sums(BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """What ``_output_pass`` returns before it has seen a tile."""
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    zero = tl.zeros([BLOCK_M], tl.float32)
    return (acc, acc, acc, zero, zero, zero, tl.full([BLOCK_M], float("inf"), tl.float32),
            tl.full([BLOCK_M], float("-inf"), tl.float32), zero, zero, zero, 0)


@triton.jit
def _output_pass(q, k_base, v_base, tau, n_end, N, SK, SV, offs_n0, offs_d, d_ok, pos_m, row_ok, sc,
                 bias_coef, km1, mask_row,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
                 HAS_ALIBI: tl.constexpr, PREC: tl.constexpr, POW_MODE: tl.constexpr, USE_MASK: tl.constexpr,
                 STORE_VU: tl.constexpr, STATS: tl.constexpr):
    """One pass over the tiles that may hold support, at τ: Σp̃·v, Σx^(k−1)·v, Σx^(k−2)·v (STORE_VU),
    S, W, V, the nearest scores above and at-or-below τ, Σp̃·ln p̃, Σx^(k−1)·ln x and the support
    size (STATS), and the number of tiles computed. Sets the tile map's bit 1 (support at τ)."""
    k = km1 + 1.0
    acc, acc_u, acc_w, s_sum, w_sum, v_sum, x_min, x_out, plogp, alog, count, n_live = _no_sums(
        BLOCK_M, BLOCK_D)
    for start_n in range(0, n_end, BLOCK_N):
        live = 1
        if USE_MASK:
            live = (tl.load(mask_row + start_n // BLOCK_N) & 1).to(tl.int32)
        if live != 0:
            n_live += 1
            offs_n = start_n + offs_n0
            kv_mask = (offs_n[:, None] < N) & d_ok[None, :]
            kt = _tile(k_base, offs_n, SK, offs_d, kv_mask)
            vt = _tile(v_base, offs_n, SV, offs_d, kv_mask)
            z = _scores(q, kt, pos_m, offs_n, N, sc, bias_coef, CAUSAL, HAS_ALIBI, PREC)
            a, xs, pos = _powers(z, tau, km1, POW_MODE)
            x = z - tau[:, None]
            pt = a * xs
            s_sum += tl.sum(pt, 1)
            w_sum += tl.sum(a, 1)
            if POW_MODE == 1:
                x_km2 = pos.to(tl.float32)
            else:
                x_km2 = a / xs
            v_sum += tl.sum(x_km2, 1)
            x_min = tl.minimum(x_min, tl.min(tl.where(pos, x, float("inf")), 1))
            x_out = tl.maximum(x_out, tl.max(tl.where(pos, float("-inf"), x), 1))
            if STATS:
                # ln p̃ = k·ln x on the support (p̃ = x^k); xs = 1 elsewhere, so those terms are 0.
                ln_x = tl.log2(xs) * 0.6931471805599453
                plogp += tl.sum(pt * ln_x, 1) * k
                alog += tl.sum(a * ln_x, 1)
                count += tl.sum((pt > 0.0).to(tl.float32), 1)
            acc += tl.dot(pt.to(vt.dtype), vt, input_precision=PREC)
            acc_u += tl.dot(a.to(vt.dtype), vt, input_precision=PREC)
            if STORE_VU and POW_MODE != 2:
                acc_w += tl.dot(x_km2.to(vt.dtype), vt, input_precision=PREC)
            if USE_MASK:
                # Bit 1: support at this τ; a certified correction does not change the support.
                holds = _any_above(z, tau, row_ok)
                tl.store(mask_row + start_n // BLOCK_N, (holds << 1) | 1)
    return acc, acc_u, acc_w, s_sum, w_sum, v_sum, x_min, x_out, plogp, alog, count, n_live


@triton.jit
def _check_output(tau, lo, hi, s_sum, w_sum, v_sum, x_min, x_out, am1, km1, tol_a, row_ok,
                  STATS: tl.constexpr):
    """After an output pass at τ: (ε, use ε, done, next τ, lo, hi). A row is done when |S − 1| is
    within tolerance, or the Newton correction ε (S − k·ε·W = 1) is certified: no score within ε of
    τ on the side it moves to, and |S(τ + ε) − 1| ≤ ½·k·|k − 1|·ε²·c·V ≤ tol, c bounding x^(k−2)
    over the step by the nearest support score (likewise the entropy's, with STATS)."""
    k = km1 + 1.0
    w_safe = tl.where(w_sum > 0.0, w_sum, 1.0)
    eps = (s_sum - 1.0) / (k * w_safe)
    ratio = tl.abs(eps) / tl.maximum(x_min, 1e-30)
    bend = tl.where(k < 2.0, 1.0 - tl.minimum(ratio, 0.5), 1.0 + ratio)
    second_order = 0.5 * k * eps * eps * tl.exp2((k - 2.0) * tl.log2(bend)) * v_sum
    remainder = tl.abs(km1) * second_order
    # (For α = 2, S is linear while the support holds: no remainder, whatever the step.)
    bounded = ratio < tl.where(km1 == 0.0, float("inf"), 0.5)
    certified = (w_sum > 0.0) & (eps < x_min) & (eps > x_out) & bounded & (remainder <= tol_a)
    if STATS:
        # f(x) = k·x^k·ln x has |f''| ≤ k·x^(k−2)·(k·|k − 1|·|ln x| + 2k − 1), and over the step
        # |ln x| ≤ −ln(x_min/2) + 1.
        log_bound = tl.maximum(-tl.log(0.5 * tl.maximum(x_min, 1e-30)), 0.0) + 1.0
        entropy_remainder = (k * tl.abs(km1) * log_bound + 2.0 * k - 1.0) * second_order
        certified = certified & (ratio < 0.5) & (entropy_remainder <= tol_a)
    within = tl.abs(s_sum - 1.0) <= tol_a
    t_new, lo, hi = _halley_step(tau, lo, hi, s_sum, w_sum, v_sum, am1, km1)
    stalled = tl.abs(t_new - tau) <= 2.4e-7 * tl.maximum(tl.abs(tau), 1.0)
    done = within | certified | stalled | (~row_ok)
    return eps, certified & (~within) & (~stalled), done, t_new, lo, hi


@triton.jit(do_not_specialize=_LENGTHS)
def _entmax_fwd_output(
    Q, K, V, O, ALPHA, SLOPES, TAU1, LO, HI, TAU, LOGS, VU, MASK, POS, ENT, SUP, PASS_LOG,
    SQ, SK, SV, SO,
    H, NQ, N, NB_M, NB_N, scale, tol,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, STORE_VU: tl.constexpr,
    USE_MASK: tl.constexpr, MAX_ITER: tl.constexpr, PREC: tl.constexpr, POW_MODE: tl.constexpr,
    HAS_POS: tl.constexpr, STATS: tl.constexpr, LOG_PASSES: tl.constexpr,
):
    """The output pass at the threshold kernel's τ₂, checked (and corrected to first order) there.

    STATS: also the normalized entropy (ENT) and support size (SUP) of every row, accumulated in
    the output pass from the same tiles.
    """
    (pid_m, bh, b, h, offs_m, offs_d, row_ok, d_ok, qd_mask, pos_m, q, alpha, am1, km1, sc, bias_coef,
     tol_a, n_end, n_vis) = _row_setup(Q, POS, ALPHA, SLOPES, SQ, H, NQ, N, scale, tol,
                                       BLOCK_M, BLOCK_D, HEAD_DIM, CAUSAL, HAS_ALIBI, HAS_POS)
    offs_n0 = tl.arange(0, BLOCK_N)
    k_base = _head_base(K, SK, b, h)
    v_base = _head_base(V, SV, b, h)
    mask_row = MASK + bh * (NB_M * NB_N) + pid_m * NB_N
    rows = bh * NQ + offs_m
    tau = tl.load(TAU1 + rows, mask=row_ok, other=0.0)
    lo = tl.load(LO + rows, mask=row_ok, other=0.0)
    hi = tl.load(HI + rows, mask=row_ok, other=0.0)

    # ---- the output pass at τ₂, repeated (at the next Halley iterate) only where a row is neither
    # within tolerance nor certified for the first-order correction ------------------------------
    # (Names the loop sets are given values before it, so that the last pass's are visible after.)
    acc, acc_u, acc_w, s_sum, w_sum, v_sum, x_min, x_out, plogp, alog, count, n_live = _no_sums(
        BLOCK_M, BLOCK_D)
    eps = s_sum
    use_eps = row_ok & (~row_ok)
    done = use_eps
    t_new = tau
    n_pass = 0
    busy = 1
    while busy != 0:
        tau = tl.where(done, tau, t_new)  # only rows another pass will test move
        acc, acc_u, acc_w, s_sum, w_sum, v_sum, x_min, x_out, plogp, alog, count, n_live = _output_pass(
            q, k_base, v_base, tau, n_end, N, SK, SV, offs_n0, offs_d, d_ok, pos_m, row_ok, sc, bias_coef,
            km1, mask_row, BLOCK_M, BLOCK_D, BLOCK_N, CAUSAL, HAS_ALIBI, PREC, POW_MODE, USE_MASK, STORE_VU,
            STATS)
        if LOG_PASSES:
            _log_pass(PASS_LOG, bh, pid_m, NB_M, 2 + n_pass, n_live)
        eps, use_eps, done, t_new, lo, hi = _check_output(tau, lo, hi, s_sum, w_sum, v_sum, x_min, x_out, am1,
                                                          km1, tol_a, row_ok, STATS)
        n_pass += 1
        busy = ((tl.min(done.to(tl.int32), 0) == 0) & (n_pass < MAX_ITER)).to(tl.int32)
    eps = tl.where(use_eps, eps, 0.0)
    k = km1 + 1.0

    # ---- results at τ + ε, first order in ε --------------------------------------------------
    s_new = s_sum - k * eps * w_sum
    s_safe = tl.where(s_new > 0.0, s_new, 1.0)
    o = (acc - (k * eps)[:, None] * acc_u) / s_safe[:, None]
    _put_tile(_head_base(O, SO, b, h), offs_m, SO, offs_d, o, qd_mask)
    tl.store(TAU + rows, tau + eps, mask=row_ok)
    tl.store(LOGS + rows, tl.log2(s_safe), mask=row_ok)
    if STATS:
        # H(p) = ln S − Σ p̃ ln p̃ / S for p = p̃ / S; d/dε Σ p̃ ln p̃ = −k·Σ x^(k−1)·(k·ln x + 1).
        plogp = plogp - eps * k * (k * alog + w_sum)
        entropy = tl.log(s_safe) - plogp / s_safe
        log_n = tl.log(n_vis)
        entropy = tl.where(n_vis > 1.0, entropy / tl.where(n_vis > 1.0, log_n, 1.0), 0.0)
        tl.store(ENT + rows, entropy, mask=row_ok)
        tl.store(SUP + rows, count, mask=row_ok)
    if STORE_VU:
        # Σ_j u_ij v_j / Σ_j u_ij: the normalization of u cancels, so a = x^(k−1) suffices.
        w_new = w_sum - km1 * eps * v_sum
        w_new = tl.where(w_new > 0.0, w_new, 1.0)
        vu = (acc_u - (km1 * eps)[:, None] * acc_w) / w_new[:, None]
        tl.store(VU + bh * NQ * BLOCK_D + offs_m[:, None] * BLOCK_D + offs_d[None, :], vu,
                 mask=row_ok[:, None])


@triton.jit(do_not_specialize=_LENGTHS[1:])
def _entmax_bwd_dq(
    Q, K, V, DO, DQ, ALPHA, SLOPES, TAU, LOGS, DELTA, MASK, PASS_LOG,
    SQ, SK, SV, SDO, SDQ,
    H, N, NB_M, NB_N, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, USE_MASK: tl.constexpr, PREC: tl.constexpr,
    POW_MODE: tl.constexpr, LOG_PASSES: tl.constexpr,
):
    """dq_i = scale · Σ_j dz_ij k_j with dz_ij = u_ij (dO_i·v_j − c_i), one program per query block."""
    pid_m, bh, b, h = _program(H)

    offs_m, offs_d, row_ok, d_ok, qd_mask = _block(pid_m, BLOCK_M, N, BLOCK_D, HEAD_DIM)
    offs_n0 = tl.arange(0, BLOCK_N)

    q = _tile(_head_base(Q, SQ, b, h), offs_m, SQ, offs_d, qd_mask)
    do = _tile(_head_base(DO, SDO, b, h), offs_m, SDO, offs_d, qd_mask)
    tau, logs, delta = _saved_rows(TAU, LOGS, DELTA, bh, N, offs_m, row_ok)
    k_base = _head_base(K, SK, b, h)
    v_base = _head_base(V, SV, b, h)
    alpha, am1, km1, sc, bias_coef = _head(ALPHA, SLOPES, h, scale, HAS_ALIBI)

    if CAUSAL:
        n_end = tl.minimum((pid_m + 1) * BLOCK_M, N)
    else:
        n_end = N
    mask_row = MASK + bh * (NB_M * NB_N) + pid_m * NB_N

    dq = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n_tiles = 0
    for start_n in range(0, n_end, BLOCK_N):
        live = 1
        if USE_MASK:
            live = ((tl.load(mask_row + start_n // BLOCK_N) >> 1) & 1).to(tl.int32)
        if live != 0:
            n_tiles += 1
            offs_n = start_n + offs_n0
            kv_mask = (offs_n[:, None] < N) & d_ok[None, :]
            kt = _tile(k_base, offs_n, SK, offs_d, kv_mask)
            vt = _tile(v_base, offs_n, SV, offs_d, kv_mask)
            a, xs, dz = _score_grad(q, kt, vt, do, tau, logs, delta, alpha, km1, offs_m, offs_n, N, sc,
                                    bias_coef, CAUSAL, HAS_ALIBI, PREC, POW_MODE)
            dq += tl.dot(dz.to(kt.dtype), kt, input_precision=PREC)
    if LOG_PASSES:
        _log_pass(PASS_LOG, bh, pid_m, NB_M, 0, n_tiles)
    dq = dq * scale
    _put_tile(_head_base(DQ, SDQ, b, h), offs_m, SDQ, offs_d, dq, qd_mask)


@triton.jit(do_not_specialize=_LENGTHS[1:])
def _entmax_bwd_dkdv(
    Q, K, V, DO, DK, DV, ALPHA, SLOPES, TAU, LOGS, DELTA, MASK, PASS_LOG,
    SQ, SK, SV, SDO, SDK, SDV,
    H, N, NB_M, NB_N, scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, USE_MASK: tl.constexpr, PREC: tl.constexpr,
    POW_MODE: tl.constexpr, LOG_PASSES: tl.constexpr,
):
    """dv_j = Σ_i p_ij dO_i and dk_j = scale · Σ_i dz_ij q_i, one program per key block."""
    pid_n, bh, b, h = _program(H)

    offs_n, offs_d, col_ok, d_ok, kv_mask = _block(pid_n, BLOCK_N, N, BLOCK_D, HEAD_DIM)
    offs_m0 = tl.arange(0, BLOCK_M)

    kt = _tile(_head_base(K, SK, b, h), offs_n, SK, offs_d, kv_mask)
    vt = _tile(_head_base(V, SV, b, h), offs_n, SV, offs_d, kv_mask)
    q_base = _head_base(Q, SQ, b, h)
    do_base = _head_base(DO, SDO, b, h)
    alpha, am1, km1, sc, bias_coef = _head(ALPHA, SLOPES, h, scale, HAS_ALIBI)

    if CAUSAL:
        m_start = ((pid_n * BLOCK_N) // BLOCK_M) * BLOCK_M
    else:
        m_start = 0
    mask_col = MASK + bh * (NB_M * NB_N) + pid_n

    dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    n_tiles = 0
    for start_m in range(m_start, N, BLOCK_M):
        live = 1
        if USE_MASK:
            live = ((tl.load(mask_col + (start_m // BLOCK_M) * NB_N) >> 1) & 1).to(tl.int32)
        if live != 0:
            n_tiles += 1
            offs_m = start_m + offs_m0
            row_ok = offs_m < N
            qd_mask = row_ok[:, None] & d_ok[None, :]
            q = _tile(q_base, offs_m, SQ, offs_d, qd_mask)
            do = _tile(do_base, offs_m, SDO, offs_d, qd_mask)
            tau, logs, delta = _saved_rows(TAU, LOGS, DELTA, bh, N, offs_m, row_ok)
            a, xs, dz = _score_grad(q, kt, vt, do, tau, logs, delta, alpha, km1, offs_m, offs_n, N, sc,
                                    bias_coef, CAUSAL, HAS_ALIBI, PREC, POW_MODE)
            p = a * xs * tl.exp2(-logs)[:, None]
            dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
            dk += tl.dot(tl.trans(dz.to(q.dtype)), q, input_precision=PREC)
    if LOG_PASSES:
        _log_pass(PASS_LOG, bh, pid_n, NB_N, 0, n_tiles)
    dk = dk * scale
    _put_tile(_head_base(DK, SDK, b, h), offs_n, SDK, offs_d, dk, kv_mask)
    _put_tile(_head_base(DV, SDV, b, h), offs_n, SDV, offs_d, dv, kv_mask)


def _tuning_configs() -> list[triton.Config]:
    """One config under the interpreter (it cannot time anything); a few warp/stage choices on GPU.

    Block sizes are not tuned: the backward reuses the forward's tile-liveness map, so all three
    kernels must agree on BLOCK_M/BLOCK_N, which the Python wrapper picks.
    """
    if triton.knobs.runtime.interpret:
        return [triton.Config({}, num_warps=1, num_stages=1)]
    return [triton.Config({}, num_warps=w, num_stages=s) for w, s in ((4, 2), (4, 3), (8, 2))]


_KEY = ["HEAD_DIM", "BLOCK_D", "BLOCK_M", "BLOCK_N", "CAUSAL", "HAS_ALIBI", "USE_MASK", "PREC", "LOG_PASSES"]
# Re-running a kernel during tuning is harmless: the output kernel reads only what the threshold
# kernel wrote (τ₂, the bracket, bit 0 of the map) and writes elsewhere, and rewrites the map's bits
# to the same values; the others write their outputs without reading them.
entmax_fwd_threshold = triton.autotune(configs=_tuning_configs(), key=_KEY + ["POW_MODE", "HAS_POS"])(
    _entmax_fwd_threshold)
_OUT_KEY = _KEY + ["POW_MODE", "STORE_VU", "HAS_POS", "STATS"]
entmax_fwd_output = triton.autotune(configs=_tuning_configs(), key=_OUT_KEY)(_entmax_fwd_output)
entmax_bwd_dq = triton.autotune(configs=_tuning_configs(), key=_KEY)(_entmax_bwd_dq)
entmax_bwd_dkdv = triton.autotune(configs=_tuning_configs(), key=_KEY)(_entmax_bwd_dkdv)
