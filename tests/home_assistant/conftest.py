"""The real Home Assistant against our server: its test harness (`hass`), its wyoming
integration and its TTS manager, run by script/test-ha in the environment of script/ha-env.

Our server runs on the host, from the repository's .venv: the host's root is bound at
KAZEIA_HOST_ROOT, and a server is started by chrooting there. Files the server reads (models,
the voice library) are made on the host too, in a folder of the host's /tmp; `HostFolder`
gives both names of a path. Both sides meet on 127.0.0.1.
"""

from __future__ import annotations

# Home Assistant first: 2026.11 aliases modules (httpx) when imported, and the harness's
# common.py still imports a helper from where 2026.11 no longer has it.
import homeassistant.components.logger as _logger  # isort: skip
from homeassistant.components.logger import helpers as _logger_helpers  # isort: skip

if not hasattr(_logger, "_clear_logger_overwrites"):
    _logger._clear_logger_overwrites = _logger_helpers._clear_logger_overwrites

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest_plugins = ["pytest_homeassistant_custom_component.plugins"]

HOST_ROOT = Path(os.environ.get("KAZEIA_HOST_ROOT", "/host"))
REPO = os.environ.get("KAZEIA_REPO", "")
SERVER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"}


def on_host(*cmd: str, env: dict[str, str] | None = None) -> list[str]:
    """A command line that runs `cmd` on the host, with a clean environment."""
    extra = [f"{k}={v}" for k, v in (env or {}).items()]
    base = [f"{k}={v}" for k, v in SERVER_ENV.items()]
    return ["chroot", str(HOST_ROOT), "/usr/bin/env", "-i", *base, *extra, *cmd]


def run_on_host(*cmd: str, timeout: float = 300) -> str:
    result = subprocess.run(
        on_host(*cmd), capture_output=True, text=True, timeout=timeout, check=False
    )
    assert result.returncode == 0, f"{cmd} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


@dataclass(frozen=True)
class HostFolder:
    """A folder of the host: `host` is its path there (what the server is given), `here` the
    same folder seen from this environment."""

    host: str

    @property
    def here(self) -> Path:
        return HOST_ROOT / self.host.lstrip("/")

    def child(self, name: str) -> HostFolder:
        return HostFolder(f"{self.host}/{name}")


@pytest.fixture(scope="session")
def host_tmp() -> Iterator[HostFolder]:
    if not REPO or not os.path.lexists(HOST_ROOT / REPO.lstrip("/") / ".venv/bin/python"):
        pytest.fail("run these tests with script/test-ha (KAZEIA_REPO names the repository)")
    folder = HostFolder(run_on_host("mktemp", "-d", "/tmp/kazeia-ha.XXXXXX").strip())
    yield folder
    shutil.rmtree(folder.here, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny_checkpoint(host_tmp: HostFolder) -> HostFolder:
    """A tiny random-weight CustomVoice checkpoint of the 1.7B kind (it takes instructions) in
    the Hugging Face layout, made by the project's script."""
    out = host_tmp.child("ckpt")
    run_on_host(f"{REPO}/script/random-checkpoint", out.host, "--size", "tiny-1.7b", "-q")
    return out


@pytest.fixture(scope="session")
def tiny_model(host_tmp: HostFolder, tiny_checkpoint: HostFolder) -> HostFolder:
    """That checkpoint converted (what a warm start loads)."""
    out = host_tmp.child("model")
    run_on_host(
        f"{REPO}/.venv/bin/python",
        "-m",
        "wyoming_kazeia.convert",
        tiny_checkpoint.host,
        out.host,
        "--type",
        "f32",
    )
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Kazeia:
    """One of our servers, on the host."""

    model: str
    data_dir: HostFolder
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    _log_start: int = 0  # where this run's lines begin in the log

    def start(self) -> Kazeia:
        cmd = on_host(
            f"{REPO}/.venv/bin/python", "-m", "wyoming_kazeia",
            "--uri", f"tcp://127.0.0.1:{self.port}", "--model", self.model,
            "--data-dir", self.data_dir.host, "--max-frames", "8", "--seed", "1", "--debug",
            *self.args, env=self.env,
        )  # fmt: skip
        self.log = self.data_dir.here.with_suffix(f".{self.port}.log")
        self._log_start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        return self

    def log_text(self) -> str:
        """What this run of the server logged."""
        if self.log is None:
            return ""
        with self.log.open("rb") as log:
            log.seek(self._log_start)
            return log.read().decode(errors="replace")

    async def listening(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc is not None and self.proc.poll() is None, self.log_text()
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.close()
                await writer.wait_closed()
                return
            except OSError:
                assert time.monotonic() < deadline, f"not listening:\n{self.log_text()}"
                await asyncio.sleep(0.05)

    async def ready(self, timeout: float = 120) -> None:
        """Until the server says it is ready (its log line: describe may say so earlier)."""
        deadline = time.monotonic() + timeout
        while " ready in " not in self.log_text():
            assert self.proc is not None and self.proc.poll() is None, self.log_text()
            assert time.monotonic() < deadline, f"not ready:\n{self.log_text()}"
            await asyncio.sleep(0.05)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
async def kazeia(
    host_tmp: HostFolder, tiny_model: HostFolder, request: pytest.FixtureRequest
) -> AsyncIterator[list[Kazeia]]:
    """Started servers, stopped at the end of the test (`servers.append(Kazeia(...).start())`)."""
    servers: list[Kazeia] = []
    yield servers
    for server in servers:
        server.stop()
