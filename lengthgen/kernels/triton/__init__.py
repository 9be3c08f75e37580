"""Kernels that run on CUDA through Triton: the fused α-entmax forward and backward with their torch
custom ops (``entmax``, ``entmax_kernels``) and softmax through FlexAttention, which PyTorch
compiles to a Triton kernel (``flex_softmax``). Importing this package never needs triton."""
