"""The pure mathematics of attention, with no dependency on the rest of lengthgen.

Everything here is a definition: the α-entmax normalizer and its threshold (``entmax``), position
schemes and ALiBi slopes (``positions``), learned query scales (``scales``) and the
adaptive-temperature polynomial (``temperature``). The execution paths in ``lengthgen.kernels``
and the backends in ``lengthgen.attention`` build on it; it imports only torch, so it can be read,
tested and reused on its own. ``tests/test_layout.py`` holds it to that.
"""
