"""A plan's numerics pin: the environment variables that fix the instruction sets its runs were
made with, set by ``lengthgen sweep --plan`` itself.

Why: two x86-64 machines round the same training differently when one runs AVX-512 kernels and
the other AVX2 (torch, MKL, oneDNN and numba each pick by the processor), and a board's runs
then stop reproducing from the first steps. These variables are read when torch and numba load,
so they are set in this process before either is imported, and pool workers inherit them. A
value the environment already sets differently is an error, not silently overridden: the rows
would record numerics the plan does not describe.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from collections.abc import Mapping, MutableMapping

from lengthgen.errors import UserError

#: The variables a plan may pin, each with the values it may take. Only variables that choose the
#: instruction sets (or the reproducibility mode) of a library that computes: a plan is a recipe
#: other people download and run, so it must not set anything that loads or runs code
#: (``PYTHONPATH`` → a ``sitecustomize.py``, ``LD_PRELOAD`` → a library in every process) or steers
#: other programs (``GIT_CONFIG_*``). DNNL_MAX_CPU_ISA is oneDNN's older name for its cap;
#: MKL_CBWR is MKL's conditional numerical reproducibility (a fixed code path per instruction
#: set); NUMBA_CPU_FEATURES goes with NUMBA_CPU_NAME (numba's documented pair for a fixed target).
_ONEDNN = (r"SSE41|AVX|AVX2(_VNNI(_2)?)?|AVX512_CORE(_[A-Z0-9]+){0,3}|AVX10_[0-9]+(_[A-Z0-9]+){0,3}"
           r"|ALL|DEFAULT")
PINS: dict[str, re.Pattern[str]] = {
    "ATEN_CPU_CAPABILITY": re.compile(r"default|avx2|avx512|avx512_vnni|avx512_bf16|avx512_fp16|vsx|zvector"
                                      r"|sve(128|256|512)?"),
    "MKL_ENABLE_INSTRUCTIONS": re.compile(r"SSE4_2|AVX|AVX2|AVX512(_E[1-5])?|AVX10(_[0-9])?"),
    "MKL_CBWR": re.compile(r"(AUTO|COMPATIBLE|SSE4_2|AVX|AVX2|AVX512(_E[1-5])?)(,STRICT)?"),
    "ONEDNN_MAX_CPU_ISA": re.compile(_ONEDNN),
    "DNNL_MAX_CPU_ISA": re.compile(_ONEDNN),
    "NUMBA_CPU_NAME": re.compile(r"[a-z0-9][a-z0-9.-]{0,39}"),
    "NUMBA_CPU_FEATURES": re.compile(r"[+-][a-z0-9._]{1,32}(,[+-][a-z0-9._]{1,32}){0,199}"),
}


def check_pins(pins: Mapping[str, object]) -> None:
    """Every pin is one of :data:`PINS` with a value of its pattern (a ValueError in one line that
    names the variables a plan may set)."""
    for name, value in pins.items():
        pattern = PINS.get(name)
        if pattern is None:
            shown = name if len(name) <= 40 else name[:40] + "…"
            raise ValueError(f"{shown!r} is not a numerics pin; a plan may set only "
                             f"{', '.join(PINS)} (the instruction sets its runs compute with)")
        if not isinstance(value, str) or not pattern.fullmatch(value):
            shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
            raise ValueError(f"{name} = {shown} is not a value it takes (pattern {pattern.pattern})")
#: Modules that read the pinned variables when they load; once loaded, a pin comes too late.
READERS = ("torch", "numba")
#: The machines whose instruction sets the pins name.
X86_64 = ("x86_64", "amd64")


def pin_numerics(pins: Mapping[str, str], environ: MutableMapping[str, str] | None = None,
                 machine: str | None = None) -> str | None:
    """Set the plan's pins in ``environ`` (this process's environment); the line to report, None
    without pins. A UserError when the environment sets one differently or a reader is loaded."""
    if not pins:
        return None
    try:
        check_pins(pins)  # the plan's reader checks them; never set anything else, whoever calls
    except ValueError as exc:
        raise UserError(f"numerics: {exc}") from None
    env = os.environ if environ is None else environ
    arch = (machine if machine is not None else platform.machine()).lower()
    shown = " ".join(f"{name}={value}" for name, value in pins.items())
    if arch not in X86_64:
        return (f"numerics: the plan pins x86-64 instruction sets ({shown}); this {arch} machine "
                "computes with its own, so its rows will not match the recorded ones bit for bit")
    for name, value in pins.items():
        if name in env and env[name] != value:
            raise UserError(f"the plan pins {name}={value} but the environment sets {name}={env[name]}; "
                            f"unset it or set it to {value}")
    missing = [name for name in pins if name not in env]
    loaded = [module for module in READERS if module in sys.modules]
    if missing and loaded:
        raise UserError(f"the plan's numerics ({shown}) must be set before {' and '.join(loaded)} "
                        "loads; set them in the environment that starts Python")
    env.update({name: pins[name] for name in missing})
    return f"numerics: pinned by the plan, {shown}"

