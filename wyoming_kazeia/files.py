"""Reading files that a user may have replaced by something else: a FIFO, a socket or a device
where a model, tokenizer or voice file belongs would block a read with no deadline (a FIFO's
open waits for a writer), so only regular files are opened."""

from __future__ import annotations

import stat
from pathlib import Path


def check_regular(path: Path) -> Path:
    """`path` (links followed), or OSError (FileNotFoundError when absent) unless it is a
    regular file."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a directory" if stat.S_ISDIR(mode) else None
        raise OSError(f"{path} is not a regular file" + (f" ({kind})" if kind else ""))
    return path


def read_text(path: Path) -> str:
    """The UTF-8 text of regular file `path` (OSError otherwise)."""
    return check_regular(path).read_text(encoding="utf-8")
