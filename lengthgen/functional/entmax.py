"""α-entmax, exactly, with a hand-written backward.

``p_j = [(α−1) z_j − τ]_+ ^ (1/(α−1))`` with τ the unique value making Σ p = 1. We work with the
scaled, max-shifted scores ``x = (α−1)(z − max z)``, for which τ ∈ [−1, −n^(1−α)] (n = finite
entries of the row). τ is always solved in fp32 or better (fp64 inputs stay fp64) whatever the input
dtype, so half-precision activations never see a half-precision threshold:

* α = 1.5: exact, sort + closed form of the quadratic on each sorted prefix;
* α = 2 (sparsemax): exact, sort + closed form of the linear equation on each prefix;
* any other α (or a per-row α tensor): bisection on the bracket, then Newton steps from the left
  (f(τ) = Σ[x − τ]_+^(1/(α−1)) − 1 is convex and decreasing, so Newton from a point left of the root
  never overshoots and converges quadratically) and a final renormalization.

Masked entries (−inf) get exactly zero weight; a fully masked row gets all zeros; NaN scores count as
masked and +inf as very large, so the output never contains NaN.

Backward (support S = {p > 0}, u = p^(2−α) on S): ∂L/∂z = u⊙g − (Σu⊙g / Σu)·u. The (α−1) factors
cancel in this parameterization (it is the one of ``entmax.entmax_bisect``). When α is a tensor that
requires grad, its gradient is ∂p/∂α = (p − ũ)/(α−1)² − (p log p − ũ Σ p log p)/(α−1), ũ = u/Σu,
contracted with g.
"""

from __future__ import annotations

import torch

from lengthgen.functional.precision import compute_dtype

__all__ = ["EntmaxFunction", "check_alpha", "entmax", "entmax_backward", "entmax_forward", "entmax_threshold",
           "sparsemax"]

AlphaLike = float | torch.Tensor

#: Values of x below this can never be in the support (τ ≥ −1), so clamping them here is exact
#: and keeps cumulative sums finite.
_FLOOR = -2.0


def _scalar_alpha(alpha: AlphaLike) -> float | None:
    """The single α value if α is a number or a tensor holding one value everywhere, else None."""
    if isinstance(alpha, torch.Tensor):
        if alpha.numel() == 0:
            raise ValueError("alpha tensor is empty")
        flat = alpha.detach().reshape(-1)
        first = flat[0]
        if flat.numel() == 1 or bool((flat == first).all()):
            return float(first)
        return None
    return float(alpha)


def check_alpha(alpha: AlphaLike) -> None:
    """α (a number or a tensor of them) must lie in (1, 2]: at 1 the exponent 1/(α−1) is infinite,
    and above 2 the gradient's u = p^(2−α) is unbounded at the edge of the support. ValueError
    otherwise (NaN included)."""
    if isinstance(alpha, torch.Tensor):
        a = alpha.detach()
        ok = bool(((a > 1) & (a <= 2)).all())
    else:
        ok = 1.0 < float(alpha) <= 2.0
    if not ok:
        raise ValueError(f"alpha must lie in (1, 2], got {alpha!r}")


def _tau_alpha15(x: torch.Tensor) -> torch.Tensor:
    """Exact τ for α = 1.5 on rows x (last dim), x ≤ 0 with max 0, floored at −2."""
    srt, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype, device=x.device)
    cs = srt.cumsum(-1)
    cs2 = (srt * srt).cumsum(-1)
    mean = cs / k
    # Σ_{j≤k} (x_j − τ)² = 1  ⇒  τ = mean − sqrt((1 − Σ(x_j − mean)²) / k)
    delta = ((1 - (cs2 - cs * mean)) / k).clamp_min(0)
    tau_k = mean - delta.sqrt()
    support = (tau_k <= srt).sum(dim=-1, keepdim=True).clamp_min(1)
    return tau_k.gather(-1, support - 1)


def _tau_sparsemax(x: torch.Tensor) -> torch.Tensor:
    """Exact τ for α = 2 on rows x (last dim)."""
    srt, _ = torch.sort(x, dim=-1, descending=True)
    k = torch.arange(1, x.shape[-1] + 1, dtype=x.dtype, device=x.device)
    cs = srt.cumsum(-1)
    support = (1 + k * srt > cs).sum(dim=-1, keepdim=True).clamp_min(1)
    return (cs.gather(-1, support - 1) - 1) / support.to(x.dtype)


