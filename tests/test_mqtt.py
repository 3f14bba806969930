"""The MQTT bridge against a real mosquitto broker, with the real engine on a tiny random model.

Each test gets its own broker (no persistence, so a restarted broker has forgotten every
retained message and the bridge must publish them again) and watches it like Home Assistant
does, through its own aiomqtt client.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from conftest import REFERENCE, ref_array

from wyoming_kazeia.convert import convert
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.mqtt import MqttBridge, MqttConfig, add_mqtt_arguments
from wyoming_kazeia.service import TtsService
from wyoming_kazeia.settings import EngineSettings, SettingsError
from wyoming_kazeia.voices import recording
from wyoming_kazeia.voices.library import VoiceLibrary

MOSQUITTO = Path("/usr/sbin/mosquitto")
TEXT = "Hello there, this is a small test of the bridge."
SETTINGS = EngineSettings(max_frames=40, seed=11)  # stream_chunk 4: 1 + ceil(39 / 4) = 11 chunks
NODE = "kazeia_tts"
ENTITIES = {
    ("select", "default_voice"),
    ("select", "threads"),
    ("select", "backend"),
    ("select", "decoder_precision"),
    ("select", "kv_cache_type"),
    ("number", "stream_chunk"),
    ("number", "temperature"),
    ("switch", "speakable_text"),
    ("switch", "prebuffer"),
    ("sensor", "ttfa"),
    ("sensor", "rtf"),
    ("sensor", "audio_seconds"),
    ("sensor", "served"),
    ("sensor", "queue_depth"),
    ("sensor", "engine_state"),
}


class Broker:
    """A mosquitto on a free loopback port; stop() and start() keep the port."""

    def __init__(self, directory: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.config = directory / "mosquitto.conf"
        self.config.write_text(
            f"listener {self.port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
        )
        self.log = directory / "mosquitto.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [str(MOSQUITTO), "-c", str(self.config)], stdout=log, stderr=log
            )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"mosquitto exited: {self.log.read_text()}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2),
            ):
                return
            time.sleep(0.02)
        pytest.fail("mosquitto did not open its port")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    if not MOSQUITTO.is_file():
        pytest.fail("mosquitto is not installed: run script/setup")
    b = Broker(tmp_path)
    b.start()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def engine(tiny_model: Path) -> Engine:
    return Engine(tiny_model, SETTINGS)


@pytest.fixture
def service(engine: Engine) -> Iterator[TtsService]:
    engine.apply_settings(SETTINGS)  # undo what an earlier test changed through MQTT
    s = TtsService(engine)
    yield s
    s.shutdown()


def run(scenario: Coroutine[Any, Any, None]) -> None:
    asyncio.run(asyncio.wait_for(scenario, 60))


async def until(predicate: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


class Watcher:
    """Home Assistant's view of the broker: every message of every topic, in order."""

    def __init__(self, client: aiomqtt.Client) -> None:
        self.client = client
        self.history: dict[str, list[aiomqtt.Message]] = {}

    def last(self, topic: str) -> str | None:
        messages = self.history.get(topic)
        return messages[-1].payload.decode() if messages else None

    def count(self, topic: str) -> int:
        return len(self.history.get(topic, []))

    async def collect(self) -> None:
        async for message in self.client.messages:
            self.history.setdefault(str(message.topic), []).append(message)


@contextlib.asynccontextmanager
async def watching(broker: Broker) -> AsyncIterator[Watcher]:
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        watcher = Watcher(client)
        await client.subscribe("#")
        task = asyncio.create_task(watcher.collect())
        try:
            yield watcher
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiomqtt.MqttError):
                await task


@contextlib.asynccontextmanager
async def bridging(service: TtsService, broker: Broker) -> AsyncIterator[MqttBridge]:
    config = MqttConfig("127.0.0.1", broker.port, reconnect_min_s=0.05, reconnect_max_s=0.2)
    bridge = MqttBridge(service, config)
    task = asyncio.create_task(bridge.run())
    try:
        yield bridge
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled()  # run() never ends on its own


async def synthesize(service: TtsService) -> list[bytes]:
    async with contextlib.aclosing(service.queue_text(TEXT)) as audio:
        return [pcm async for pcm in audio]


def state(watcher: Watcher, key: str) -> str | None:
    return watcher.last(f"{NODE}/{key}/state")


def online(watcher: Watcher) -> bool:
    return watcher.last(f"{NODE}/availability") == "online"


