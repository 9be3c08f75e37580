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

#: An environment variable's name, as a plan may spell one.
NAME = re.compile(r"[A-Z][A-Z0-9_]*")
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

