"""Console entry points for the native tools shipped inside the package."""

from __future__ import annotations

import os
import sys

from .native import tool_path


def kazeia_decoder() -> None:
    """`kazeia-decoder`: exec the native binary with the same arguments."""
    exe = tool_path("kazeia-decoder")
    if not exe.is_file():
        sys.exit(f"kazeia-decoder: native binary missing at {exe}; reinstall the package")
    os.execv(exe, [str(exe), *sys.argv[1:]])
