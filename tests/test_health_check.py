"""The health check's answer: one line on stdout and an exit status, whatever goes wrong."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("uri", ["tcp://127.0.0.1", "udp://127.0.0.1:10200"])
def test_a_uri_the_health_check_cannot_reach_is_one_line_and_status_1(uri: str) -> None:
    """A KazeiaError (here the SettingsError of a URI without a port or of another scheme) is
    its one line, never a traceback."""
    done = subprocess.run(
        [sys.executable, "-m", "wyoming_kazeia.health_check", "--uri", uri],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr == ""
    assert done.stdout.startswith(f"unhealthy: {uri}: invalid --uri (")
    assert done.stdout.count("\n") == 1