def discovered(watcher: Watcher) -> bool:
    return all(watcher.count(f"homeassistant/{c}/{NODE}/{k}/config") for c, k in ENTITIES)


def every_state(watcher: Watcher) -> bool:
    return all(state(watcher, key) is not None for _, key in ENTITIES)


def retries(caplog: pytest.LogCaptureFixture) -> int:
    return sum("retrying" in r.getMessage() for r in caplog.records)


def test_discovery_and_retained_states(service: TtsService, broker: Broker) -> None:
    async def scenario() -> None:
        async with bridging(service, broker):
            async with watching(broker) as live:
                await until(lambda: online(live) and state(live, "engine_state"))
            # A client that subscribes now gets only what the broker retained.
            async with watching(broker) as late:
                # Retained messages come in the broker's order, not in publication order.
                await until(lambda: discovered(late) and every_state(late))
        async with watching(broker) as after:  # a clean shutdown says offline itself
            await until(lambda: after.last(f"{NODE}/availability") == "offline")

        configs = {t: m for t, m in late.history.items() if t.startswith("homeassistant/")}
        assert len(configs) == len(ENTITIES)
        unique_ids = set()
        for component, key in sorted(ENTITIES):
            (message,) = configs[f"homeassistant/{component}/{NODE}/{key}/config"]
            assert message.retain
            payload = json.loads(message.payload)
            assert "object_id" not in payload
            assert payload["default_entity_id"] == f"{component}.kazeia_tts_{key}"
            assert payload["unique_id"] == f"{NODE}_{key}"
            unique_ids.add(payload["unique_id"])
            assert payload["name"]
            assert payload["availability_topic"] == f"{NODE}/availability"
            assert payload["state_topic"] == f"{NODE}/{key}/state"
            device = payload["device"]
            assert device["identifiers"] == [NODE] and device["name"] == "Kazeia TTS"
            assert device["manufacturer"] and device["model"] and device["sw_version"]
            (state_message,) = late.history[payload["state_topic"]]
            assert state_message.retain
            value = state_message.payload.decode()
            if component == "sensor":
                assert "command_topic" not in payload
            else:
                assert payload["command_topic"] == f"{NODE}/{key}/set"
            if component == "select" or payload.get("device_class") == "enum":
                assert value in payload["options"]
            elif component == "number":
                assert payload["min"] <= float(value) <= payload["max"]
            elif component == "switch":  # Home Assistant's default payloads
                assert value in ("ON", "OFF") and "payload_on" not in payload
            else:  # nothing synthesized yet: Home Assistant's "unknown"
                assert value in ("None", "0")
        assert len(unique_ids) == len(ENTITIES)

        by_key = {t.split("/")[3]: json.loads(m[0].payload) for t, m in configs.items()}
        assert by_key["default_voice"]["options"] == [v.name for v in service.voices.voices]
        assert by_key["stream_chunk"]["min"] == 0 and by_key["stream_chunk"]["max"] == 64
        # Every count up to twice the cores, the default among them on a 2-core box.
        counts = {str(n) for n in range(1, min(64, 2 * (os.cpu_count() or 4)) + 1)}
        assert counts <= set(by_key["threads"]["options"])
        assert by_key["ttfa"]["device_class"] == "duration"
        assert by_key["ttfa"]["unit_of_measurement"] == "s"
        assert by_key["served"]["state_class"] == "total_increasing"
        assert late.last(f"{NODE}/default_voice/state") == service.default_voice
        assert late.last(f"{NODE}/temperature/state") == "0.9"  # the model's own when unset
        assert late.last(f"{NODE}/speakable_text/state") == "ON"

    run(scenario())


def test_a_voice_added_to_the_library_becomes_a_voice_option(
    broker: Broker, tmp_path: Path
) -> None:
    """The default-voice select's options follow the voices, without a restart."""
    base = tmp_path / "base"
    convert(REFERENCE / "tiny-base-0.6b" / "model", base, "f32")
    library = VoiceLibrary(tmp_path / "data")
    clip = recording.check(ref_array("tiny-base-0.6b", "ref_audio"), 24000, "test clip")
    library.add_clone("grandma", clip)
    service = TtsService(Engine(base, SETTINGS), library=library)
    topic = f"homeassistant/select/{NODE}/default_voice/config"

    def options(watcher: Watcher) -> list[str]:
        payload = watcher.last(topic)
        return json.loads(payload)["options"] if payload else []

    async def scenario() -> None:
        async with bridging(service, broker), watching(broker) as live:
            await until(lambda: "grandma" in options(live))
            assert "mom" not in options(live)
            assert state(live, "default_voice") in (None, "grandma")
            library.add_clone("mom", clip)
            assert await service.refresh_voices()  # what the server's watch does every few seconds
            await until(lambda: "mom" in options(live))
            library.remove("grandma")
            await service.refresh_voices()
            await until(lambda: "grandma" not in options(live))
            await until(lambda: state(live, "default_voice") == "mom")

    try:
        run(scenario())
    finally:
        service.shutdown()


