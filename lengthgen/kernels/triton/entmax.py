"""Fused Triton α-entmax attention: forward and backward without an N×N tensor.

`triton_entmax_attention(q, k, v, alpha, causal, alibi_slopes, scale)` computes, per head h and query i,
z_ij = scale·<q_i, k_j> − slope_h·(i − j) over the visible keys (j ≤ i when causal), p_i = α-entmax(z_i)
and o_i = Σ_j p_ij v_j. The kernels live in `entmax_kernels` and are imported on
first call, so importing this module never needs triton; calling it without triton raises RuntimeError.

Forward: two kernels, one program per (query block, batch·head) each. The threshold kernel makes a
bracket pass (row max and a histogram of the gaps below it) and one Halley refinement pass for τ
(fp32, bracketed, see the kernels module); the output kernel makes the output pass there, corrected
to first order in a certified last Newton step, and repeats it only where that is not certified.
Tiles whose scores all lie below a proven lower bound of τ are recorded in a one-byte-per-tile map
and skipped by the later passes; tiles without support at the final τ are skipped by the backward.

Backward, with u = p^(2−α) on the support and g = dO·Vᵀ:
∂L/∂z = u ⊙ (g − c), c_i = Σ_j u_ij g_ij / Σ_j u_ij = dO_i · (Σ_j u_ij v_j / Σ_j u_ij). The u-weighted
mean of V is accumulated in the forward's output pass, so c costs one dot product per row and the
backward is one pass per query block (dq) plus one per key block (dk, dv), without atomics.
"""

from __future__ import annotations

import importlib
import math
import os
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lengthgen.functional.entmax import check_alpha
from lengthgen.kernels.problem import on_device, per_head

__all__ = ["triton_available", "triton_entmax_attention", "triton_path", "unavailable_reason"]

# Above this many tiles the liveness map (1 byte each) is dropped, keeping memory linear in N.
_MAX_MASK_TILES = 1 << 28
# Stopping rule for the τ iteration: |Σ p − 1| ≤ _TOL·max(1, k − 1), k = 1/(α − 1), or a step under
# 2 ulp of τ; the output is renormalized by its exact sum, so p's error is about |Σ p − 1|.
_TOL = 2e-6
_MAX_ITER = 32
#: Multiply-adds fused (FMA), stated rather than left to Triton's default, which Triton means to
#: turn off in a later release: the kernels' rounding then stays what the tests and the recorded
#: GPU results measured. The interpreter ignores it (it runs numpy).
_LAUNCH_OPTIONS = {"enable_fp_fusion": True}

_kernels: Any = None


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _load_kernels() -> Any:
    """Import the triton kernels once; a missing or broken triton becomes a clear RuntimeError."""
    global _kernels
    if _kernels is None:
        try:
            mod = importlib.import_module("lengthgen.kernels.triton.entmax_kernels")
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise RuntimeError(
                "triton_entmax_attention needs the `triton` package (pip install 'lengthgen[gpu]'); "
                f"importing it failed: {exc}"
            ) from exc
        _kernels = mod
    return _kernels


def triton_available() -> bool:
    """True when triton imports (it may still lack a GPU; see `triton_entmax_attention`)."""
    return not unavailable_reason()


def unavailable_reason() -> str:
    """Why the kernels cannot be loaded ('' when they can)."""
    try:
        _load_kernels()
    except RuntimeError as exc:
        return str(exc)
    return ""