def _tau_general(x: torch.Tensor, alpha: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
    """τ for any α ∈ (1, 2]: bisection on [−1, −n^(1−α)], then Newton from the left."""
    expo = 1.0 / (alpha - 1)
    lo = torch.full_like(n, -1.0)
    hi = -(n ** (1 - alpha))
    iters = 54 if x.dtype == torch.float64 else 26
    for _ in range(iters):
        mid = (lo + hi) / 2
        f = (x - mid).clamp_min(0).pow(expo).sum(-1, keepdim=True) - 1
        go_right = f >= 0
        lo = torch.where(go_right, mid, lo)
        hi = torch.where(go_right, hi, mid)
    tau = lo  # f(lo) ≥ 0: left of the root, where Newton on a convex decreasing f is monotone
    for _ in range(3):
        d = (x - tau).clamp_min(0)
        f = d.pow(expo).sum(-1, keepdim=True) - 1
        fp = (expo * d.pow(expo - 1) * (d > 0)).sum(-1, keepdim=True)
        step = torch.where(fp > 0, f / fp.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(f))
        tau = torch.where(step > 0, tau + step, tau)
    return tau


def _alpha_for_rows(alpha: torch.Tensor, shape: torch.Size, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Broadcast an α tensor to the row shape of z moved to the last dim (…, 1)."""
    ndim = len(shape)
    row_shape = list(shape)
    row_shape[dim] = 1
    a = alpha.detach().to(dtype)
    if a.dim() > ndim:
        raise ValueError(f"alpha of shape {tuple(alpha.shape)} does not broadcast over z {tuple(shape)}")
    a = a.reshape((1,) * (ndim - a.dim()) + tuple(a.shape)).expand(row_shape)
    return a.movedim(dim, -1)


def _solve(
    z: torch.Tensor, alpha: AlphaLike, dim: int, scaled: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, float | None, torch.Tensor | None]:
    """Shared forward: (x, τ, m, keep, α if scalar, per-row α) with rows on the last dim.

    x = (α−1)(z − max) floored at −2 (masked entries too), τ relative to x, m the row max in z'
    units, keep = valid entries of rows with at least one valid entry. α is checked by the caller.
    """
    cd = compute_dtype(z.dtype)
    x = z.detach().to(cd).movedim(dim, -1)
    x = torch.nan_to_num(x, nan=float("-inf"), posinf=torch.finfo(cd).max / 4, neginf=float("-inf"))
    valid = x > float("-inf")
    any_valid = valid.any(-1, keepdim=True)
    m = x.amax(-1, keepdim=True)
    m = torch.where(any_valid, m, torch.zeros_like(m))
    a_scalar = _scalar_alpha(alpha)
    a_rows: torch.Tensor | None = None
    if a_scalar is not None:
        x = x - m if scaled else (x - m) * (a_scalar - 1)
        m_scaled = m if scaled else m * (a_scalar - 1)
    else:
        assert isinstance(alpha, torch.Tensor)
        a_rows = _alpha_for_rows(alpha, z.shape, dim, cd)
        x = x - m if scaled else (x - m) * (a_rows - 1)
        m_scaled = m if scaled else m * (a_rows - 1)
    x = torch.where(valid, x, torch.full_like(x, float("-inf"))).clamp_min(_FLOOR)
    if a_scalar == 1.5:
        tau = _tau_alpha15(x)
    elif a_scalar == 2.0:
        tau = _tau_sparsemax(x)
    else:
        n = valid.sum(-1, keepdim=True).clamp_min(1).to(cd)
        a_t = torch.full_like(n, a_scalar) if a_scalar is not None else a_rows
        assert a_t is not None
        tau = _tau_general(x, a_t, n)
    return x, tau, m_scaled, any_valid & valid, a_scalar, a_rows


def entmax_forward(
    z: torch.Tensor, alpha: AlphaLike = 1.5, dim: int = -1, *, scaled: bool = False, checked: bool = False
) -> torch.Tensor:
    """α-entmax probabilities without autograd, in the compute dtype (fp32, or fp64 for fp64 input).

    ``scaled=True`` means z already holds (α−1)·scores (the kernels work in that unit).
    ``checked=True``: the caller has checked α (the attention engine, once per call, for the
    kernels it hands α to); else it is checked here.
    """
    if not checked:
        check_alpha(alpha)
    dim = dim % z.dim() if z.dim() else 0
    if z.shape[dim] == 0:
        return z.detach().to(compute_dtype(z.dtype))
    x, tau, _, keep, a_scalar, a_rows = _solve(z, alpha, dim, scaled)
    if a_scalar == 1.5:
        p = (x - tau).clamp_min(0).square()
    elif a_scalar == 2.0:
        p = (x - tau).clamp_min(0)
    else:
        a_t = a_rows if a_rows is not None else torch.tensor(a_scalar, dtype=x.dtype, device=x.device)
        p = (x - tau).clamp_min(0).pow(1.0 / (a_t - 1))
        p = p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny)
    p = torch.where(keep, p, torch.zeros_like(p))
    return p.movedim(-1, dim)


def entmax_threshold(
    z: torch.Tensor, alpha: AlphaLike = 1.5, dim: int = -1, *, scaled: bool = False, checked: bool = False
) -> torch.Tensor:
    """τ with p = [(α−1) z − τ]_+^(1/(α−1)), keeping ``dim`` as size 1 (fp32 or fp64).

    Any subset of a row's entries has a τ no larger than the row's own, which is what makes this
    useful as a lower bound for pruning candidates. ``checked`` as for :func:`entmax_forward`.
    """
    if not checked:
        check_alpha(alpha)
    dim = dim % z.dim() if z.dim() else 0
    _, tau, m, _, _, _ = _solve(z, alpha, dim, scaled)
    return (tau + m).movedim(-1, dim)


def _score_gradient(
    p: torch.Tensor, g: torch.Tensor, alpha: torch.Tensor | float, dim: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(∂L/∂z, ũ) from the probabilities p and g = ∂L/∂p: u = p^(2−α) on the support, ũ = u/Σu."""
    # zero off the support, written in place (a fresh tensor from pow): the same values as a
    # torch.where against a zeros tensor, without allocating and filling one per call
    u = p.clamp_min(torch.finfo(p.dtype).tiny).pow(2 - alpha).masked_fill_(~(p > 0), 0.0)
    su = u.sum(dim, keepdim=True)
    u_tilde = u / torch.where(su > 0, su, torch.ones_like(su))
    return u * g - u * (u_tilde * g).sum(dim, keepdim=True), u_tilde


def entmax_backward(p: torch.Tensor, grad: torch.Tensor, alpha: float, dim: int = -1) -> torch.Tensor:
    """∂L/∂z of α-entmax (scalar α) from its output p and ∂L/∂p, in p's dtype.

    The closed-form Jacobian-vector product: execution paths that compute p their own way
    (a fused kernel) reuse it as their backward.
    """
    return _score_gradient(p, grad.to(p.dtype), float(alpha), dim)[0]


class EntmaxFunction(torch.autograd.Function):
    """α-entmax with the closed-form Jacobian-vector product (see the module docstring)."""

    @staticmethod
    def forward(ctx, z: torch.Tensor, alpha: AlphaLike, dim: int,  # type: ignore[override]
                checked: bool = False) -> torch.Tensor:
        p = entmax_forward(z, alpha, dim, checked=checked)
        alpha_t = alpha if isinstance(alpha, torch.Tensor) else None
        ctx.dim = dim
        ctx.alpha_float = None if alpha_t is not None else float(alpha)
        ctx.save_for_backward(p, *(() if alpha_t is None else (alpha_t,)))
        return p.to(z.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        p, *rest = ctx.saved_tensors
        dim = ctx.dim
        g = grad.to(p.dtype)
        if rest:
            a_rows = _alpha_for_rows(rest[0], p.shape, dim % p.dim(), p.dtype).movedim(-1, dim)
        else:
            a_rows = torch.tensor(ctx.alpha_float, dtype=p.dtype, device=p.device)
        on = p > 0
        gz, u_tilde = _score_gradient(p, g, a_rows, dim)
        g_alpha = None
        if rest and ctx.needs_input_grad[1]:
            alpha = rest[0]
            am1 = a_rows - 1
            plogp = torch.where(on, p * p.clamp_min(torch.finfo(p.dtype).tiny).log(), torch.zeros_like(p))
            ent = plogp.sum(dim, keepdim=True)
            dp_da = (p - u_tilde) / am1.square() - (plogp - u_tilde * ent) / am1
            ga = (g * dp_da).sum(dim, keepdim=True)
            # Reduce the per-row gradient back to alpha's own (broadcast) shape.
            ga = ga.sum_to_size(torch.Size((1,) * (ga.dim() - alpha.dim()) + tuple(alpha.shape)))
            g_alpha = ga.reshape(alpha.shape).to(alpha.dtype)
        return gz.to(grad.dtype), g_alpha, None, None


def entmax(z: torch.Tensor, alpha: AlphaLike = 1.5, dim: int = -1, *, checked: bool = False) -> torch.Tensor:
    """α-entmax of z along ``dim``; α ∈ (1, 2], a float or a tensor broadcastable over the rows.

    A tensor α broadcasts against z with size 1 along ``dim`` (e.g. per head for (B, H, N, N)
    scores: shape (H, 1, 1)). Output has z's dtype; τ is solved in fp32 or better. α is checked
    once (in the forward) unless ``checked`` says the caller did.
    """
    return EntmaxFunction.apply(z, alpha, dim, checked)


def sparsemax(z: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sparsemax (α = 2): Euclidean projection of z onto the simplex."""
    return EntmaxFunction.apply(z, 2.0, dim, True)
