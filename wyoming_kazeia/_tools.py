"""Console entry points for the native tools shipped inside the package."""

from __future__ import annotations

import os
import sys

from .native import tool_path


def _exec(name: str) -> None:
    """Exec the native binary `name` with this process's arguments."""
    exe = tool_path(name)
    if not exe.is_file():
        sys.exit(f"{name}: native binary missing at {exe}; reinstall the package")
    os.execv(exe, [str(exe), *sys.argv[1:]])


def kazeia_decoder() -> None:
    """`kazeia-decoder`: codes -> WAV."""
    _exec("kazeia-decoder")


def kazeia_generate() -> None:
    """`kazeia-generate`: tokenized prompt -> codes."""
    _exec("kazeia-generate")