def _alloc(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """Uninitialized buffer for kernel outputs (a seam: tests swap in NaN-filled buffers)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _block_sizes(block_d: int, interpret: bool) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): small tiles under the interpreter, 64×64 (64×32 for wide heads) on GPU."""
    if interpret:
        return 32, 32
    return (64, 64) if block_d <= 64 else (64, 32)


def _check_alpha(alpha: float | Tensor) -> None:
    """α ∈ (1, 2] (``check_alpha``). Tensors are checked only on CPU outside torch.compile (on GPU
    the check would synchronize the host)."""
    if isinstance(alpha, Tensor) and (alpha.device.type != "cpu" or torch.compiler.is_compiling()):
        return
    check_alpha(alpha)


class _Geometry(NamedTuple):
    block_d: int
    block_m: int
    block_n: int
    nb_m: int
    nb_n: int
    use_mask: bool
    prec: str


def _geometry(q: Tensor, n_keys: int | None = None, blocks: tuple[int, int] | None = None) -> _Geometry:
    """Tiling shared by the forward and both backward kernels (the tile map ties them together).

    ``blocks``: (BLOCK_M, BLOCK_N) instead of the device's choice (the pass counter uses the GPU's
    tiles under the interpreter, so its counts are those a GPU would make).
    """
    B, H, N, D = q.shape
    block_d = max(16, triton_next_pow2(D))
    bm, bn = blocks if blocks is not None else _block_sizes(block_d, _interpreting())
    nb_m, nb_n = -(-N // bm), -(-(N if n_keys is None else n_keys) // bn)
    use_mask = B * H * nb_m * nb_n <= _MAX_MASK_TILES
    # fp32 inputs get exact fp32 dots (no TF32) so fp32 results match the fp64 reference to ~1e-6.
    prec = "ieee" if q.dtype == torch.float32 else "tf32"
    return _Geometry(block_d, bm, bn, nb_m, nb_n, use_mask, prec)


# The kernels are wrapped as torch.library custom ops so torch.compile treats them as opaque calls
# (with shape-only fake implementations) instead of tracing into Triton launch code.
_FWD_SCHEMA = (
    "(Tensor q, Tensor k, Tensor v, Tensor alpha, Tensor? slopes, Tensor? positions, float scale, "
    "bool causal, int pow_mode, bool store_vu, bool stats) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)
_BWD_SCHEMA = (
    "(Tensor do, Tensor q, Tensor k, Tensor v, Tensor alpha, Tensor? slopes, Tensor tau, Tensor logs, "
    "Tensor vu, Tensor tile_map, float scale, bool causal, int pow_mode, bool need_q, bool need_kv) "
    "-> (Tensor, Tensor, Tensor)"
)


def _launch_fwd(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None, positions: Tensor | None,
    scale: float, causal: bool, pow_mode: int, store_vu: bool, stats: bool, geo: _Geometry,
    pass_log: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Run the forward kernels (see ``_entmax_fwd_op``); ``pass_log`` turns on the debug pass record."""
    kern = _load_kernels()
    B, H, NQ, D = q.shape
    N = k.shape[2]
    dev = q.device
    o = _alloc((B, H, NQ, D), q.dtype, dev)
    tau = _alloc((B, H, NQ), torch.float32, dev)
    logs = _alloc((B, H, NQ), torch.float32, dev)
    vu = _alloc((B, H, NQ, geo.block_d), torch.float32, dev) if store_vu else tau.new_empty(0)
    ent = _alloc((B, H, NQ), torch.float32, dev) if stats else tau.new_empty(0)
    sup = _alloc((B, H, NQ), torch.float32, dev) if stats else tau.new_empty(0)
    # Zeroed (one byte per tile) only so tiles above the causal diagonal, never visited, are
    # deterministic; every visited tile is written by the bracket pass before any read.
    map_shape = (B * H, geo.nb_m, geo.nb_n) if geo.use_mask else (0,)
    tile_map = torch.zeros(map_shape, dtype=torch.uint8, device=dev)
    # τ₂ and its bracket, from the threshold kernel to the output kernel (three allocations: views
    # into one would start at offsets whose alignment changes with NQ, and Triton specializes on it).
    tau2, lo, hi = (_alloc((B, H, NQ), torch.float32, dev) for _ in range(3))
    map_arg = tile_map if geo.use_mask else tau
    pos_arg = positions if positions is not None else tau
    log_arg = pass_log if pass_log is not None else tau
    slopes_arg = slopes if slopes is not None else alpha
    common = dict(HEAD_DIM=D, BLOCK_D=geo.block_d, BLOCK_M=geo.block_m, BLOCK_N=geo.block_n,
                  CAUSAL=causal, HAS_ALIBI=slopes is not None, USE_MASK=geo.use_mask, PREC=geo.prec,
                  POW_MODE=pow_mode, HAS_POS=positions is not None, LOG_PASSES=pass_log is not None,
                  **_LAUNCH_OPTIONS)
    grid = (geo.nb_m, B * H)
    kern.entmax_fwd_threshold[grid](
        q, k, alpha, slopes_arg, tau2, lo, hi, map_arg, pos_arg, log_arg,
        q.stride(), k.stride(),
        H, NQ, N, geo.nb_m, geo.nb_n, scale, _TOL, **common,
    )
    kern.entmax_fwd_output[grid](
        q, k, v, o, alpha, slopes_arg, tau2, lo, hi, tau, logs, vu if store_vu else tau, map_arg, pos_arg,
        ent if stats else tau, sup if stats else tau, log_arg,
        q.stride(), k.stride(), v.stride(), o.stride(),
        H, NQ, N, geo.nb_m, geo.nb_n, scale, _TOL,
        STORE_VU=store_vu, MAX_ITER=_MAX_ITER, STATS=stats, **common,
    )
    return o, tau, logs, vu, tile_map, ent, sup


@torch.library.custom_op("lengthgen::triton_entmax_fwd", mutates_args=(), schema=_FWD_SCHEMA)
def _entmax_fwd_op(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None, positions: Tensor | None,
    scale: float, causal: bool, pow_mode: int, store_vu: bool, stats: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(o, τ, log2 Σp̃, u-weighted mean of V or empty, tile map or empty, entropy, support).

    ``positions``: (Nq,) int32 absolute positions of q's rows over k's Nk keys (None: q's rows are
    the positions 0 … Nq−1). ``stats``: the normalized entropy and support of every row (else the
    last two outputs are empty).
    """
    return _launch_fwd(q, k, v, alpha, slopes, positions, scale, causal, pow_mode, store_vu, stats,
                       _geometry(q, k.shape[2]))


@_entmax_fwd_op.register_fake
def _entmax_fwd_fake(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None, positions: Tensor | None,
    scale: float, causal: bool, pow_mode: int, store_vu: bool, stats: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    B, H, N, D = q.shape
    geo = _geometry(q, k.shape[2])
    f32 = dict(dtype=torch.float32, device=q.device)
    vu = q.new_empty((B, H, N, geo.block_d), **f32) if store_vu else q.new_empty(0, **f32)
    map_shape = (B * H, geo.nb_m, geo.nb_n) if geo.use_mask else (0,)
    row_stats = [q.new_empty((B, H, N) if stats else 0, **f32) for _ in range(2)]
    return (q.new_empty(q.shape), q.new_empty((B, H, N), **f32), q.new_empty((B, H, N), **f32), vu,
            q.new_empty(map_shape, dtype=torch.uint8), *row_stats)


def _launch_bwd(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None,
    tau: Tensor, logs: Tensor, vu: Tensor, tile_map: Tensor,
    scale: float, causal: bool, pow_mode: int, need_q: bool, need_kv: bool, geo: _Geometry,
    dq_log: Tensor | None = None, dkdv_log: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Run the backward kernels (see ``_entmax_bwd_op``); the logs turn on their debug tile counts."""
    kern = _load_kernels()
    B, H, N, D = q.shape
    dev = q.device
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    # c_i = dO_i · (u-weighted mean of V); only dq and dk depend on it.
    if vu.numel():
        delta = (do.float() * vu[..., :D]).sum(-1).contiguous()
    else:
        delta = torch.zeros((B, H, N), dtype=torch.float32, device=dev)
    slopes_arg = slopes if slopes is not None else alpha
    map_arg = tile_map if geo.use_mask else tau
    common = dict(HEAD_DIM=D, BLOCK_D=geo.block_d, BLOCK_M=geo.block_m, BLOCK_N=geo.block_n,
                  CAUSAL=causal, HAS_ALIBI=slopes is not None, USE_MASK=geo.use_mask, PREC=geo.prec,
                  POW_MODE=pow_mode, **_LAUNCH_OPTIONS)
    dq = dk = dv = q.new_empty(0)
    if need_q:
        dq = _alloc((B, H, N, D), q.dtype, dev)
        kern.entmax_bwd_dq[(geo.nb_m, B * H)](
            q, k, v, do, dq, alpha, slopes_arg, tau, logs, delta, map_arg,
            dq_log if dq_log is not None else tau,
            q.stride(), k.stride(), v.stride(), do.stride(), dq.stride(),
            H, N, geo.nb_m, geo.nb_n, scale, LOG_PASSES=dq_log is not None, **common,
        )
    if need_kv:
        dk = _alloc((B, H, N, D), k.dtype, dev)
        dv = _alloc((B, H, N, D), v.dtype, dev)
        kern.entmax_bwd_dkdv[(geo.nb_n, B * H)](
            q, k, v, do, dk, dv, alpha, slopes_arg, tau, logs, delta, map_arg,
            dkdv_log if dkdv_log is not None else tau,
            q.stride(), k.stride(), v.stride(), do.stride(), dk.stride(), dv.stride(),
            H, N, geo.nb_m, geo.nb_n, scale, LOG_PASSES=dkdv_log is not None, **common,
        )
    return dq, dk, dv


@torch.library.custom_op("lengthgen::triton_entmax_bwd", mutates_args=(), schema=_BWD_SCHEMA)
def _entmax_bwd_op(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None,
    tau: Tensor, logs: Tensor, vu: Tensor, tile_map: Tensor,
    scale: float, causal: bool, pow_mode: int, need_q: bool, need_kv: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """(dq or empty, dk or empty, dv or empty)."""
    return _launch_bwd(do, q, k, v, alpha, slopes, tau, logs, vu, tile_map, scale, causal, pow_mode,
                       need_q, need_kv, _geometry(q))


@_entmax_bwd_op.register_fake
def _entmax_bwd_fake(
    do: Tensor, q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None,
    tau: Tensor, logs: Tensor, vu: Tensor, tile_map: Tensor,
    scale: float, causal: bool, pow_mode: int, need_q: bool, need_kv: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    dq = q.new_empty(q.shape) if need_q else q.new_empty(0)
    dk = k.new_empty(k.shape) if need_kv else k.new_empty(0)
    dv = v.new_empty(v.shape) if need_kv else v.new_empty(0)
    return dq, dk, dv


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: tuple[Tensor, ...]) -> None:
    q, k, v, alpha, slopes, _positions, scale, causal, pow_mode, _store_vu, _stats = inputs
    _o, tau, logs, vu, tile_map, _ent, _sup = output
    ctx.save_for_backward(q, k, v, alpha, slopes, tau, logs, vu, tile_map)
    ctx.meta = (scale, causal, pow_mode)


def _backward(ctx: Any, do: Tensor, *_unused: Tensor | None) -> tuple[Tensor | None, ...]:
    q, k, v, alpha, slopes, tau, logs, vu, tile_map = ctx.saved_tensors
    scale, causal, pow_mode = ctx.meta
    need_q, need_k, need_v = ctx.needs_input_grad[:3]
    if need_q and not vu.numel():  # pragma: no cover - guarded by store_vu at the call site
        raise RuntimeError("q needs a gradient but the forward did not store the u-weighted V")
    dq, dk, dv = _entmax_bwd_op(do, q, k, v, alpha, slopes, tau, logs, vu, tile_map,
                                scale, causal, pow_mode, need_q, need_k or need_v)
    return (dq if need_q else None, dk if need_k else None, dv if need_v else None,
            None, None, None, None, None, None, None, None)


torch.library.register_autograd("lengthgen::triton_entmax_fwd", _backward, setup_context=_setup_context)


def triton_next_pow2(n: int) -> int:
    """Smallest power of two ≥ n (tl.arange needs power-of-two extents; the tail is masked)."""
    return 1 << max(0, (int(n) - 1).bit_length())


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, full_rows: bool) -> None:
    if q.dim() != 4 or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3] or v.shape != k.shape:
        raise ValueError(
            f"q must be (B, H, Nq, D) and k, v (B, H, Nk, D), got {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}"
        )
    if full_rows and k.shape != q.shape:
        raise ValueError(
            f"without q_positions, q, k, v must all be (B, H, N, D) of one shape, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    if not (q.device == k.device == v.device):
        raise ValueError("q, k, v must be on one device")
    _check_runs(q, k, v)


def _check_runs(q: Tensor, k: Tensor, v: Tensor) -> None:
    """What the kernels can run (dtypes, head size, device), checked on every call: the engine's
    validated problem admits inputs these kernels cannot take."""
    if v.shape != k.shape:
        raise ValueError(f"the Triton kernel needs v of k's shape {tuple(k.shape)}, got {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"q, k, v must share one of fp32/fp16/bf16, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[-1] > 256:
        raise ValueError(f"head dim {q.shape[-1]} > 256 is not supported")
    if q.is_cuda:
        return
    if not _interpreting():
        raise RuntimeError(
            "triton_entmax_attention runs on CUDA tensors (or on CPU under TRITON_INTERPRET=1, "
            f"for testing); got device {q.device}"
        )
    if q.dtype == torch.bfloat16:
        raise RuntimeError("the Triton interpreter cannot run bf16; use fp32/fp16 on CPU or a GPU")


def _checked_arguments(
    q: Tensor, k: Tensor, v: Tensor, alpha: float | Tensor, alibi_slopes: Tensor | None, scale: float | None,
    full_rows: bool,
) -> tuple[Tensor, Tensor | None, float]:
    """The kernels' per-call arguments, checked: (α per head, ALiBi slopes per head or None, scale)."""
    _load_kernels()
    _check_inputs(q, k, v, full_rows)
    _check_alpha(alpha)
    H, D = q.shape[1], q.shape[3]
    alpha_t = per_head(alpha, H, "alpha", 1.5, q.device, torch.float32)
    slopes_t = None if alibi_slopes is None else per_head(alibi_slopes, H, "alibi_slopes", 0.0, q.device,
                                                          torch.float32)
    return alpha_t, slopes_t, 1.0 / math.sqrt(D) if scale is None else float(scale)


def triton_entmax_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    alpha: float | Tensor = 1.5,
    causal: bool = True,
    alibi_slopes: Tensor | None = None,
    scale: float | None = None,
    *,
    q_positions: Tensor | None = None,
    return_stats: bool = False,
) -> Tensor | tuple[Tensor, Tensor, Tensor]:
    """α-entmax attention with the fused Triton kernels.

    q: (B, H, Nq, D); k, v: (B, H, Nk, D). Without ``q_positions`` the rows are the positions
    0 … N−1 (Nq = Nk); with them (an (Nq,) integer tensor, evaluation's row subset) the kernel
    computes just those rows, forward only. alpha: a float or an (H,) tensor in (1, 2] (read at
    run time: sweeping α does not recompile; it carries no gradient). alibi_slopes: (H,) slopes
    m_h, bias −m_h·(pos_i − j) taken literally, also when causal=False. scale: defaults to
    1/sqrt(D); a per-query scale (ASEntmax) is folded into q. Gradients flow to q, k and v.
    ``return_stats``: also (entropy, support), each (B, H, Nq): H(p_i)/log(visible keys) (0 for
    one key) and the number of keys with p_ij > 0, accumulated in the output pass.
    """
    alpha_t, slopes_t, scale_f = _checked_arguments(q, k, v, alpha, alibi_slopes, scale, q_positions is None)
    B, H, N, D = q.shape
    positions = _positions(q, k, v, q_positions)
    if N == 0 or k.shape[2] == 0:
        out = q.new_zeros(q.shape)
        empty = q.new_zeros((B, H, N), dtype=torch.float32)
        return (out, empty, empty.clone()) if return_stats else out
    o, ent, sup = _attend(q, k, v, alpha_t, slopes_t, scale_f, bool(causal), _pow_mode(alpha), positions,
                          bool(return_stats))
    return (o, ent, sup) if return_stats else o


def _positions(q: Tensor, k: Tensor, v: Tensor, q_positions: Tensor | None) -> Tensor | None:
    """The kernels' (Nq,) int32 query positions, or None for full causal rows (which alone have a
    gradient)."""
    if q_positions is None:
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise ValueError("the Triton kernel computes gradients of full causal rows only (no q_positions)")
    positions = q_positions.to(device=q.device, dtype=torch.int32).reshape(-1).contiguous()
    if positions.numel() != q.shape[2]:
        raise ValueError(f"q_positions has {positions.numel()} entries for {q.shape[2]} query rows")
    return positions


def _attend(
    q: Tensor, k: Tensor, v: Tensor, alpha: Tensor, slopes: Tensor | None, scale: float, causal: bool,
    pow_mode: int, positions: Tensor | None, stats: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    """The launcher on checked arguments (α and slopes per head, fp32 on q's device): (output,
    entropy, support), the last two empty without ``stats``."""
    # Only dq and dk need Σ_j u_ij v_j; skip that extra product when neither will be asked for.
    store_vu = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    o, _tau, _logs, _vu, _map, ent, sup = _entmax_fwd_op(
        q, k, v, alpha, slopes, positions, scale, causal, pow_mode, store_vu, stats,
    )
    return o, ent, sup


def _pow_mode(alpha: float | Tensor) -> int:
    """Specialize the per-element power for a Python α of exactly 1.5 (x^(k−1) = x) or 2 (= 1).

    Any other α, and every tensor α, shares one compiled kernel that reads α at run time.
    """
    if isinstance(alpha, Tensor):
        return 0
    return {1.5: 1, 2.0: 2}.get(float(alpha), 0)


def triton_path(q: Tensor, k: Tensor, v: Tensor, prob: Any, normalizer: Any, rows: Tensor | None,
                *, alpha: Tensor) -> Any:
    """The engine's ``triton`` path for an ``Entmax`` normalizer (stats only for ``rows``). The
    engine validated the problem and α per head (``alpha``, float64 on the CPU), so only what the
    kernels can run is checked here before the launcher."""
    _load_kernels()
    _check_runs(q, k, v)
    positions = _positions(q, k, v, None if prob.full_rows else prob.q_positions)
    slopes = prob.slopes_or_none()
    out, entropy, support = _attend(
        q, k, v, on_device(alpha, q.device, torch.float32),
        None if slopes is None else on_device(slopes, q.device, torch.float32),
        prob.scale, prob.causal, _pow_mode(normalizer.alpha), positions, rows is not None,
    )
    if rows is None:
        return out, None, None
    return out, entropy[:, :, rows], support[:, :, rows]
