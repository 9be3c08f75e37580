"""The one definition of the attention diagnostics, for every backend and every path.

For a query row i with weights p_i over its n_i visible keys:

* entropy: H(p_i) / log n_i with H(p) = −Σ_j p_ij log p_ij (0 ⋅ log 0 = 0), so 1 is uniform and
  0 is one-hot; a row that sees one key scores 0;
* support: the number of keys with p_ij > 0 (in the path's floating point).

They are measured on the *diagnostic rows* of each attention call: every computed query row when
there are at most ``DIAGNOSTIC_ROWS``, else ``DIAGNOSTIC_ROWS`` evenly spaced ones
(``diagnostic_rows``). Every path reports the same rows; the reported means are over batch,
heads, diagnostic rows and layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "DIAGNOSTIC_ROWS", "DiagnosticSink", "Diagnostics", "diagnostic_rows", "normalize_entropy",
    "row_diagnostics",
]

#: Diagnostic rows per attention call (per layer). The dispersion measures are means (over
#: 512 rows × heads × batch × layers, thousands of rows per length), and on the fused softmax path
#: every diagnostic row costs one more pass over its visible keys: 2,048 rows made evaluation at
#: 4,096 tokens cost 3.3× SDPA, most of it diagnostics (benchmarks/README.md).
DIAGNOSTIC_ROWS = 512


@dataclass(frozen=True)
class Diagnostics:
    """Entropy and support (B, H, R) of the diagnostic rows ``rows`` (R,) of one call."""

    rows: Tensor
    entropy: Tensor
    support: Tensor


def diagnostic_rows(n_rows: int, device: torch.device | str = "cpu") -> Tensor:
    """Indices (R,) of the diagnostic rows among ``n_rows`` computed query rows, ascending."""
    if n_rows <= DIAGNOSTIC_ROWS:
        return torch.arange(n_rows, device=device)
    return torch.arange(DIAGNOSTIC_ROWS, device=device) * n_rows // DIAGNOSTIC_ROWS


def row_diagnostics(p: Tensor, visible: Tensor) -> tuple[Tensor, Tensor]:
    """Normalized entropy and support size of probability rows ``p`` (…, Nk), as float32.

    ``visible`` (broadcastable to p's rows) is the number of keys each row could see. Computed in
    fp32 (fp64 for fp64 rows) in a few vectorized passes; ``torch.special.entr`` and
    ``count_nonzero`` took several times longer on the long rows of evaluation.
    """
    pf = p.detach()
    pf = pf.double() if pf.dtype == torch.float64 else pf.float()
    log_p = torch.log(pf.clamp_min(torch.finfo(pf.dtype).tiny))
    entropy = -torch.linalg.vecdot(pf, log_p)
    support = torch.sign(pf).clamp_min(0).sum(-1)
    return normalize_entropy(entropy, visible), support.float()


def normalize_entropy(entropy: Tensor, visible: Tensor) -> Tensor:
    """H / log(visible keys); 0 for rows that see at most one key."""
    log_n = torch.log(visible.to(device=entropy.device, dtype=entropy.dtype).clamp_min(1.0))
    return torch.where(log_n > 0, entropy / torch.where(log_n > 0, log_n, 1.0), 0.0).float()


class DiagnosticSink:
    """Collects the diagnostics of the diagnostic rows from a path that works block by block."""

    def __init__(self, rows: Tensor, batch: int, heads: int, visible: Tensor) -> None:
        self.rows = rows
        self.visible = visible
        self.entropy = torch.zeros((batch, heads, rows.numel()), dtype=torch.float32, device=rows.device)
        self.support = torch.zeros_like(self.entropy)

    def add_block(self, start: int, stop: int, p: Tensor) -> None:
        """Probabilities p (B, H, stop − start, K) of query rows start … stop − 1."""
        lo, hi = (int(torch.searchsorted(self.rows, x)) for x in (start, stop))
        if hi > lo:
            chosen = self.rows[lo:hi]
            entropy, support = row_diagnostics(p[:, :, chosen - start], self.visible[chosen])
            self.entropy[:, :, lo:hi] = entropy
            self.support[:, :, lo:hi] = support

    def result(self) -> tuple[Tensor, Tensor]:
        return self.entropy, self.support
