"""Kazeia TTS: the Wyoming text-to-speech server.

    wyoming-kazeia --uri tcp://0.0.0.0:10200 --data-dir DIR [--model ...] [--voice ...]
    python -m wyoming_kazeia ...   (the same)

Every option has an environment variable (shown in --help); a flag wins over its variable.
The socket is bound first: while a first start downloads, converts and loads the model,
`describe` is answered (the program with the default voice only, its description says how far
the loading is) and a synthesis is refused with `model-loading`. The
zeroconf announcement (--zeroconf) goes out once the socket accepts connections. SIGTERM,
SIGHUP and Ctrl-C stop the server: what runs is cancelled, and the process ends within 2 s
whatever the engine is doing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import platform
import signal
import sys
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlparse

from . import __version__, cpu_floor  # noqa: F401 - cpu_floor first: it checks the CPU
from .daemon_thread import in_daemon_thread
from .engine import Engine, VoicePrompt, resolve_placements
from .errors import KazeiaError, SettingsError, VoiceError
from .http_api import check_http_uri, serve_http
from .model_voices import LibraryLook, ModelVoices, VoiceModel
from .models import DEFAULT_MODEL, add_data_dir_argument, resolve_model, summarize
from .mqtt import MqttBridge, MqttConfig, add_mqtt_arguments
from .native import (
    KERNEL_ISA,
    cpu_has_amx_bf16,
    decoder_bf16_isa,
    describe_placement,
    ggml_cpu_features,
    ggml_cpu_variant,
)
from .server import announce_zeroconf, serve
from .service import TtsService
from .settings import EngineSettings, add_env_argument, env_flag, parse_setting
from .voices import DEFAULT_SPEAKER, Choice, VoiceCatalog
from .voices.library import StoredVoice, VoiceLibrary

_LOGGER = logging.getLogger("wyoming_kazeia")

# The warm-up synthesis: a short sentence of the default voice, a few frames.
WARMUP_TEXT = "Hello."
WARMUP_FRAMES = 8
VOICE_WATCH_S = 5.0  # how often the library is looked at for added or removed voices
# The speech decoder's speed-up with decoder_precision bf16 where its products run on these
# units (docs/hardware.md, "bf16 decoder"): the start log names the setting there.
BF16_DECODER_SPEEDUP = {"AMX": "2.5x", "AVX-512 BF16": "1.4x"}
# How long a stop waits for the engine (a synthesis stops within a frame; loading a voice model
# or computing a voice prompt does not stop): past it the process ends without waiting.
STOP_S = 1.5

T = TypeVar("T")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="wyoming-kazeia",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    server = parser.add_argument_group("server")
    add = partial(add_env_argument, server)
    add("--uri", "KZTTS_URI", "tcp://HOST:PORT, unix://PATH or stdio://", "tcp://0.0.0.0:10200")
    add_data_dir_argument(
        server, "downloaded and converted models, and the voice library (voices/)"
    )
    add(
        "--model",
        "KZTTS_MODEL",
        "converted model dir, Hugging Face checkpoint dir or repo id",
        DEFAULT_MODEL,
    )
    add(
        "--voice-model",
        "KZTTS_VOICE_MODEL",
        "a second model for the library voices the main model does not speak, e.g. "
        "Qwen/Qwen3-TTS-12Hz-0.6B-Base for cloned voices beside the CustomVoice speakers "
        "(resolved at start, loaded on the first request for one of its voices)",
    )
    add(
        "--voice",
        "KZTTS_VOICE",
        f"default voice, e.g. vivian or vivian-fr (default: {DEFAULT_SPEAKER} when the model "
        "has it, else its first speaker; automatic language)",
    )
    add(
        "--max-queue",
        "KZTTS_MAX_QUEUE",
        "requests that may wait for the engine; more get an error",
        "8",
        type=int,
    )
    add(
        "--max-connections",
        "KZTTS_MAX_CONNECTIONS",
        "open connections at most (at the bound a new one replaces the idlest)",
        "64",
        type=int,
    )
    add(
        "--idle-timeout",
        "KZTTS_IDLE_TIMEOUT",
        "seconds a connection may send nothing while nothing is spoken for it, or read "
        "nothing of its audio; 0: forever",
        "60",
        type=float,
        metavar="SECONDS",
    )
    add(
        "--max-unsent-mb",
        "KZTTS_MAX_UNSENT_MB",
        "audio a client may leave unread per request before its synthesis is cancelled",
        "8",
        type=float,
        metavar="MB",
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
    add(
        "--http-uri",
        "KZTTS_HTTP_URI",
        "also serve the HTTP API (OpenAI's speech endpoint) and the web page here, e.g. "
        "tcp://127.0.0.1:8200 (tcp://0.0.0.0:8200: every interface); off when unset",
    )
    add(
        "--http-api-key",
        "KZTTS_HTTP_API_KEY",
        "a key the HTTP API's requests must carry (Authorization: Bearer KEY); prefer the "
        "variable to the flag, which other users can see",
    )
    server.add_argument(
        "--no-warmup",
        action="store_true",
        default=None,
        help="skip the warm-up synthesis before the service is ready (KZTTS_NO_WARMUP)",
    )
    server.add_argument(
        "--debug", action="store_true", default=None, help="debug logging (KZTTS_DEBUG)"
    )
    add("--log-format", "KZTTS_LOG_FORMAT", "Python logging format", logging.BASIC_FORMAT)
    server.add_argument("--version", action="version", version=__version__)

    engine = parser.add_argument_group("engine (each applies from the next synthesis on)")
    advanced = parser.add_argument_group("advanced (developer knobs)")
    for name, env, allowed, doc in EngineSettings.describe():
        default = getattr(EngineSettings(), name)
        kwargs: dict[str, Any] = {"metavar": "VALUE"}
        if isinstance(default, bool):  # a bare flag means true
            kwargs = {"nargs": "?", "const": "true", "metavar": "BOOL"}
        group = advanced if EngineSettings.is_advanced(name) else engine
        group.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            help=f"{doc} [{allowed}] ({env}; default {default})",
            **kwargs,
        )
    add_mqtt_arguments(parser)
    return parser


def engine_settings(args: argparse.Namespace) -> EngineSettings:
    """Defaults < KZTTS_* environment < flags; a bad flag value is blamed on the flag."""
    flags = {
        name: parse_setting(name, getattr(args, name), "--" + name.replace("_", "-"))
        for name, *_ in EngineSettings.describe()
        if getattr(args, name) is not None
    }
    return EngineSettings.from_env(**flags)


def check_uri(uri: str) -> None:
    """SettingsError unless `uri` is tcp://HOST:PORT, unix://PATH or stdio://."""
    try:
        parsed = urlparse(uri)
        port = parsed.port if parsed.scheme == "tcp" else None
    except ValueError as err:  # a port that is not a number or out of range
        raise SettingsError(f"invalid --uri {uri!r}: {err}") from None
    if parsed.scheme == "tcp":
        if not parsed.hostname or port is None:
            raise SettingsError(f"invalid --uri {uri!r}: tcp:// needs HOST:PORT")
    elif parsed.scheme == "unix":
        path = Path(parsed.netloc + parsed.path)
        if not str(path):
            raise SettingsError(f"invalid --uri {uri!r}: unix:// needs a PATH")
        # The server replaces a stale socket at PATH: never a file that is something else.
        if (path.exists() or path.is_symlink()) and not path.is_socket():
            raise SettingsError(f"invalid --uri {uri!r}: {path} exists and is not a socket")
    elif parsed.scheme != "stdio":
        raise SettingsError(f"invalid --uri {uri!r}: use tcp://HOST:PORT, unix://PATH or stdio://")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        debug = args.debug or env_flag("KZTTS_DEBUG")
        args.no_warmup = args.no_warmup or env_flag("KZTTS_NO_WARMUP")
    except SettingsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.INFO, format=args.log_format, stream=sys.stderr
    )
    try:
        settings = engine_settings(args)
        resolve_placements(settings)  # a device that is not here: one line, before any loading
        mqtt = MqttConfig.from_args(args)
        check_uri(args.uri)
        if args.max_queue < 0 or args.samples_per_chunk < 1 or not args.max_unsent_mb > 0:
            raise SettingsError(
                "--max-queue must be >= 0, --samples-per-chunk >= 1 and --max-unsent-mb > 0"
            )
        if args.max_connections < 1 or not args.idle_timeout >= 0:
            raise SettingsError("--max-connections must be >= 1 and --idle-timeout >= 0")
        if args.http_uri:
            check_http_uri(args.http_uri)
        if args.zeroconf and not args.uri.startswith("tcp://"):
            raise SettingsError("--zeroconf announces a TCP port: it needs a tcp:// --uri")
    except KazeiaError as err:
        _LOGGER.error("%s", err)
        return 1
    service = TtsService(
        default_voice=args.voice,
        max_queue=args.max_queue,
        max_unsent_bytes=int(args.max_unsent_mb * (1 << 20)),
        library=VoiceLibrary(args.data_dir),
    )
    code = 0
    with contextlib.suppress(KeyboardInterrupt):
        code = asyncio.run(_run(service, args, settings, mqtt))
    if not service.shutdown(STOP_S):
        # The engine thread is in work that cannot be interrupted (a model read from a stuck
        # disk, a voice prompt): ending the interpreter around it could crash in native code.
        _LOGGER.warning("exiting without waiting for the engine")
        logging.shutdown()
        os._exit(code)
    return code


