import os

import torch

# Triton kernels run on CPU through the interpreter in tests; it must be chosen before triton is
# imported. An explicit setting (or a CUDA machine) wins.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The models in tests are tiny: one thread is faster than two, and far faster on a busy 2-core box.
torch.set_num_threads(1)
