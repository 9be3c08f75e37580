"""Baseline attention backends: softmax, SSMax, adaptive temperature, α-entmax, sparsemax, top-k."""

from lengthgen.baselines import adaptive_temperature, entmax, softmax, ssmax, topk  # noqa: F401
