"""The Home Assistant add-on: the keys the add-on store requires, an option schema of valid
types whose defaults it accepts, every option mapped to a server flag the server's own parser
takes, the MQTT service's password handed over in a file, and the discovery sent to the
Supervisor's API (a stand-in of it on 127.0.0.1) once the service answers. script/image-test
builds and runs the add-on's image."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from wyoming_kazeia import __version__
from wyoming_kazeia.__main__ import build_parser
from wyoming_kazeia.settings import QUANT_TYPES, EngineSettings

REPO = Path(__file__).resolve().parents[1]
ADDON = REPO / "addon" / "kazeia_tts"
SCHEMA_TYPE = re.compile(
    r"^(str|bool|email|url|password|port|match\(.+\)|"
    r"int(\((-?\d+)?,(-?\d+)?\))?|float(\(([-\d.]+)?,([-\d.]+)?\))?|list\(([^|()]+\|)*[^|()]+\))"
    r"\??$"
)


def load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((ADDON / name).read_text())
    assert isinstance(data, dict), name
    return data


def accepts(schema: str, value: Any) -> bool:
    """Whether the add-on store's schema type `schema` accepts `value`."""
    optional = schema.endswith("?")
    kind = schema.rstrip("?")
    if value in ("", None):
        return optional
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind.startswith("int"):
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        bounds = re.findall(r"-?\d+", kind)
        return not bounds or int(bounds[0]) <= value <= int(bounds[1])
    if kind.startswith("list("):
        return value in kind[5:-1].split("|")
    return True


