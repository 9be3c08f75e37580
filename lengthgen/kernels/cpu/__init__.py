"""Kernels that run on the CPU: BLAS score blocks with numba row passes (α-entmax, its training row
solver, top-k, the softmax entropy pass) and the CPU flash-attention kernel (softmax, adaptive
temperature). ``jit`` holds what the numba kernels share; each kernel says whether it can run,
and ``lengthgen.kernels.engine`` decides what runs."""
