"""Home Assistant MQTT bridge: the TTS service as a device with knobs and sensors (topics,
entities and retries: MqttBridge's docstring).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import aiomqtt

from . import __version__
from .native import compute_devices
from .service import TtsService
from .settings import EngineSettings, SettingsError, add_env_argument

_LOGGER = logging.getLogger(__name__)

_LOGGED_CHARS = 80  # of a rejected command's payload
_NODE_ID = re.compile(r"^[A-Za-z0-9_-]+$")  # what a discovery topic level allows


@dataclass(frozen=True)
class MqttConfig:
    host: str
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)  # never in a log line
    tls: bool = False
    ca_file: str | None = None  # a private CA (e.g. a self-signed broker); None: system CAs
    discovery_prefix: str = "homeassistant"
    node_id: str = "kazeia_tts"
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 60.0

    def __post_init__(self) -> None:
        if not _NODE_ID.match(self.node_id):
            raise SettingsError(f"invalid MQTT node id {self.node_id!r}: letters, digits, _ and -")
        if not self.discovery_prefix or any(c in self.discovery_prefix for c in "#+"):
            raise SettingsError(f"invalid MQTT discovery prefix {self.discovery_prefix!r}")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MqttConfig | None:
        """The bridge's configuration, or None when no broker host is given. SettingsError
        for an unreadable password file or an invalid option."""
        if not args.mqtt_host:
            return None
        password = args.mqtt_password or None
        if args.mqtt_password_file:
            if password is not None:
                raise SettingsError("give an MQTT password or a password file, not both")
            try:
                with open(args.mqtt_password_file, encoding="utf-8") as f:
                    password = f.read().rstrip("\r\n")
            except OSError as err:
                raise SettingsError(f"cannot read the MQTT password file: {err}") from None
        tls = bool(args.mqtt_tls or args.mqtt_ca_file)
        return cls(
            host=args.mqtt_host,
            port=args.mqtt_port or (8883 if tls else 1883),
            username=args.mqtt_username or None,
            password=password,
            tls=tls,
            ca_file=args.mqtt_ca_file or None,
            discovery_prefix=args.mqtt_discovery_prefix,
            node_id=args.mqtt_node_id,
        )


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def add_mqtt_arguments(parser: argparse.ArgumentParser) -> None:
    """The bridge's options; each defaults to its KZTTS_MQTT_* environment variable."""
    group = parser.add_argument_group("Home Assistant MQTT bridge (enabled by --mqtt-host)")
    add = partial(add_env_argument, group)
    add("--mqtt-host", "KZTTS_MQTT_HOST", "broker host", metavar="HOST")
    add(
        "--mqtt-port",
        "KZTTS_MQTT_PORT",
        "broker port (default 1883, 8883 with TLS)",
        metavar="PORT",
        type=int,
    )
    add("--mqtt-username", "KZTTS_MQTT_USERNAME", "broker user", metavar="NAME")
    add(
        "--mqtt-password",
        "KZTTS_MQTT_PASSWORD",
        "broker password; a command line is visible to other users: prefer the password file",
        metavar="PASSWORD",
    )
    add(
        "--mqtt-password-file",
        "KZTTS_MQTT_PASSWORD_FILE",
        "file holding the password",
        metavar="FILE",
    )
    group.add_argument(
        "--mqtt-tls",
        action=argparse.BooleanOptionalAction,
        default=_env_flag("KZTTS_MQTT_TLS"),
        help="connect with TLS, verifying the broker (KZTTS_MQTT_TLS=1)",
    )
    add(
        "--mqtt-ca-file",
        "KZTTS_MQTT_CA_FILE",
        "CA certificate of the broker; implies --mqtt-tls",
        metavar="FILE",
    )
    add(
        "--mqtt-discovery-prefix",
        "KZTTS_MQTT_DISCOVERY_PREFIX",
        "Home Assistant discovery prefix",
        "homeassistant",
        metavar="PREFIX",
    )
    add(
        "--mqtt-node-id",
        "KZTTS_MQTT_NODE_ID",
        "id of this service in topics and entity ids; give each instance its own",
        "kazeia_tts",
        metavar="ID",
    )