def test_config_has_what_the_store_requires() -> None:
    config = load("config.yaml")
    for key in ("name", "version", "slug", "description", "arch", "options", "schema"):
        assert key in config, key
    assert config["version"] == __version__
    assert re.fullmatch(r"[a-z0-9_]+", config["slug"])
    assert {"amd64", "aarch64"} <= set(config["arch"])
    assert "wyoming" in config["discovery"]
    # The HTTP API's port is unmapped unless the user maps it; the page is the ingress panel.
    assert config["ports"] == {"10200/tcp": 10200, "8200/tcp": None}
    assert config["ingress"] is True and config["ingress_port"] == 8200
    assert "mqtt:want" in config["services"]
    assert config["backup_exclude"], "the model folders stay out of backups"
    build = load("build.yaml")
    assert set(config["arch"]) <= set(build["build_from"])
    # The store reads repository.yaml at the repository's root only.
    assert "name" in yaml.safe_load((REPO / "repository.yaml").read_text())
    for name in ("Dockerfile", "run.py", "DOCS.md", "CHANGELOG.md", "translations/en.yaml"):
        assert (ADDON / name).is_file(), name
    for name in ("icon.png", "logo.png"):
        assert (ADDON / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_no_other_file_looks_like_an_add_on_to_the_store() -> None:
    """The store takes every config.json/yaml outside hidden and rootfs folders for an add-on."""
    files = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    looks = [
        f
        for f in files
        if re.fullmatch(r"config\.(json|ya?ml)", Path(f).name)
        and not any(p.startswith(".") or p == "rootfs" for p in Path(f).parts)
    ]
    assert looks == ["addon/kazeia_tts/config.yaml"]


def test_option_schema_is_valid_and_accepts_its_defaults() -> None:
    config = load("config.yaml")
    options, schema = config["options"], config["schema"]
    assert set(options) == set(schema)
    for name, kind in schema.items():
        assert SCHEMA_TYPE.match(kind), (name, kind)
        assert accepts(kind, options[name]), (name, options[name])
    # The add-on offers what the server accepts, from the settings' declared bounds.
    assert schema["quant"] == f"list({'|'.join(QUANT_TYPES)})"
    precisions = EngineSettings.bounds("decoder_precision").choices
    assert schema["decoder_precision"] == f"list({'|'.join(precisions)})"
    cache_types = EngineSettings.bounds("kv_cache_type").choices
    assert schema["kv_cache_type"] == f"list({'|'.join(cache_types)})"
    threads = EngineSettings.bounds("threads")
    assert schema["threads"] == f"int({threads.low:g},{threads.high:g})"
    translated = load("translations/en.yaml")["configuration"]
    assert set(translated) == set(options)


def test_the_add_ons_defaults_are_the_servers() -> None:
    """An option the server also has starts at the server's default."""
    options = load("config.yaml")["options"]
    defaults = EngineSettings()
    for name in (
        "threads",
        "decoder_precision",
        "kv_cache_type",
        "quant",
        "speakable_text",
        "prebuffer",
    ):
        assert options[name] == getattr(defaults, name), name
    assert options["model"] == build_parser().parse_args([]).model


def addon_run() -> ModuleType:
    spec = importlib.util.spec_from_file_location("addon_run", ADDON / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MQTT = {"host": "core-mosquitto", "port": 1883, "username": "addons", "password": "s3cret"}


@pytest.mark.parametrize("name", [o for o in load("config.yaml")["options"] if o != "http_api_key"])
def test_every_option_maps_to_the_server_flag_its_parser_takes(name: str) -> None:
    config = load("config.yaml")
    options = dict(config["options"])
    example = {"model": "/share/model", "quant": "q4_k", "voice": "ryan-fr", "threads": 5,
               "voice_model": "Qwen/Qwen3-TTS-12Hz-0.6B-Base", "debug": True,
               "speakable_text": False, "prebuffer": False,
               "decoder_precision": "bf16", "kv_cache_type": "f32"}  # fmt: skip
    options[name] = example[name]
    flags = addon_run().server_flags(options, None, "/tmp/unused")
    args = build_parser().parse_args(flags)
    # Engine settings are parsed later, from their text.
    assert getattr(args, name) in (example[name], str(example[name]), str(example[name]).lower())
    assert args.uri == "tcp://0.0.0.0:10200" and args.data_dir == Path("/data")
    port = load("config.yaml")["ingress_port"]
    assert args.http_uri == f"tcp://0.0.0.0:{port}"


def test_the_http_api_key_is_a_variable_never_a_flag() -> None:
    options = {**load("config.yaml")["options"], "http_api_key": "k3y"}
    run = addon_run()
    assert "k3y" not in run.server_flags(options, None, "/tmp/unused")
    env = run.server_env(options, {"PATH": "/bin", "SUPERVISOR_TOKEN": "tok"})
    assert env == {"PATH": "/bin", "KZTTS_HTTP_API_KEY": "k3y"}
    assert "KZTTS_HTTP_API_KEY" not in run.server_env(load("config.yaml")["options"], {})


def test_the_mqtt_password_is_a_file_never_a_flag() -> None:
    flags = addon_run().server_flags(load("config.yaml")["options"], MQTT, "/tmp/mqtt-pw")
    args = build_parser().parse_args(flags)
    assert (args.mqtt_host, args.mqtt_port, args.mqtt_username) == (
        "core-mosquitto",
        1883,
        "addons",
    )
    assert args.mqtt_password_file == "/tmp/mqtt-pw" and "s3cret" not in flags


class StandInSupervisor(BaseHTTPRequestHandler):
    """The Supervisor's API as an add-on sees it: /services/mqtt, /discovery."""

    discoveries: list[dict[str, Any]] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        assert self.headers["Authorization"] == "Bearer tok"
        self._answer({"result": "ok", "data": MQTT})

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.discoveries.append({"path": self.path, **body})
        self._answer({"result": "ok", "data": {"uuid": "x"}})

    def _answer(self, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def supervisor() -> Iterator[str]:
    StandInSupervisor.discoveries = []
    http = HTTPServer(("127.0.0.1", 0), StandInSupervisor)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_port}"
    http.shutdown()
    thread.join(10)


def test_discovery_goes_to_the_supervisor_once_the_service_answers(supervisor: str) -> None:
    from wyoming_kazeia.server import serve
    from wyoming_kazeia.service import TtsService

    run = addon_run()
    api = run.Supervisor(supervisor, "tok")
    assert api.mqtt() == MQTT
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    service = TtsService(max_queue=1)
    service.set_loading("downloading Qwen/x: 1%")  # a first start: discovered all the same
    loop = asyncio.new_event_loop()
    task = loop.create_task(serve(service, f"tcp://127.0.0.1:{port}", 1024))

    def serving() -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the end the test gives it
            loop.run_until_complete(task)

    thread = threading.Thread(target=serving, daemon=True)
    alive = subprocess.Popen(["sleep", "60"])  # stands for the server process run.py watches
    try:
        thread.start()
        run.announce_when_ready(api, alive, port)
    finally:
        alive.kill()
        alive.wait()
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
        with contextlib.suppress(Exception):
            loop.close()
        service.shutdown()
    (sent,) = StandInSupervisor.discoveries
    assert sent["path"] == "/discovery" and sent["service"] == "wyoming"
    assert sent["config"]["uri"] == f"tcp://{socket.gethostname()}:{port}"