async def _run(
    service: TtsService, args: argparse.Namespace, settings: EngineSettings, mqtt: MqttConfig | None
) -> int:
    # SIGTERM (docker stop) and SIGHUP (a closed terminal) end the server like Ctrl-C: running
    # syntheses are cancelled.
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()

    def on_signal(number: signal.Signals) -> None:
        _LOGGER.info("%s: stopping", number.name)
        service.stop()  # the engine stops what it does now, not after the tasks below end
        if task is not None:
            task.cancel()

    for number in (signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(number, on_signal, number)
    stdio = urlparse(args.uri).scheme == "stdio"
    server: asyncio.Task[None] | None = None
    bridge: asyncio.Task[None] | None = None
    watch: asyncio.Task[None] | None = None
    http: asyncio.Task[None] | None = None
    try:
        if args.http_uri:  # like Wyoming's, listening before any download
            http_listening = asyncio.Event()
            http = asyncio.create_task(
                serve_http(
                    service,
                    args.http_uri,
                    args.http_api_key or None,
                    args.idle_timeout or None,
                    http_listening,
                )
            )
            await _first(http_listening.wait(), http)
            if http.done():
                http.result()  # raises what stopped it (a busy port)
        if not stdio:  # bound before any download: describe answers during the first start
            listening = asyncio.Event()
            server = asyncio.create_task(
                serve(
                    service,
                    args.uri,
                    args.samples_per_chunk,
                    partial(announce_zeroconf, args.zeroconf) if args.zeroconf else None,
                    listening,
                    args.max_connections,
                    args.idle_timeout or None,
                )
            )
            await _first(listening.wait(), server)
            if server.done():
                server.result()  # raises what stopped it (a busy port, a bad path)
        await _load(service, args, settings)
        watch = asyncio.create_task(_watch_voices(service))
        if mqtt is not None:
            bridge = asyncio.create_task(MqttBridge(service, mqtt).run())
        if stdio:
            await serve(service, args.uri, args.samples_per_chunk, None)
        elif server is not None:
            await server
    except KazeiaError as err:
        _LOGGER.error("%s", err)
        return 1
    except OSError as err:  # the socket: a busy port, a path that cannot be bound
        _LOGGER.error("cannot listen on %s: %s", args.uri, err)
        return 1
    except asyncio.CancelledError:
        pass
    finally:
        for t in (watch, bridge, http, server):
            if t is not None:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
    return 0


async def _watch_voices(service: TtsService) -> None:
    """Voices added to or removed from the library appear in Home Assistant (describe, the
    MQTT voice select) within a few seconds, with no request needed."""
    while True:
        await asyncio.sleep(VOICE_WATCH_S)
        await service.refresh_voices()


async def _first(awaitable: Any, task: asyncio.Task[None]) -> None:
    """Waits for `awaitable`, or for `task` to end first (its error is then raised by the
    caller)."""
    waiter = asyncio.ensure_future(awaitable)
    await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()


async def _load(service: TtsService, args: argparse.Namespace, settings: EngineSettings) -> None:
    """Model resolution (download, conversion), loading and the warm-up, reported to the
    service as they go; the service is ready at the end."""
    start = time.monotonic()
    service.set_loading(f"resolving {args.model}")
    model_dir = await in_daemon_thread(
        lambda: resolve_model(args.model, settings.quant, args.data_dir, service.set_loading)
    )
    if args.voice_model:
        service.set_loading(f"resolving {args.voice_model}")
        voice_dir = await in_daemon_thread(
            lambda: resolve_model(
                args.voice_model, settings.quant, args.data_dir, service.set_loading
            )
        )
        service.voice_model = VoiceModel(
            str(voice_dir), ModelVoices.of_folder(voice_dir), lambda: Engine(voice_dir, settings)
        )
    service.set_loading(f"loading {model_dir}")
    _LOGGER.info("loading %s", model_dir)
    engine = await in_daemon_thread(lambda: Engine(model_dir, settings))
    summary = summarize(
        model_dir,
        int(engine.generator.hparams["kazeia.talker.hidden_size"]),
        bool(engine.speakers),
    )
    # The library voices this model speaks: their prompts computed where missing (once: they
    # are stored), so that no request computes one.
    service.set_loading(f"preparing the voices of {model_dir}")
    spoken, prompts, library = await in_daemon_thread(lambda: _prepare_voices(engine, service))
    warm = None
    if not args.no_warmup:
        try:
            warm = _warm_up_voice(engine, args.voice, spoken, prompts)
        except KazeiaError as err:  # no voice to warm up with (a Base model, no voices yet)
            _LOGGER.info("no warm-up synthesis: %s", err)
    if warm is not None:
        # One short synthesis of the default voice (graphs, weight pages, its voice prefix),
        # before the service is ready: no request shares the engine with it.
        service.set_loading(f"warming up {model_dir}")
        warm_start = time.monotonic()
        choice, voice = warm
        warm_up = engine.synthesize(
            WARMUP_TEXT,
            choice.speaker or None,
            choice.language,
            voice=voice,
            max_frames=WARMUP_FRAMES,
            seed=0,
        )
        try:
            await in_daemon_thread(lambda: sum(1 for _ in warm_up))
            # Cut at WARMUP_FRAMES: its production rate, not its length
            service.rates.learn_synthesis(None, warm_up.metrics)
            _LOGGER.info(
                "warm-up synthesis: %.2f s (the first request is not the cold one)",
                time.monotonic() - warm_start,
            )
        except KazeiaError as err:  # e.g. a model file replaced meanwhile: requests reload it
            _LOGGER.warning("warm-up synthesis failed: %s", err)
        finally:
            # A SIGTERM during the warm-up: its threads end (within a frame) before the process
            # does, so that no native work runs while the interpreter shuts down.
            warm_up.close()
    service.attach(engine, args.voice, summary.name, library)
    _banner(service, summary.origin, model_dir, time.monotonic() - start)


def _prepare_voices(
    engine: Engine, service: TtsService
) -> tuple[list[StoredVoice], dict[str, VoicePrompt], LibraryLook | None]:
    """The library voices the model speaks, and their prompts (computed now where missing,
    what their syntheses share readied; a voice that fails is reported and left out), and
    the look at the library they come from."""
    look = service.look_at_library(None)
    if service.library is None or look is None:
        return [], {}, look
    model = ModelVoices.of_engine(engine)
    spoken = [v for v in look.found if model.speaks(v)]
    return spoken, service.library.prepare(spoken, engine), look


def _warm_up_voice(
    engine: Engine, default: str | None, spoken: list[StoredVoice], prompts: dict[str, VoicePrompt]
) -> tuple[Choice, VoicePrompt | None]:
    """The default voice, for the warm-up synthesis."""
    choice = VoiceCatalog(engine.speakers, engine.languages, spoken).choose(default)
    if choice.stored is None:
        return choice, None
    if choice.stored not in prompts:
        raise VoiceError(f"voice {choice.stored!r} is unusable (see above)")
    return choice, prompts[choice.stored]


def _banner(service: TtsService, origin: str, model_dir: Path, load_s: float) -> None:
    s = service.settings
    where = origin if origin == str(model_dir) else f"{origin}, {model_dir}"
    _LOGGER.info(
        "Kazeia TTS %s ready in %.1f s: %s (%s)", __version__, load_s, service.model_name, where
    )
    _LOGGER.info(
        "threads %d generator + %d decoder, talker K/V cache %s, stream chunk %d; default voice "
        "%s of %d voices",
        s.threads,
        s.decoder_threads,
        service.engine.generator.kv_cache_type,
        s.stream_chunk,
        service.default_voice,
        len(service.voices.voices),
    )
    devices = service.engine.devices
    decoder_on_cpu = s.decoder_subprocess or devices["decoder"] == "cpu"
    _LOGGER.info(
        "placement: talker %s, code predictor %s, decoder %s%s",
        describe_placement(devices["talker"]),
        describe_placement(devices["predictor"]),
        "a kazeia-decoder process"
        if s.decoder_subprocess
        else describe_placement(devices["decoder"]),
        f" in bf16 ({decoder_bf16_isa()})"
        if s.decoder_precision == "bf16" and decoder_on_cpu
        else "",
    )
    _LOGGER.info(
        "CPU: %s; ggml CPU backend: %s (%s); own kernels: %s",
        _cpu_name(),
        ggml_cpu_variant(),
        " ".join(ggml_cpu_features()) or "unknown",
        KERNEL_ISA,
    )
    if decoder_on_cpu and s.decoder_precision == "f32":
        # cpu_has_amx_bf16 first: an f32 process never asks Linux for the tiles (decoder_bf16_isa
        # does where the CPU has AMX, and only there).
        unit = "AMX" if cpu_has_amx_bf16() else decoder_bf16_isa()
        speedup = BF16_DECODER_SPEEDUP.get(unit)
        if speedup:
            _LOGGER.info(
                "this CPU has %s: decoder_precision bf16 would run the speech decoder about %s "
                "faster, at bf16's rounding (docs/hardware.md, 'bf16 decoder')",
                unit,
                speedup,
            )


def _cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else its architecture."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model"):
                return f"{value.strip()} ({os.cpu_count()} CPUs)"
    return f"{platform.machine()} ({os.cpu_count()} CPUs)"


def run() -> None:
    """The `wyoming-kazeia` console script."""
    sys.exit(main())


if __name__ == "__main__":
    run()
