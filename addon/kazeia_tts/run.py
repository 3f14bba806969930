"""The add-on's entry point: the Supervisor's options and services -> the server's flags.

    /data/options.json       the options the user set (config.yaml's schema)
    SUPERVISOR_TOKEN         given by the Supervisor: its API at http://supervisor answers with
                             the MQTT service's address and account, and takes the discovery

The server is started with one flag per option; the MQTT password goes to a file only this user
reads (--mqtt-password-file) and the HTTP API key to a variable, never to the command line. The
HTTP API and web page listen on port 8200, the add-on's ingress panel. Once the server answers
`describe`, Home Assistant is told where it is (the Supervisor's discovery of a `wyoming` service at
tcp://HOSTNAME:10200, as the official Wyoming add-ons do). Needs nothing but Python's standard
library and the installed wyoming_kazeia (no bashio).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from wyoming_kazeia.health_check import probe

_LOGGER = logging.getLogger("kazeia-addon")
PORT = 10200
HTTP_PORT = 8200  # config.yaml's ingress_port
OPTIONS = Path("/data/options.json")
SUPERVISOR = "http://supervisor"
DISCOVERY_WAIT_S = 3600.0  # a first start downloads and converts the model meanwhile


def server_env(options: dict[str, Any], env: dict[str, str]) -> dict[str, str]:
    """The server's environment: the add-on's, without the Supervisor's token, with the HTTP
    API key as its variable (never a flag: a command line is visible to every process)."""
    out = {k: v for k, v in env.items() if k != "SUPERVISOR_TOKEN"}
    if options.get("http_api_key"):
        out["KZTTS_HTTP_API_KEY"] = str(options["http_api_key"])
    return out


def server_flags(
    options: dict[str, Any], mqtt: dict[str, Any] | None, password_file: str
) -> list[str]:
    """The server's flags for the add-on's options and the MQTT service (None: none)."""
    flags = ["--uri", f"tcp://0.0.0.0:{PORT}", "--data-dir", "/data"]
    # The web page for the ingress panel, and the HTTP API where the user maps its port.
    flags += ["--http-uri", f"tcp://0.0.0.0:{HTTP_PORT}"]
    flags += ["--model", str(options["model"]), "--quant", str(options["quant"])]
    flags += ["--threads", str(options["threads"])]
    flags += ["--decoder-precision", str(options.get("decoder_precision", "f32"))]
    flags += ["--kv-cache-type", str(options.get("kv_cache_type", "auto"))]
    if options.get("voice"):
        flags += ["--voice", str(options["voice"])]
    if options.get("voice_model"):
        flags += ["--voice-model", str(options["voice_model"])]
    if not options.get("speakable_text", True):
        flags += ["--speakable-text", "false"]
    if not options.get("prebuffer", True):
        flags += ["--prebuffer", "false"]
    if options.get("debug"):
        flags.append("--debug")
    if mqtt:
        flags += ["--mqtt-host", str(mqtt["host"]), "--mqtt-port", str(mqtt["port"])]
        if mqtt.get("username"):
            flags += ["--mqtt-username", str(mqtt["username"])]
        if mqtt.get("password"):
            flags += ["--mqtt-password-file", password_file]
    return flags


class Supervisor:
    """The Supervisor's API, as an add-on with SUPERVISOR_TOKEN reaches it."""

    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url.rstrip("/"), token

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"{}").get("data")

    def mqtt(self) -> dict[str, Any] | None:
        """The MQTT service's address and account, None when Home Assistant has none."""
        try:
            return self._call("GET", "/services/mqtt") or None
        except (OSError, ValueError):  # HTTPError (400: no such service), a reply not JSON
            return None

    def announce(self, uri: str) -> None:
        self._call("POST", "/discovery", {"service": "wyoming", "config": {"uri": uri}})


def announce_when_ready(
    supervisor: Supervisor, server: subprocess.Popen[bytes], port: int = PORT
) -> None:
    """Tells Home Assistant where the service is once it answers describe."""
    deadline = time.monotonic() + DISCOVERY_WAIT_S
    while server.poll() is None and time.monotonic() < deadline:
        # The service is installed as soon as it answers, model or not (see server.build_info).
        info = asyncio.run(probe(f"tcp://127.0.0.1:{port}", 5))
        if info is not None and info.tts and info.tts[0].installed:
            uri = f"tcp://{socket.gethostname()}:{port}"
            try:
                supervisor.announce(uri)
                _LOGGER.info("discovery sent to Home Assistant: wyoming at %s", uri)
            except OSError as err:
                _LOGGER.warning("discovery could not be sent: %s", err)
            return
        time.sleep(1)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
    options = json.loads(OPTIONS.read_text())
    token = os.environ.get("SUPERVISOR_TOKEN")
    supervisor = Supervisor(SUPERVISOR, token or "")
    stop: list[int] = []  # a signal that came before the server was started
    server: subprocess.Popen[bytes] | None = None

    def forward(number: int, _frame: object) -> None:
        if server is None:
            stop.append(number)
        else:
            server.send_signal(number)

    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, forward)
    mqtt = supervisor.mqtt() if token else None
    secret = "/run/kazeia-mqtt-password"
    if mqtt and mqtt.get("password"):
        # mkstemp's file is this user's alone (0600); it lives as long as the container.
        fd, secret = tempfile.mkstemp(prefix="kazeia-mqtt-")
        with os.fdopen(fd, "w") as file:
            file.write(str(mqtt["password"]))
    flags = server_flags(options, mqtt, secret)
    _LOGGER.info("server flags: %s", " ".join(flags))
    if stop:
        return 128 + stop[0]
    env = server_env(options, dict(os.environ))
    server = subprocess.Popen([sys.executable, "-m", "wyoming_kazeia", *flags], env=env)
    if token:
        announce_when_ready(supervisor, server)
    else:
        _LOGGER.info("no SUPERVISOR_TOKEN: not run by the Supervisor, no discovery sent")
    code = server.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