LAST_WILL_BRIDGE = """
import asyncio, sys
from wyoming_kazeia.engine import Engine
from wyoming_kazeia.mqtt import MqttBridge, MqttConfig
from wyoming_kazeia.service import TtsService

async def main() -> None:
    service = TtsService(Engine(sys.argv[1]))
    await MqttBridge(service, MqttConfig("127.0.0.1", int(sys.argv[2]))).run()

asyncio.run(main())
"""


def test_last_will_says_offline_when_the_bridge_dies(tiny_model: Path, broker: Broker) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", LAST_WILL_BRIDGE, str(tiny_model), str(broker.port)]
    )

    async def scenario() -> None:
        async with watching(broker) as watcher:
            await until(lambda: online(watcher) and discovered(watcher), timeout=30)
            proc.send_signal(signal.SIGKILL)  # no goodbye: only the broker can tell
            await until(lambda: watcher.last(f"{NODE}/availability") == "offline")

    try:
        run(scenario())
    finally:
        proc.kill()
        proc.wait()


def test_commands_apply_to_the_next_synthesis(service: TtsService, broker: Broker) -> None:
    async def scenario() -> None:
        async with bridging(service, broker), watching(broker) as ha:
            await until(lambda: online(ha) and state(ha, "served") == "0")
            assert len(await synthesize(service)) == 11
            # The service counts a synthesis served, then goes idle: two notifications.
            await until(lambda: state(ha, "served") == "1" and state(ha, "engine_state") == "idle")
            assert float(state(ha, "rtf") or 0) > 0 and float(state(ha, "ttfa") or 0) > 0
            assert float(state(ha, "audio_seconds") or 0) == pytest.approx(3.2)
            assert state(ha, "queue_depth") == "0"

            for key, payload, expected in [
                ("stream_chunk", "8", "8"),
                ("temperature", "0.5", "0.5"),
                ("threads", "1", "1"),
                ("backend", "auto", "auto"),
                ("backend", "cpu", "cpu"),
                ("decoder_precision", "bf16", "bf16"),
                ("kv_cache_type", "f16", "f16"),
                ("default_voice", "serena-en", "serena-en"),
                ("speakable_text", "OFF", "OFF"),
                ("prebuffer", "OFF", "OFF"),
            ]:
                await ha.client.publish(f"{NODE}/{key}/set", payload)
                await until(lambda k=key, e=expected: state(ha, k) == e)  # type: ignore[misc]
            assert service.settings.stream_chunk == 8
            assert service.settings.temperature == 0.5 and service.settings.threads == 1
            assert service.default_voice == "serena-en" and not service.settings.speakable_text
            assert not service.settings.prebuffer

            # Nothing restarted: the next synthesis runs with the new settings.
            chunks = await synthesize(service)
            assert len(chunks) == 1 + math.ceil(39 / 8) == service.status.last.n_chunks
            assert service.engine.generator.threads == 1
            assert service.engine.decoder.precision == "bf16"
            assert service.engine.generator.kv_cache_type == "f16"
            await until(lambda: state(ha, "served") == "2")

            # Home Assistant restarted: discovery is published again.
            before = ha.count(f"homeassistant/sensor/{NODE}/rtf/config")
            await ha.client.publish("homeassistant/status", "online")
            await until(lambda: ha.count(f"homeassistant/sensor/{NODE}/rtf/config") > before)

    run(scenario())


