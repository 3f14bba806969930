"""Console entry points for the native tools shipped inside the package."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from . import _native


def tool_path(name: str) -> Path:
    """Path of a native tool installed beside the extension module."""
    return Path(_native.__file__).resolve().parent / "bin" / name


def kazeia_decoder() -> None:
    """`kazeia-decoder`: exec the native binary with the same arguments."""
    exe = tool_path("kazeia-decoder")
    if not exe.is_file():
        sys.exit(f"kazeia-decoder: native binary missing at {exe}; reinstall the package")
    os.execv(exe, [str(exe), *sys.argv[1:]])
