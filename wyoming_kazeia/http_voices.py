"""The web page's own API: what the service runs with, and the voice library the command line
manages (`python -m wyoming_kazeia.voices`), through the same VoiceLibrary.

    GET    /api/info                  model, state, settings, default voice, the library voices
    POST   /api/voices                a recording (multipart: audio, name, text, language,
                                      consent) cloned into a voice
    PATCH  /api/voices/{name}         {"name": NEW}: renamed
    DELETE /api/voices/{name}         removed
    PUT    /api/default-voice         {"voice": NAME}: the default voice from now on (as the MQTT
                                      select sets it; --voice sets it at start)

The library's files are read and written in a worker thread; the service takes the change up
at once (refresh_voices), as it would within seconds by itself.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
from pathlib import Path

from aiohttp import BodyPartReader, web

from .daemon_thread import in_daemon_thread
from .errors import RequestError, VoiceError, quoted
from .http_requests import MAX_UPLOAD_BYTES, field, read_json, within_idle_timeout
from .model_voices import ModelVoices
from .service import TtsService
from .voices import LANGUAGE_CODES, model_language, recording
from .voices.library import StoredVoice, VoiceLibrary

MAX_FIELD_BYTES = 8 * 1024  # a name, a transcript, a language


class VoicePage:
    def __init__(self, service: TtsService) -> None:
        self.service = service

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_get("/api/info", self.info)
        router.add_post("/api/voices", self.add)
        router.add_patch("/api/voices/{name}", self.rename)
        router.add_delete("/api/voices/{name}", self.remove)
        router.add_put("/api/default-voice", self.default_voice)

    @property
    def library(self) -> VoiceLibrary:
        if self.service.library is None:
            raise RequestError("this server has no voice library", 404, "no_library")
        return self.service.library

    def can_clone(self) -> bool:
        """Whether a cloned voice is spoken here: the model or the voice model is a Base one."""
        kinds = [self.service.voice_model.voices.kind] if self.service.voice_model else []
        if self.service.ready:
            kinds.append(ModelVoices.of_engine(self.service.engine).kind)
        return "base" in kinds

    async def info(self, request: web.Request) -> web.Response:
        await self.service.refresh_voices()
        service = self.service
        stored: list[StoredVoice] = []
        if service.library is not None:
            stored, _ = await in_daemon_thread(service.library.scan)
        spoken = {v.stored for v in service.voices.voices if v.stored}
        status = service.status
        return web.json_response(
            {
                "model": service.model_name,
                "ready": service.ready,
                "loading": service.loading,
                "default_voice": service.default_voice,
                "settings": dataclasses.asdict(service.settings),
                "status": {
                    "state": status.state,
                    "queue_depth": status.queue_depth,
                    "served": status.served,
                    "last_first_audio_s": round(status.last.ttfa_s, 3),
                    "last_rtf": round(status.last.rtf, 3),
                },
                "can_clone": self.can_clone(),
                "follows_instructions": service.ready
                and service.engine.follows_instructions
                and bool(service.engine.speakers),
                "languages": ["auto", *LANGUAGE_CODES.values()],
                "recording_seconds": [recording.MIN_SECONDS, recording.MAX_SECONDS],
                "library": [
                    {
                        "name": v.name,
                        "kind": v.kind,
                        "language": v.language or "auto",
                        "summary": v.summary,
                        "spoken": v.name in spoken,
                    }
                    for v in stored
                ],
            }
        )

    async def add(self, request: web.Request) -> web.Response:
        """A recording and its transcript become a cloned voice, checked as the command line
        checks them (length, silence, script), with the owner's consent confirmed."""
        fields, audio = await within_idle_timeout(request, _read_upload(request))
        if fields.get("consent") not in ("true", "on", "yes", "1"):
            raise RequestError(
                "confirm that the voice's owner agreed to be cloned (consent)", param="consent"
            )
        if not self.can_clone():
            raise RequestError(
                "this server has no Base model to clone voices with: start it with "
                "--voice-model Qwen/Qwen3-TTS-12Hz-0.6B-Base",
                409,
                "no_base_model",
            )
        if audio is None:
            raise RequestError("no recording: send it as the 'audio' file", param="audio")
        name = fields.get("name", "").strip()
        text = fields.get("text", "").strip() or None
        language = model_language(fields.get("language") or None)
        library = self.library

        def store() -> StoredVoice:
            with tempfile.TemporaryDirectory(prefix="kazeia-upload-") as folder:
                path = Path(folder) / "recording"
                path.write_bytes(audio)
                rec = recording.load(path)
            return library.add_clone(name, rec, text, language)

        voice = await in_daemon_thread(store)
        await self.service.refresh_voices()
        return web.json_response({"name": voice.name, "summary": voice.summary}, status=201)

    async def rename(self, request: web.Request) -> web.Response:
        old = request.match_info["name"]
        new = str(field(await read_json(request), "name", str, "")).strip()
        library = self.library
        default = self.service.default_voice
        voice = await in_daemon_thread(lambda: library.rename(old, new))
        await self.service.refresh_voices()
        if default == old:  # the default voice keeps being this voice
            with contextlib.suppress(VoiceError):
                self.service.set_default_voice(new)
        return web.json_response({"name": voice.name, "summary": voice.summary})

    async def remove(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        library = self.library
        await in_daemon_thread(lambda: library.remove(name))
        await self.service.refresh_voices()
        return web.json_response({"removed": name})

    async def default_voice(self, request: web.Request) -> web.Response:
        name = str(field(await read_json(request), "voice", str, "")).strip()
        if not name:
            raise RequestError('give the voice: {"voice": NAME}', param="voice")
        await self.service.refresh_voices()
        self.service.set_default_voice(name)
        return web.json_response({"default_voice": self.service.default_voice})


async def _read_upload(request: web.Request) -> tuple[dict[str, str], bytes | None]:
    """The form fields (text) and the `audio` file of a multipart upload, each within its
    bound; RequestError otherwise."""
    if not request.content_type.startswith("multipart/"):
        raise RequestError("send the voice as multipart/form-data", 415, "unsupported_media_type")
    if request.content_length is not None and request.content_length > MAX_UPLOAD_BYTES:
        raise RequestError(
            f"the upload exceeds {MAX_UPLOAD_BYTES >> 20} MB", 413, "request_too_large"
        )
    reader = await request.multipart()
    fields: dict[str, str] = {}
    audio: bytes | None = None
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader) or not part.name:
            continue
        limit = MAX_UPLOAD_BYTES if part.name == "audio" else MAX_FIELD_BYTES
        data = bytearray()
        while chunk := await part.read_chunk(64 * 1024):
            data += chunk
            if len(data) > limit:
                raise RequestError(
                    f"the field {quoted(part.name)} exceeds {limit} bytes",
                    413,
                    "request_too_large",
                    part.name,
                )
        if part.name == "audio":
            audio = bytes(data)
        else:
            try:
                fields[part.name] = data.decode("utf-8")
            except UnicodeDecodeError:
                raise RequestError(f"the field {quoted(part.name)} is not UTF-8") from None
    return fields, audio