def test_bad_commands_are_rejected_and_the_state_republished(
    service: TtsService, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="wyoming_kazeia.mqtt")
    settings, voice = service.settings, service.default_voice

    async def scenario() -> None:
        async with bridging(service, broker), watching(broker) as ha:
            await until(lambda: online(ha) and discovered(ha) and state(ha, "engine_state"))
            for key, payload in [
                ("stream_chunk", "abc"),
                ("stream_chunk", "65"),
                ("stream_chunk", "-1"),
                ("stream_chunk", "2.5"),
                ("temperature", "0"),
                ("temperature", "nan"),
                ("temperature", "5"),
                ("threads", "0"),
                ("threads", "999"),
                ("backend", "gpu"),
                ("backend", "cuda:7"),
                ("decoder_precision", "f16"),
                ("kv_cache_type", "bf16"),
                ("speakable_text", "on"),
                ("prebuffer", "yes"),
                ("default_voice", "nobody"),
                ("default_voice", ""),
                ("default_voice", "x" * (1 << 20)),  # a megabyte: a few lines of log at most
            ]:
                topic = f"{NODE}/{key}/state"
                before, count = ha.last(topic), ha.count(topic)
                await ha.client.publish(f"{NODE}/{key}/set", payload)
                await until(lambda t=topic, c=count: ha.count(t) > c)  # type: ignore[misc]
                assert ha.last(topic) == before, (key, payload)
                rejected = f"rejected {key} = {payload[:80]!r}"
                assert any(rejected[:-1] in r.getMessage() for r in caplog.records)
            assert max(len(r.getMessage()) for r in caplog.records) < 1000

    run(scenario())
    assert service.settings == settings and service.default_voice == voice


def test_broker_down_at_start(
    service: TtsService, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wyoming_kazeia.mqtt")
    broker.stop()

    async def scenario() -> None:
        async with bridging(service, broker):
            await until(lambda: retries(caplog) >= 3)
            assert len(await synthesize(service)) == 11  # the service does not wait for MQTT
            broker.start()
            async with watching(broker) as ha:
                await until(lambda: online(ha) and discovered(ha) and state(ha, "served") == "1")

    run(scenario())


def test_broker_restart_reconnects_and_republishes(
    service: TtsService, broker: Broker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="wyoming_kazeia.mqtt")

    async def scenario() -> None:
        async with bridging(service, broker):
            async with watching(broker) as ha:
                await until(lambda: online(ha) and state(ha, "served") == "0")
            broker.stop()
            await until(lambda: retries(caplog) >= 2)
            for _ in range(2):
                assert len(await synthesize(service)) == 11
            # Set while the broker is away: published once it is back.
            service.update_settings(stream_chunk=6)
            broker.start()  # without persistence: it remembers nothing
            async with watching(broker) as ha:
                # Every state, the unchanged ones too, and those that changed meanwhile.
                await until(lambda: online(ha) and discovered(ha) and every_state(ha))
                assert state(ha, "served") == "2" and state(ha, "stream_chunk") == "6"

    run(scenario())


def parse(*argv: str) -> MqttConfig | None:
    parser = argparse.ArgumentParser()
    add_mqtt_arguments(parser)
    return MqttConfig.from_args(parser.parse_args(argv))


def test_config_from_arguments_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert parse() is None  # no host: no bridge
    assert parse("--mqtt-host", "broker") == MqttConfig("broker")

    secret = tmp_path / "password"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("KZTTS_MQTT_HOST", "ha.local")
    monkeypatch.setenv("KZTTS_MQTT_USERNAME", "tts")
    monkeypatch.setenv("KZTTS_MQTT_PASSWORD_FILE", str(secret))
    monkeypatch.setenv("KZTTS_MQTT_TLS", "true")
    monkeypatch.setenv("KZTTS_MQTT_NODE_ID", "kitchen-tts")
    monkeypatch.setenv("KZTTS_MQTT_DISCOVERY_PREFIX", "ha")
    config = parse()
    assert config == MqttConfig(
        "ha.local",
        8883,  # the TLS port unless one is given
        username="tts",
        password="s3cret",
        tls=True,
        discovery_prefix="ha",
        node_id="kitchen-tts",
    )
    assert parse("--mqtt-port", "1884", "--no-mqtt-tls") == MqttConfig(
        "ha.local", 1884, "tts", "s3cret", discovery_prefix="ha", node_id="kitchen-tts"
    )
    monkeypatch.setenv("KZTTS_MQTT_PASSWORD", "other")
    with pytest.raises(SettingsError, match="not both"):
        parse()
    monkeypatch.delenv("KZTTS_MQTT_PASSWORD")
    with pytest.raises(SettingsError, match="password file"):
        parse("--mqtt-password-file", str(tmp_path / "missing"))
    with pytest.raises(SettingsError, match="node id"):
        parse("--mqtt-node-id", "a/b")
