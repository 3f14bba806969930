"""The CPU floor, checked on import before numpy or the engine is loaded (the commands import it
first): on an x86-64 CPU below x86-64-v2 (numpy's baseline: SSSE3, SSE4.1, SSE4.2, POPCNT) the
program exits with one line naming what the CPU lacks instead of dying with an illegal
instruction."""

from __future__ import annotations

import sys

from ._native import missing_cpu_features

_MISSING = missing_cpu_features()
if _MISSING:
    sys.stderr.write(
        f"kazeia: this CPU lacks {', '.join(_MISSING)}: Kazeia TTS needs an x86-64-v2 CPU "
        "(SSE4.2 and POPCNT, Nehalem or later)\n"
    )
    raise SystemExit(1)
