"""Kazeia TTS: the Wyoming text-to-speech server.

    python -m wyoming_kazeia --uri tcp://0.0.0.0:10200 --data-dir DIR [--model ...] [--voice ...]

Every option has an environment variable (shown in --help); a flag wins over its variable.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from . import __version__
from .engine import Engine
from .errors import KazeiaError, SettingsError
from .models import DEFAULT_MODEL, resolve_model
from .mqtt import MqttBridge, MqttConfig, add_mqtt_arguments
from .server import serve
from .service import TtsService
from .settings import EngineSettings, add_env_argument, parse_setting

_LOGGER = logging.getLogger("wyoming_kazeia")

_DATA_HOME = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share"))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server = parser.add_argument_group("server")
    add = partial(add_env_argument, server)
    add("--uri", "KZTTS_URI", "tcp://HOST:PORT, unix://PATH or stdio://", "tcp://0.0.0.0:10200")
    add(
        "--data-dir",
        "KZTTS_DATA_DIR",
        "downloaded and converted models",
        str(_DATA_HOME / "wyoming-kazeia"),
        type=Path,
    )
    add(
        "--model",
        "KZTTS_MODEL",
        "converted model dir, Hugging Face checkpoint dir or repo id",
        DEFAULT_MODEL,
    )
    add(
        "--voice",
        "KZTTS_VOICE",
        "default voice, e.g. vivian or vivian-fr (default: the first speaker, automatic language)",
    )
    add(
        "--max-queue",
        "KZTTS_MAX_QUEUE",
        "requests that may wait for the engine; more get an error",
        "8",
        type=int,
    )
    add(
        "--samples-per-chunk",
        "KZTTS_SAMPLES_PER_CHUNK",
        "samples per audio-chunk event",
        "1024",
        type=int,
    )
    add(
        "--zeroconf",
        "KZTTS_ZEROCONF",
        "announce the server over mDNS for Home Assistant discovery (NAME default kazeia-tts)",
        nargs="?",
        const="kazeia-tts",
        metavar="NAME",
    )
    server.add_argument("--debug", action="store_true", help="debug logging")
    server.add_argument("--log-format", default=logging.BASIC_FORMAT, help="Python logging format")
    server.add_argument("--version", action="version", version=__version__)

    engine = parser.add_argument_group("engine (each applies from the next synthesis on)")
    for name, env, allowed, doc in EngineSettings.describe():
        default = getattr(EngineSettings(), name)
        kwargs: dict[str, Any] = {"metavar": "VALUE"}
        if isinstance(default, bool):  # a bare flag means true
            kwargs = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        engine.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            help=f"{doc} [{allowed}] ({env}; default {default})",
            **kwargs,
        )
    add_mqtt_arguments(parser)
    return parser


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    """Defaults < KZTTS_* environment < flags."""
    flags = {
        name: parse_setting(name, getattr(args, name))
        for name, *_ in EngineSettings.describe()
        if getattr(args, name) is not None
    }
    return EngineSettings.from_env(**flags)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format=args.log_format,
        stream=sys.stderr,
    )
    try:
        settings = engine_settings(args)
        mqtt = MqttConfig.from_args(args)
        if args.max_queue < 0 or args.samples_per_chunk < 1:
            raise SettingsError("--max-queue must be >= 0 and --samples-per-chunk >= 1")
        if args.zeroconf and not args.uri.startswith("tcp://"):
            raise SettingsError("--zeroconf announces a TCP port: it needs a tcp:// --uri")
        model_dir = resolve_model(args.model, settings.quant, args.data_dir)
        _LOGGER.info("loading %s", model_dir)
        engine = Engine(model_dir, settings)
        service = TtsService(engine, args.voice, args.max_queue)
    except KazeiaError as err:
        _LOGGER.error("%s", err)
        return 1
    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(_run(service, args, mqtt))
    return 0


async def _run(service: TtsService, args: argparse.Namespace, mqtt: MqttConfig | None) -> None:
    # SIGTERM (docker stop) ends the server like Ctrl-C: running syntheses are cancelled.
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    bridge = asyncio.create_task(MqttBridge(service, mqtt).run()) if mqtt else None
    try:
        await serve(service, args.uri, args.samples_per_chunk, args.zeroconf)
    finally:
        if bridge is not None:
            bridge.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await bridge
        service.shutdown()


if __name__ == "__main__":
    sys.exit(main())
