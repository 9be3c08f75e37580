"""The exact paths in pure torch, on any device: the materialized path (training, small problems,
the oracle the other paths are tested against) and the chunked paths that evaluate long inputs
in bounded memory (any normalizer, and α-entmax with candidate pruning): the fallback of every
fused kernel."""