@dataclass
class _Entity:
    component: str  # "select", "number", "switch" or "sensor"
    key: str
    name: str
    state: Callable[[], str]
    # Parses and applies a command payload; raises ValueError (SettingsError, VoiceError)
    # for a bad one. None: read-only.
    command: Callable[[str], None] | None = None
    discovery: dict[str, Any] = field(default_factory=dict)  # component-specific keys


def _switch(text: str) -> bool:
    # Home Assistant's MQTT switch sends its payload_on and payload_off: ON and OFF.
    if text not in ("ON", "OFF"):
        raise ValueError(f"not ON or OFF: {text!r}")
    return text == "ON"


def _integer(text: str) -> int:
    # Home Assistant may send a whole number as "4.0".
    value = float(text)
    if not value.is_integer():
        raise ValueError(f"not an integer: {text!r}")
    return int(value)


class MqttBridge:
    """The bridge of one service to one broker.

        config = MqttConfig.from_args(args)          # None when no --mqtt-host / KZTTS_MQTT_HOST
        if config is not None:
            asyncio.create_task(MqttBridge(service, config).run())

    One device ("Kazeia TTS") is announced through MQTT discovery:

        <prefix>/<component>/<node_id>/<key>/config   discovery payload (retained)
        <node_id>/<key>/state                         current value (retained)
        <node_id>/<key>/set                           command from Home Assistant (not sensors)
        <node_id>/availability                        online / offline (retained; the last will)
        <prefix>/status                               Home Assistant's "online": discovery again

    Entities: select default_voice, threads, backend (the compute device of the talker and
    code predictor, unless their own settings say), decoder_precision and kv_cache_type; number
    stream_chunk and temperature (an unset temperature shows the model's own value); switches
    speakable_text and prebuffer; sensors ttfa, rtf, audio_seconds (of the last synthesis;
    "None", i.e. unknown, before the first), served, queue_depth and engine_state.

    A command is validated by the service; a bad one is logged and the current state is published
    again (so Home Assistant shows what is really in use). A good one applies from the next
    synthesis on, threads included (the engine reloads its generator between syntheses).

    The TTS service never waits for the broker: the bridge runs beside it and, when the broker is
    unreachable or lost, retries with exponential backoff; each new connection publishes discovery
    and every state again (a broker without persistence has forgotten them).
    """

    def __init__(self, service: TtsService, config: MqttConfig) -> None:
        self.service = service
        self.config = config
        self.base = config.node_id
        self.availability_topic = f"{self.base}/availability"
        self.ha_status_topic = f"{config.discovery_prefix}/status"
        self._slug = re.sub(r"[^a-z0-9_]", "_", config.node_id.lower())
        self._tls = ssl.create_default_context(cafile=config.ca_file) if config.tls else None
        # Unset temperature means the model's own; Home Assistant is shown that value.
        self._model_temperature = float(service.model_default("temperature"))
        # Up to twice the cores: the generator's spare threads keep its share of busy cores
        # (the default is twice a 2-core box's), more only add waits. The current count is
        # always an option so that Home Assistant can show it.
        threads = EngineSettings.bounds("threads")
        low, high = int(threads.low or 1), int(threads.high or 1)
        max_threads = min(high, 2 * (os.cpu_count() or 4))
        self._thread_options = [
            str(n) for n in sorted(set(range(low, max_threads + 1)) | {service.settings.threads})
        ]
        # The compute devices this build sees here (listed once: the GPU libraries load then),
        # "auto", and the current setting, so that Home Assistant can show it.
        self._backend_options = list(
            dict.fromkeys(
                ["cpu", "auto", *(d["id"] for d in compute_devices()), service.settings.backend]
            )
        )
        self._build_entities()
        self._sent: dict[str, str] = {}  # state topic -> payload, for this connection
        self._changed = asyncio.Event()
        self._stopping = False
        service.add_listener(self._changed.set)  # never blocks: the publisher task waits

    # -- entities --------------------------------------------------------------------------

    def _build_entities(self) -> None:
        # What `describe` answers (the voices) is part of the discovery payloads.
        self._revision = self.service.revision
        self.entities = {e.key: e for e in self._entities()}
        self._by_command_topic = {
            self.command_topic(e): e for e in self.entities.values() if e.command
        }

    def _entities(self) -> list[_Entity]:
        service = self.service
        chunk_min, chunk_max, chunk_step = EngineSettings.bounds("stream_chunk").entity_range()
        temp_min, temp_max, temp_step = EngineSettings.bounds("temperature").entity_range()

        def last(fmt: str, attr: str) -> Callable[[], str]:
            # "None" is Home Assistant's "unknown": nothing synthesized yet.
            return lambda: (
                format(getattr(service.status.last, attr), fmt) if service.status.served else "None"
            )

        def setting_switch(key: str, name: str, icon: str) -> _Entity:
            """A switch of a boolean engine setting."""
            return _Entity(
                "switch",
                key,
                name,
                lambda: "ON" if getattr(service.settings, key) else "OFF",
                lambda text: self._set(**{key: _switch(text)}),
                {"entity_category": "config", "icon": icon},
            )

        def setting_select(key: str, name: str, icon: str) -> _Entity:
            """A select of an engine setting with declared choices."""
            return _Entity(
                "select",
                key,
                name,
                lambda: str(getattr(service.settings, key)),
                lambda text: self._set(**{key: text}),
                {
                    "options": list(EngineSettings.bounds(key).choices),
                    "entity_category": "config",
                    "icon": icon,
                },
            )

        diagnostic = {"entity_category": "diagnostic"}
        return [
            _Entity(
                "select",
                "default_voice",
                "Default voice",
                lambda: service.default_voice,
                service.set_default_voice,
                {"options": [v.name for v in service.voices.voices], "icon": "mdi:account-voice"},
            ),
            _Entity(
                "select",
                "threads",
                "Threads",
                lambda: str(service.settings.threads),
                self._set_threads,
                {
                    "options": self._thread_options,
                    "entity_category": "config",
                    "icon": "mdi:cpu-64-bit",
                },
            ),
            _Entity(
                "select",
                "backend",
                "Compute device",
                lambda: service.settings.backend,
                lambda text: self._set(backend=text),
                {
                    "options": self._backend_options,
                    "entity_category": "config",
                    "icon": "mdi:expansion-card",
                },
            ),
            setting_select("decoder_precision", "Decoder precision", "mdi:chip"),
            setting_select("kv_cache_type", "K/V cache type", "mdi:memory"),
            _Entity(
                "number",
                "stream_chunk",
                "Stream chunk",
                lambda: str(service.settings.stream_chunk),
                lambda text: self._set(stream_chunk=_integer(text)),
                {
                    "min": int(chunk_min),
                    "max": int(chunk_max),
                    "step": int(chunk_step),
                    "mode": "box",
                    "unit_of_measurement": "frames",
                    "entity_category": "config",
                    "icon": "mdi:waveform",
                },
            ),
            setting_switch("speakable_text", "Speakable text", "mdi:format-clear"),
            setting_switch("prebuffer", "Prebuffer slow answers", "mdi:timer-sand"),
            _Entity(
                "number",
                "temperature",
                "Temperature",
                self._temperature_state,
                self._set_temperature,
                {
                    "min": temp_min,
                    "max": temp_max,
                    "step": temp_step,
                    "mode": "box",
                    "entity_category": "config",
                    "icon": "mdi:thermometer",
                },
            ),
            _Entity(
                "sensor",
                "ttfa",
                "Time to first audio",
                last(".3f", "ttfa_s"),
                discovery={
                    "device_class": "duration",
                    "unit_of_measurement": "s",
                    "state_class": "measurement",
                    "suggested_display_precision": 3,
                    **diagnostic,
                },
            ),
            _Entity(
                "sensor",
                "rtf",
                "Real-time factor",
                last(".3f", "rtf"),
                discovery={
                    "state_class": "measurement",
                    "suggested_display_precision": 2,
                    "icon": "mdi:speedometer",
                    **diagnostic,
                },
            ),
            _Entity(
                "sensor",
                "audio_seconds",
                "Audio length",
                last(".2f", "audio_s"),
                discovery={
                    "device_class": "duration",
                    "unit_of_measurement": "s",
                    "state_class": "measurement",
                    "suggested_display_precision": 2,
                    **diagnostic,
                },
            ),
            _Entity(
                "sensor",
                "served",
                "Syntheses served",
                lambda: str(service.status.served),
                discovery={"state_class": "total_increasing", "icon": "mdi:counter", **diagnostic},
            ),
            _Entity(
                "sensor",
                "queue_depth",
                "Queue depth",
                lambda: str(service.status.queue_depth),
                discovery={"state_class": "measurement", "icon": "mdi:tray-full", **diagnostic},
            ),
            _Entity(
                "sensor",
                "engine_state",
                "Engine state",
                lambda: service.status.state,
                discovery={
                    "device_class": "enum",
                    "options": ["idle", "synthesizing"],
                    "icon": "mdi:state-machine",
                    **diagnostic,
                },
            ),
        ]

    def _set(self, **changes: Any) -> None:
        self.service.update_settings(**changes)

    def _set_threads(self, text: str) -> None:
        if text not in self._thread_options:
            raise ValueError(f"threads must be one of {', '.join(self._thread_options)}")
        self.service.update_settings(threads=int(text))

    def _temperature_state(self) -> str:
        value = self.service.settings.temperature
        return format(round(self._model_temperature if value is None else value, 3), "g")

    def _set_temperature(self, text: str) -> None:
        # Home Assistant's range, narrower than what the engine accepts (> 0).
        low, high, _ = EngineSettings.bounds("temperature").entity_range()
        value = float(text)
        if not low <= value <= high:  # also rejects nan
            raise ValueError(f"temperature must be in {low}..{high}")
        self.service.update_settings(temperature=value)

    # -- topics and payloads ---------------------------------------------------------------

    def state_topic(self, entity: _Entity) -> str:
        return f"{self.base}/{entity.key}/state"

    def command_topic(self, entity: _Entity) -> str:
        return f"{self.base}/{entity.key}/set"

    def discovery_topic(self, entity: _Entity) -> str:
        prefix, node = self.config.discovery_prefix, self.config.node_id
        return f"{prefix}/{entity.component}/{node}/{entity.key}/config"

    def discovery_payload(self, entity: _Entity) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "name": entity.name,
            "unique_id": f"{self.config.node_id}_{entity.key}",
            # Home Assistant ignores object_id since 2026.4; default_entity_id replaces it.
            "default_entity_id": f"{entity.component}.{self._slug}_{entity.key}",
            "availability_topic": self.availability_topic,
            "state_topic": self.state_topic(entity),
            "device": {
                "identifiers": [self.config.node_id],
                "name": "Kazeia TTS",
                "manufacturer": "Kazeia",
                "model": "Qwen3-TTS (wyoming-kazeia)",
                "sw_version": __version__,
            },
            "origin": {"name": "wyoming-kazeia", "sw_version": __version__},
            **entity.discovery,
        }
        if entity.command is not None:
            payload["command_topic"] = self.command_topic(entity)
        return payload

    # -- connection ------------------------------------------------------------------------

    async def run(self) -> None:
        """Runs until cancelled; a broker that is down or lost only delays the bridge."""
        delay = self.config.reconnect_min_s
        while True:
            try:
                async with self._client() as client:
                    _LOGGER.info("MQTT: connected to %s:%d", self.config.host, self.config.port)
                    delay = self.config.reconnect_min_s
                    await self._serve(client)
            except Exception as err:
                if self._stopping:  # an error while saying goodbye must not undo the cancel
                    raise asyncio.CancelledError from err
                if isinstance(err, aiomqtt.MqttError):
                    _LOGGER.warning(
                        "MQTT: broker %s:%d: %s; retrying in %.1f s",
                        self.config.host,
                        self.config.port,
                        err,
                        delay,
                    )
                else:  # a bug: logged, but it never ends the bridge, let alone the service
                    _LOGGER.exception("MQTT bridge failed; retrying in %.1f s", delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.config.reconnect_max_s)

    def _client(self) -> aiomqtt.Client:
        return aiomqtt.Client(
            self.config.host,
            self.config.port,
            username=self.config.username,
            password=self.config.password,
            tls_context=self._tls,
            # The broker says "offline" for us when the connection dies without a goodbye.
            will=aiomqtt.Will(self.availability_topic, "offline", qos=1, retain=True),
        )

    async def _serve(self, client: aiomqtt.Client) -> None:
        try:
            self._sent.clear()  # a new connection: publish every state again
            await client.subscribe(
                [(topic, 1) for topic in self._by_command_topic] + [(self.ha_status_topic, 1)]
            )
            await self._publish_discovery(client)
            await client.publish(self.availability_topic, "online", qos=1, retain=True)
            await self._publish_states(client)
            _LOGGER.info("MQTT: published %d entities", len(self.entities))
            tasks = [
                asyncio.create_task(self._receive(client)),
                asyncio.create_task(self._publish_changes(client)),
            ]
            try:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    task.result()  # the error that ended this connection
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        except asyncio.CancelledError:
            self._stopping = True
            # A clean shutdown disconnects politely, so the broker will not send the last will.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(
                    client.publish(self.availability_topic, "offline", qos=1, retain=True), 2
                )
            raise

    async def _publish_discovery(self, client: aiomqtt.Client) -> None:
        for entity in self.entities.values():
            payload = json.dumps(self.discovery_payload(entity))
            await client.publish(self.discovery_topic(entity), payload, qos=1, retain=True)

    async def _publish_states(self, client: aiomqtt.Client) -> None:
        for entity in self.entities.values():
            await self._publish_state(client, entity)

    async def _publish_state(
        self, client: aiomqtt.Client, entity: _Entity, force: bool = False
    ) -> None:
        topic, payload = self.state_topic(entity), entity.state()
        if not force and self._sent.get(topic) == payload:
            return
        await client.publish(topic, payload, qos=1, retain=True)
        self._sent[topic] = payload

    async def _publish_changes(self, client: aiomqtt.Client) -> None:
        # Notifications that arrive while a publication runs coalesce into the next one.
        while True:
            await self._changed.wait()
            self._changed.clear()
            if self.service.revision != self._revision:  # e.g. a voice added: new options
                self._build_entities()
                await self._publish_discovery(client)
            await self._publish_states(client)

    async def _receive(self, client: aiomqtt.Client) -> None:
        async for message in client.messages:
            try:
                text = message.payload.decode().strip()
            except UnicodeDecodeError:  # rejected below like any other bad value
                text = repr(message.payload)
            topic = str(message.topic)
            if topic == self.ha_status_topic:
                # Home Assistant restarted: announce the device again (states are retained).
                if text == "online":
                    await self._publish_discovery(client)
                continue
            entity = self._by_command_topic.get(topic)
            if entity is None or entity.command is None:
                continue
            try:
                entity.command(text)
            except ValueError as err:  # SettingsError and VoiceError are ValueErrors
                # A hostile payload may be a megabyte: the log gets its head and its size.
                shown = text if len(text) <= _LOGGED_CHARS else f"{text[:_LOGGED_CHARS]}..."
                reason = str(err)[: 2 * _LOGGED_CHARS]
                _LOGGER.warning(
                    "MQTT: rejected %s = %r (%d characters): %s",
                    entity.key,
                    shown,
                    len(text),
                    reason,
                )
                # Home Assistant may show the rejected value until it gets the real one.
                await self._publish_state(client, entity, force=True)
            else:
                _LOGGER.info("MQTT: %s set to %r", entity.key, text)
