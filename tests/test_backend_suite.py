"""Every built-in backend, and every backend an installed distribution registers by entry point
(the example plugin, ``lengthgen-baselines``), passes the generic suite plugin authors run
(``lengthgen.testing``), and the suite catches the classic mistakes (leaking the mask,
length-dependent chunks, NaN grads).
"""

from __future__ import annotations

import pytest
import torch

from lengthgen.attention import ATTENTION
from lengthgen.attention.backend import AttentionBackend
from lengthgen.attention.entmax_family import EntmaxFamilyBackend
from lengthgen.testing import CHECKS, check_backend


def _builtin_backends() -> list[tuple[str, type[AttentionBackend]]]:
    ATTENTION.get("softmax")  # loads the built-ins without importing any plugin
    return sorted(
        (entry.name, entry.obj)
        for entry in ATTENTION._entries.values()
        if entry.builtin and entry.obj.__module__.startswith("lengthgen.")
    )


def _kernel_missing() -> str | None:
    try:
        from lengthgen.kernels import entmax_attention  # noqa: F401
    except Exception as exc:
        return f"needs lengthgen.kernels.entmax_attention, not importable: {type(exc).__name__}: {exc}"
    return None


def _params() -> list[object]:
    missing = _kernel_missing()
    params = []
    for name, cls in _builtin_backends():
        marks = []
        if issubclass(cls, EntmaxFamilyBackend) and missing:
            marks.append(pytest.mark.skip(reason=missing.splitlines()[0]))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.mark.parametrize("name", _params())
def test_builtin_backend_passes_suite(name: str) -> None:
    assert check_backend(name) == list(CHECKS)


def _installed_plugins() -> list[str]:
    """Names registered through the ``lengthgen.attention`` entry points of installed distributions
    (only those that load: a broken plugin is the registry's business, tests/test_plugins.py)."""
    ATTENTION.names()
    return sorted(entry.name for entry in ATTENTION._entries.values()
                  if not entry.builtin and entry.origin.startswith("entry point"))


@pytest.mark.parametrize("name", _installed_plugins())
def test_installed_plugin_backend_passes_suite(name: str) -> None:
    assert check_backend(name) == list(CHECKS)


def test_baselines_are_among_the_installed_plugins() -> None:
    """``lengthgen-baselines`` (the README installs it) registers FoX and stick-breaking."""
    pytest.importorskip("lengthgen_baselines", reason="not installed: pip install -e baselines")
    assert {"fox", "stickbreaking"} <= set(_installed_plugins())


def test_builtins_found() -> None:
    names = {name for name, _ in _builtin_backends()}
    assert {"softmax", "ssmax", "adaptive_temperature", "topk", "entmax", "asentmax"} <= names


# -- the suite must catch real bugs -------------------------------------------------------------
class LeakyMask(AttentionBackend):
    """Bug: treats masked (−inf) scores as 0, so rows attend to the future."""

    name = "leaky_mask"
    description = "test: leaks future keys"

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores.nan_to_num(neginf=0.0), dim=-1)


class RowWidthTemperature(AttentionBackend):
    """Bug: sharpens by log(row width), which is the visible count only on the chunked path."""

    name = "row_width_temperature"
    description = "test: depends on how many keys the block has"

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        return torch.softmax(scores * torch.log(torch.tensor(scores.shape[-1] + 1.0)), dim=-1)


class SqrtWeights(AttentionBackend):
    """Bug: sqrt of softmax, renormalized; fine forward, NaN gradients at exact zeros."""

    name = "sqrt_weights"
    description = "test: infinite derivative at zero weights"

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(scores, dim=-1).sqrt()
        return p / p.sum(-1, keepdim=True)


class Unnormalized(AttentionBackend):
    """Sigmoid attention with a −log n bias: rows need not sum to 1 (``normalized=False``)."""

    name = "sigmoid_test"
    description = "test: sigmoid weights"

    def normalize(self, scores: torch.Tensor) -> torch.Tensor:
        visible = torch.isfinite(scores).sum(-1, keepdim=True).clamp_min(1)
        return torch.sigmoid(scores - torch.log(visible.to(scores.dtype)))


@pytest.mark.parametrize(
    ("backend", "check", "message"),
    [
        (LeakyMask, "weights", "future"),
        (LeakyMask, "causal", "before changed position"),
        (RowWidthTemperature, "paths", "chunked vs materialized"),
        (SqrtWeights, "gradients", "non-finite"),
        (Unnormalized, "weights", "row sums"),
    ],
)
def test_suite_catches_bugs(backend: type[AttentionBackend], check: str, message: str) -> None:
    with pytest.raises(AssertionError, match=message) as err:
        check_backend(backend, skip=[c for c in CHECKS if c != check])
    assert backend.name in str(err.value) and "\n" not in str(err.value)


def test_unnormalized_backend_passes_when_declared() -> None:
    check_backend(Unnormalized, normalized=False, positions=("nope",))


def test_suite_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown checks"):
        check_backend("softmax", skip=["no_such_check"])
    with pytest.raises(Exception, match="k"):
        check_backend("topk", k=0)
    with pytest.raises(AssertionError, match="not a subclass"):
        check_backend(int)  # type: ignore[arg-type]
