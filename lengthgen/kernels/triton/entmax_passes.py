"""Debug counts of the Triton α-entmax kernels' work: passes over K per row block, tiles per pass.

No training or evaluation path uses this: the kernels take a constexpr flag (``LOG_PASSES``) that
compiles the record out of normal launches. It runs wherever the kernels run, a GPU or the CPU
under TRITON_INTERPRET=1, so the work a GPU would do can be counted without one (with the GPU's
64×64 tiles by default, since the number of passes a row block needs grows with its rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from lengthgen.kernels.triton import entmax as te

__all__ = ["PassCounts", "count_passes"]

#: The GPU's tiles for heads up to 64 wide (``entmax._block_sizes``).
GPU_BLOCKS = (64, 64)


@dataclass(frozen=True)
class PassCounts:
    """What one forward (and backward) computed, per program of each kernel.

    passes: (B·H, row blocks) passes over K made by the forward (the output pass included).
    tiles: (B·H, row blocks, slots) key tiles computed in each pass, 0 after the last.
    causal_tiles: (row blocks,) tiles a row block can see: what one full pass computes.
    dq_tiles, dkdv_tiles: (B·H, row blocks) and (B·H, key blocks) tiles computed by the backward
    kernels (empty without a backward); dkdv_causal: (key blocks,) tiles a key block can see.
    """

    passes: Tensor
    tiles: Tensor
    causal_tiles: Tensor
    dq_tiles: Tensor
    dkdv_tiles: Tensor
    dkdv_causal: Tensor

    def summary(self) -> dict[str, float]:
        """Median / 95th percentile of passes per row block (both an observed count, rounded up),
        tiles computed by the whole forward and by its output pass as a share of the causal tiles,
        and the share the backward computes (dq and dk/dv kernels together)."""
        passes = self.passes.flatten().cpu().numpy()
        causal = float(self.causal_tiles.sum()) * self.passes.shape[0]
        last = torch.gather(self.tiles, 2, (self.passes.long() - 1).clamp_min(0)[..., None])
        out = {
            "row_blocks": float(passes.size),
            "passes_median": float(np.percentile(passes, 50, method="higher")),
            "passes_p95": float(np.percentile(passes, 95, method="higher")),
            "passes_max": float(passes.max()),
            "fwd_tiles_per_causal_tile": float(self.tiles.sum()) / causal,
            "output_pass_tile_share": float(last.sum()) / causal,
        }
        if self.dq_tiles.numel():
            bwd_causal = causal + float(self.dkdv_causal.sum()) * self.passes.shape[0]
            out["bwd_tile_share"] = float(self.dq_tiles.sum() + self.dkdv_tiles.sum()) / bwd_causal
        return out


def _visible_tiles(n: int, rows: int, cols: int, block_rows: int, block_cols: int, causal: bool,
                   by_key_block: bool) -> Tensor:
    """Tiles each row block (or key block) can see, as the kernels bound their loops."""
    if by_key_block:
        nb = -(-cols // block_cols)
        if not causal:
            return torch.full((nb,), -(-rows // block_rows))
        first = [(j * block_cols) // block_rows for j in range(nb)]
        return torch.tensor([-(-rows // block_rows) - f for f in first])
    nb = -(-rows // block_rows)
    if not causal:
        return torch.full((nb,), -(-cols // block_cols))
    return torch.tensor([-(-min((i + 1) * block_rows, n) // block_cols) for i in range(nb)])


def count_passes(
    q: Tensor, k: Tensor, v: Tensor, alpha: float | Tensor = 1.5, alibi_slopes: Tensor | None = None, *,
    causal: bool = True, blocks: tuple[int, int] = GPU_BLOCKS, backward: bool = True, seed: int = 0,
) -> PassCounts:
    """Run the forward (and, with ``backward``, both backward kernels on a random dO) with the pass
    record on. q, k, v: (B, H, N, D), every row (as training calls it); scale 1/sqrt(D)."""
    alpha_t, slopes_t, scale_f = te._checked_arguments(q, k, v, alpha, alibi_slopes, None, True)
    B, H, N, D = q.shape
    geo = te._geometry(q, N, blocks)
    pow_mode = te._pow_mode(alpha)
    width = int(te._load_kernels().PASS_LOG_WIDTH)
    fwd_log = torch.zeros((B * H, geo.nb_m, width), dtype=torch.int32, device=q.device)
    q, k, v = (t.detach() for t in (q, k, v))
    o, tau, logs, vu, tile_map, _ent, _sup = te._launch_fwd(
        q, k, v, alpha_t, slopes_t, None, scale_f, causal, pow_mode, backward, False, geo, fwd_log)
    dq_log = torch.zeros((B * H, geo.nb_m, width), dtype=torch.int32, device=q.device)
    dkdv_log = torch.zeros((B * H, geo.nb_n, width), dtype=torch.int32, device=q.device)
    if backward:
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed)).to(o)
        te._launch_bwd(do, q, k, v, alpha_t, slopes_t, tau, logs, vu, tile_map, scale_f, causal, pow_mode,
                       True, True, geo, dq_log, dkdv_log)
    empty = torch.zeros(0, dtype=torch.int32)
    return PassCounts(
        passes=fwd_log[..., 0].cpu(),
        tiles=fwd_log[..., 1:].cpu(),
        causal_tiles=_visible_tiles(N, N, N, geo.block_m, geo.block_n, causal, by_key_block=False),
        dq_tiles=dq_log[..., 1].cpu() if backward else empty,
        dkdv_tiles=dkdv_log[..., 1].cpu() if backward else empty,
        dkdv_causal=_visible_tiles(N, N, N, geo.block_m, geo.block_n, causal, by_key_block=True),
    )
