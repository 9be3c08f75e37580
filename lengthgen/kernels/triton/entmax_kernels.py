"""Triton kernels for causal α-entmax attention (imported lazily: this module needs triton).

Notation: z_ij = scale·<q_i, k_j> − slope_h·(i − j), z' = (α − 1)·z,
x_ij = z'_ij − τ_i, k = 1/(α − 1), p_ij = [x_ij]_+^k, u_ij = p_ij^(2−α) ∝ [x_ij]_+^(k−1).

All kernels recompute z' tile by tile from q and k, so nothing of size N×N is ever stored except a
tiny uint8 "tile is live" map (one byte per BLOCK_M×BLOCK_N tile) used to skip tiles outside the
support. τ is found per row by Halley's method (Newton as a fallback) on h(τ) = S(τ)^(1/k) − 1,
S(τ) = Σ_j [x_j]_+^k, in fp32: h is convex and decreasing in τ (an ℓ_k norm of a convex map) and
*linear* when all live scores are equal, which makes it far better conditioned than S − 1 (Newton
on S − 1 needed 1.5–2× more passes in simulation). Each iteration is one pass over the key tiles
accumulating S, Σx^(k−1) and Σx^(k−2); from the left end of the bracket [max z' − 1,
max z' − n^(1−α)] a block of rows typically converges in 3–5 passes for α ≤ 1.5 (up to ~7 near
α = 2), and a bisection fallback keeps every iterate inside the bracket. The tile map is refreshed
on each pass against the bracket's lower end (a proven lower bound of τ), so later passes, the
output pass and the backward skip tiles that cannot reach the support.
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


@triton.jit(do_not_specialize=_LENGTHS)
def _entmax_fwd(
    Q, K, V, O, ALPHA, SLOPES, TAU, LOGS, VU, MASK, POS, ENT, SUP, PASS_LOG,
    SQ, SK, SV, SO,
    H, NQ, N, NB_M, NB_N, scale, tol,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, STORE_VU: tl.constexpr,
    USE_MASK: tl.constexpr, MAX_ITER: tl.constexpr, PREC: tl.constexpr, POW_MODE: tl.constexpr,
    HAS_POS: tl.constexpr, STATS: tl.constexpr, LOG_PASSES: tl.constexpr,
):
    """NQ query rows at positions POS (HAS_POS; else rows 0 … NQ−1) over N keys.

    STATS: also the normalized entropy (ENT) and support size (SUP) of every row, accumulated in
    the output pass from the same tiles.
    """
    pid_m, bh, b, h = _program(H)

    offs_m, offs_d, row_ok, d_ok, qd_mask = _block(pid_m, BLOCK_M, NQ, BLOCK_D, HEAD_DIM)
    offs_n0 = tl.arange(0, BLOCK_N)
    if HAS_POS:
        pos_m = tl.load(POS + offs_m, mask=row_ok, other=0).to(tl.int32)
    else:
        pos_m = offs_m

    q = _tile(_head_base(Q, SQ, b, h), offs_m, SQ, offs_d, qd_mask)
    k_base = _head_base(K, SK, b, h)
    v_base = _head_base(V, SV, b, h)

    alpha, am1, km1, sc, bias_coef = _head(ALPHA, SLOPES, h, scale, HAS_ALIBI)
    # Σp is summed from x^k with x^k's rounding error growing like k−1 (fp32 log2/exp2): relax to match.
    tol_a = tol * tl.maximum(km1, 1.0)

    if CAUSAL:
        n_end = tl.minimum(tl.max(tl.where(row_ok, pos_m, 0), 0) + 1, N)
    else:
        n_end = N
    mask_row = MASK + bh * (NB_M * NB_N) + pid_m * NB_N

    # ---- pass 0: row max of z' -------------------------------------------------------------
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    if LOG_PASSES:
        _log_pass(PASS_LOG, bh, pid_m, NB_M, 0, tl.cdiv(n_end, BLOCK_N))
    for start_n in range(0, n_end, BLOCK_N):
        offs_n = start_n + offs_n0
        kt = _tile(k_base, offs_n, SK, offs_d, (offs_n[:, None] < N) & d_ok[None, :])
        z = _scores(q, kt, pos_m, offs_n, N, sc, bias_coef, CAUSAL, HAS_ALIBI, PREC)
        m_i = tl.maximum(m_i, tl.max(z, 1))

    # Bracket [max z' − 1, max z' − n^(1−α)], n = visible keys of the row.
    if CAUSAL:
        n_vis = tl.minimum(pos_m + 1, N).to(tl.float32)
    else:
        n_vis = tl.zeros([BLOCK_M], tl.float32) + N
    lo = m_i - 1.0
    hi = m_i - tl.exp2(-am1 * tl.log2(n_vis))
    tau = lo
    s_last = tl.zeros([BLOCK_M], tl.float32) + 1.0

    # ---- passes 1..: Newton on S^(1/k) − 1 with bisection safeguard ----------------------------
    n_iter = 0
    busy = 1
    while busy != 0:
        s_sum = tl.zeros([BLOCK_M], tl.float32)
        w_sum = tl.zeros([BLOCK_M], tl.float32)
        v_sum = tl.zeros([BLOCK_M], tl.float32)
        n_tiles = 0
        for start_n in range(0, n_end, BLOCK_N):
            live = 1
            if USE_MASK:
                # The first pass computes every tile; later ones trust the previous pass's map.
                live = ((n_iter == 0) | (tl.load(mask_row + start_n // BLOCK_N) != 0)).to(tl.int32)
            if live != 0:
                n_tiles += 1
                offs_n = start_n + offs_n0
                kt = _tile(k_base, offs_n, SK, offs_d, (offs_n[:, None] < N) & d_ok[None, :])
                z = _scores(q, kt, pos_m, offs_n, N, sc, bias_coef, CAUSAL, HAS_ALIBI, PREC)
                a, xs, pos = _powers(z, tau, km1, POW_MODE)
                s_sum += tl.sum(a * xs, 1)
                w_sum += tl.sum(a, 1)
                if POW_MODE == 0:
                    v_sum += tl.sum(a / xs, 1)
                elif POW_MODE == 1:
                    v_sum += tl.sum(pos.to(tl.float32), 1)
                if USE_MASK:
                    # lo ≤ τ* always, so a tile with no z' above lo stays outside the support.
                    above = tl.where(row_ok[:, None], z - lo[:, None], float("-inf"))
                    tl.store(mask_row + start_n // BLOCK_N, (tl.max(tl.max(above, 1), 0) > 0.0).to(tl.uint8))
        if LOG_PASSES:
            _log_pass(PASS_LOG, bh, pid_m, NB_M, 1 + n_iter, n_tiles)
        s_last = s_sum
        ge = s_sum >= 1.0
        lo = tl.where(ge, tau, lo)
        hi = tl.where(ge, hi, tau)
        # h(τ) = S^(1/k) − 1 with S = Σx^k, W = Σx^(k−1), V = Σx^(k−2) and 1/k = α − 1:
        #   h' = −S^(α−2)·W,  h'' = (k − 1)·S^(α−2)·(V − W²/S).
        # Halley: τ + 2hW / (2S^(α−2)W² − (k−1)h(V − W²/S)); Newton: τ + h/(S^(α−2)W). Take Halley if
        # it lands inside the bracket, else Newton, else bisect.
        ls = tl.log2(tl.maximum(s_sum, 1e-30))
        h_val = tl.exp2(am1 * ls) - 1.0
        s_am2 = tl.exp2((am1 - 1.0) * ls)
        w_safe = tl.where(w_sum > 0.0, w_sum, 1.0)
        s_safe = tl.where(s_sum > 0.0, s_sum, 1.0)
        t_newton = tau + h_val / (s_am2 * w_safe)
        den = 2.0 * s_am2 * w_safe * w_safe - km1 * h_val * (v_sum - w_safe * w_safe / s_safe)
        t_halley = tau + 2.0 * h_val * w_safe / den
        ok_h = (t_halley > lo) & (t_halley < hi)
        ok_n = (t_newton > lo) & (t_newton < hi)
        t_new = tl.where(ok_h, t_halley, tl.where(ok_n, t_newton, 0.5 * (lo + hi)))
        t_new = tl.where(w_sum > 0.0, t_new, 0.5 * (lo + hi))
        stalled = tl.abs(t_new - tau) <= 2.4e-7 * tl.maximum(tl.abs(tau), 1.0)
        done = (tl.abs(s_sum - 1.0) <= tol_a) | stalled | (~row_ok)
        n_iter += 1
        busy = ((tl.min(done.to(tl.int32), 0) == 0) & (n_iter < MAX_ITER)).to(tl.int32)
        # Only move when another pass will test the new value: the output pass needs a tested τ.
        tau = tl.where((busy != 0) & (~done), t_new, tau)
    # A tested τ with S = 0 cannot normalize; fall back to lo (where S ≥ 1).
    tau = tl.where(s_last > 0.0, tau, lo)

    # ---- output pass -------------------------------------------------------------------------
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    s_sum = tl.zeros([BLOCK_M], tl.float32)
    w_sum = tl.zeros([BLOCK_M], tl.float32)
    plogp = tl.zeros([BLOCK_M], tl.float32)
    count = tl.zeros([BLOCK_M], tl.float32)
    n_tiles = 0
    for start_n in range(0, n_end, BLOCK_N):
        live = 1
        if USE_MASK:
            live = (tl.load(mask_row + start_n // BLOCK_N) != 0).to(tl.int32)
        if live != 0:
            n_tiles += 1
            offs_n = start_n + offs_n0
            kv_mask = (offs_n[:, None] < N) & d_ok[None, :]
            kt = _tile(k_base, offs_n, SK, offs_d, kv_mask)
            vt = _tile(v_base, offs_n, SV, offs_d, kv_mask)
            z = _scores(q, kt, pos_m, offs_n, N, sc, bias_coef, CAUSAL, HAS_ALIBI, PREC)
            a, xs, pos = _powers(z, tau, km1, POW_MODE)
            pt = a * xs
            s_sum += tl.sum(pt, 1)
            if STATS:
                # ln p̃ = k·ln x on the support (p̃ = x^k); xs = 1 elsewhere, so those terms are 0.
                plogp += tl.sum(pt * (tl.log2(xs) * (0.6931471805599453 / am1)), 1)
                count += tl.sum((pt > 0.0).to(tl.float32), 1)
            acc += tl.dot(pt.to(vt.dtype), vt, input_precision=PREC)
            if STORE_VU:
                w_sum += tl.sum(a, 1)
                acc_u += tl.dot(a.to(vt.dtype), vt, input_precision=PREC)

    if LOG_PASSES:
        _log_pass(PASS_LOG, bh, pid_m, NB_M, 1 + n_iter, n_tiles)
    s_safe = tl.where(s_sum > 0.0, s_sum, 1.0)
    o = acc / s_safe[:, None]
    _put_tile(_head_base(O, SO, b, h), offs_m, SO, offs_d, o, qd_mask)
    tl.store(TAU + bh * NQ + offs_m, tau, mask=row_ok)
    tl.store(LOGS + bh * NQ + offs_m, tl.log2(s_safe), mask=row_ok)
    if STATS:
        # H(p) = ln S − Σ p̃ ln p̃ / S for p = p̃ / S; normalized by ln(visible keys), 0 for one key.
        entropy = tl.log(s_safe) - plogp / s_safe
        log_n = tl.log(n_vis)
        entropy = tl.where(n_vis > 1.0, entropy / tl.where(n_vis > 1.0, log_n, 1.0), 0.0)
        tl.store(ENT + bh * NQ + offs_m, entropy, mask=row_ok)
        tl.store(SUP + bh * NQ + offs_m, count, mask=row_ok)
    if STORE_VU:
        # Σ_j u_ij v_j / Σ_j u_ij: the normalization of u cancels, so a = x^(k−1) suffices.
        w_safe = tl.where(w_sum > 0.0, w_sum, 1.0)
        vu = acc_u / w_safe[:, None]
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
            live = (tl.load(mask_row + start_n // BLOCK_N) != 0).to(tl.int32)
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
            live = (tl.load(mask_col + (start_m // BLOCK_M) * NB_N) != 0).to(tl.int32)
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
# Every kernel writes its outputs without reading them, so re-running during tuning is harmless.
_FWD_KEY = _KEY + ["STORE_VU", "HAS_POS", "STATS"]
entmax_fwd = triton.autotune(configs=_tuning_configs(), key=_FWD_KEY)(_entmax_fwd)
entmax_bwd_dq = triton.autotune(configs=_tuning_configs(), key=_KEY)(_entmax_bwd_dq)
entmax_bwd_dkdv = triton.autotune(configs=_tuning_configs(), key=_KEY)(_entmax_bwd_dkdv)
