"""Home Assistant's wyoming integration and TTS manager against our server, as a user meets
them: adding the service (by hand and from a discovery), its voices, one-shot and streaming
requests through the TTS manager (WAV as we send it, MP3 and 16 kHz through HA's ffmpeg),
failures, voices added and removed while both run, and a first start."""

from __future__ import annotations

import asyncio
import io
import time
import wave
from collections.abc import AsyncGenerator
from datetime import timedelta
from ipaddress import ip_address
from typing import Any

import pytest
from conftest import REPO, HostFolder, Kazeia, run_on_host
from homeassistant.components import tts
from homeassistant.components.wyoming.const import DOMAIN
from homeassistant.config_entries import SOURCE_USER, SOURCE_ZEROCONF, ConfigEntryState
from homeassistant.core import HomeAssistant
from homeassistant.data_entry_flow import FlowResultType
from homeassistant.exceptions import HomeAssistantError
from homeassistant.helpers.service_info.zeroconf import ZeroconfServiceInfo
from homeassistant.setup import async_setup_component
from homeassistant.util import dt as dt_util
from hub import Hub
from pytest_homeassistant_custom_component.common import async_fire_time_changed

ENTITY = "tts.kazeia"
POLL = timedelta(seconds=31)  # the integration's describe poll is every 30 s
WAV = {"voice": "vivian", tts.ATTR_PREFERRED_FORMAT: "wav"}  # else HA makes MP3 of our WAV


@pytest.fixture(autouse=True)
async def _home_assistant(hass: HomeAssistant, socket_enabled: None) -> None:
    """HA's harness blocks sockets: these tests talk to real servers on 127.0.0.1."""
    assert await async_setup_component(hass, "homeassistant", {})


async def add_by_hand(hass: HomeAssistant, port: int) -> dict[str, Any]:
    """Settings > Devices & services > Add integration > Wyoming Protocol, host and port."""
    result = await hass.config_entries.flow.async_init(DOMAIN, context={"source": SOURCE_USER})
    assert result["type"] is FlowResultType.FORM
    result = await hass.config_entries.flow.async_configure(
        result["flow_id"], {"host": "127.0.0.1", "port": port}
    )
    await hass.async_block_till_done()
    return dict(result)


async def accept_discovery(hass: HomeAssistant, port: int) -> dict[str, Any]:
    """What HA's zeroconf component starts on our announcement, then the user's "Add"."""
    info = ZeroconfServiceInfo(
        ip_address=ip_address("127.0.0.1"),
        ip_addresses=[ip_address("127.0.0.1")],
        port=port, hostname="kazeia.local.", type="_wyoming._tcp.local.",
        name=f"kazeia-{port}._wyoming._tcp.local.", properties={},
    )  # fmt: skip
    result = await hass.config_entries.flow.async_init(
        DOMAIN, context={"source": SOURCE_ZEROCONF}, data=info
    )
    if result["type"] is FlowResultType.FORM:
        result = await hass.config_entries.flow.async_configure(result["flow_id"], {})
    await hass.async_block_till_done()
    return dict(result)


def entity(hass: HomeAssistant) -> tts.TextToSpeechEntity:
    component = hass.data[tts.DATA_COMPONENT]
    found = component.get_entity(ENTITY)
    assert found is not None, f"no {ENTITY}: {hass.states.async_entity_ids()}"
    return found


def voice_ids(hass: HomeAssistant, language: str) -> list[str]:
    return [v.voice_id for v in entity(hass).async_get_supported_voices(language) or []]


async def poll(hass: HomeAssistant) -> None:
    """The integration's next describe poll (HA's clock moved on by one interval)."""
    async_fire_time_changed(hass, dt_util.utcnow() + POLL)
    await hass.async_block_till_done(wait_background_tasks=True)


async def one_shot(
    hass: HomeAssistant, text: str, options: dict[str, Any], language: str = "en"
) -> tuple[str, bytes]:
    """What tts.speak and the media browser get: the manager's audio for one message."""
    media_id = tts.generate_media_source_id(  # HA's cache would answer a message again
        hass, text, engine=ENTITY, language=language, options=options, cache=False
    )
    return await tts.async_get_media_source_audio(hass, media_id)


def pcm_of(wav_bytes: bytes) -> tuple[int, int, int, bytes]:
    """(rate, channels, width, frames) of a WAV, including HA's streaming header (0 frames)."""
    with wave.open(io.BytesIO(wav_bytes)) as w:
        rate, channels, width = w.getframerate(), w.getnchannels(), w.getsampwidth()
    header = wav_bytes.find(b"data") + 8
    return rate, channels, width, wav_bytes[header:]


@pytest.fixture
async def ready_server(
    kazeia: list[Kazeia], tiny_model: HostFolder, host_tmp: HostFolder
) -> Kazeia:
    server = Kazeia(tiny_model.host, host_tmp.child(f"data-{time.monotonic_ns()}")).start()
    kazeia.append(server)
    await server.ready()
    return server


@pytest.fixture
async def added(hass: HomeAssistant, ready_server: Kazeia) -> Kazeia:
    result = await add_by_hand(hass, ready_server.port)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    return ready_server


async def test_added_by_hand_the_service_is_one_tts_entity_with_the_models_voices(
    hass: HomeAssistant, ready_server: Kazeia
) -> None:
    result = await add_by_hand(hass, ready_server.port)
    assert result["type"] is FlowResultType.CREATE_ENTRY and result["title"] == "kazeia"
    assert [e.state for e in hass.config_entries.async_entries(DOMAIN)] == [ConfigEntryState.LOADED]
    speaker = entity(hass)
    assert set(speaker.supported_languages) >= {"en", "fr", "zh", "de", "ja"}
    english = entity(hass).async_get_supported_voices("en") or []
    ids = [v.voice_id for v in english]
    assert "vivian" in ids and "vivian-en" in ids and "vivian-fr" not in ids
    labels = [v.name for v in english]
    assert len(labels) == len(set(labels)), f"two voices with one label: {labels}"
    assert "vivian-fr" in voice_ids(hass, "fr")


async def test_a_one_shot_message_asked_as_wav_is_24_khz_as_the_server_sends_it(
    hass: HomeAssistant, added: Kazeia
) -> None:
    extension, data = await one_shot(hass, "Hello there. How are you today?", WAV)
    assert extension == "wav"
    rate, channels, width, frames = pcm_of(data)
    assert (rate, channels, width) == (24000, 1, 2)
    assert len(frames) > 0.2 * rate * width  # the tiny model's frames: a few tenths of a second
    assert "synthesis for" in added.log_text()


async def test_no_language_and_no_voice_is_the_default_voice(
    hass: HomeAssistant, added: Kazeia
) -> None:
    """HA sorts the entity's languages and takes the first as its default; it sends no
    language to the service, so a tts.speak with neither is the default voice."""
    assert entity(hass).default_language == sorted(entity(hass).supported_languages)[0]
    media_id = tts.generate_media_source_id(
        hass, "Hello.", engine=ENTITY, options={tts.ATTR_PREFERRED_FORMAT: "wav"}, cache=False
    )
    extension, data = await tts.async_get_media_source_audio(hass, media_id)
    assert extension == "wav" and pcm_of(data)[3]
    assert "voice vivian (vivian), language auto" in added.log_text()


async def test_an_llm_markdown_answer_is_spoken_as_its_plain_text(
    hass: HomeAssistant, added: Kazeia
) -> None:
    """What a conversation agent answers (heading, list, bold, a link, emoji) sounds as the
    words alone would: the seed is fixed, so the same sentences give the same audio."""
    answer = "## Lights\n\n- **Kitchen**: on 💡\n- [Hall](http://ha.local/hall): *off*"
    _, marked = await one_shot(hass, answer, WAV)
    _, plain = await one_shot(hass, "Lights.\n\nKitchen: on.\nHall: off.", WAV)
    _, other = await one_shot(hass, "Lights.\n\nKitchen: off.\nHall: on.", WAV)
    assert pcm_of(marked)[3] and pcm_of(marked)[3] == pcm_of(plain)[3] != pcm_of(other)[3]


async def test_mp3_by_default_and_16_khz_come_out_of_home_assistants_ffmpeg(
    hass: HomeAssistant, added: Kazeia
) -> None:
    """What tts.speak hands a media player is MP3 unless asked otherwise (HA converts our WAV);
    a satellite's pipeline asks for the rate it plays."""
    extension, mp3 = await one_shot(hass, "Hello there.", {"voice": "vivian"})
    assert extension == "mp3" and (mp3[:3] == b"ID3" or mp3[0] == 0xFF), mp3[:16]
    extension, wav16 = await one_shot(
        hass, "Hello there.", {**WAV, "voice": "vivian-en", tts.ATTR_PREFERRED_SAMPLE_RATE: 16000}
    )
    rate, _, _, frames = pcm_of(wav16)
    assert extension == "wav" and rate == 16000 and len(frames) > 0


async def test_streaming_text_pieces_audio_starts_before_the_last_piece(
    hass: HomeAssistant, added: Kazeia
) -> None:
    """An LLM pipeline hands the TTS manager its answer in pieces as they are generated: the
    first sentence is heard while the rest is still being written."""
    first_audio = asyncio.Event()
    sent: list[float] = []

    async def pieces() -> AsyncGenerator[str]:
        for piece in ("Hello", " there. ", "It is a fine", " day"):
            sent.append(time.monotonic())
            yield piece
        async with asyncio.timeout(60):
            await first_audio.wait()  # the last piece comes only once audio has
        sent.append(time.monotonic())
        yield " today."

    stream = tts.async_create_stream(hass, ENTITY, "en", WAV)
    stream.async_set_message_stream(pieces())
    chunks: list[bytes] = []
    async with asyncio.timeout(120):
        async for chunk in stream.async_stream_result():
            chunks.append(chunk)
            if len(b"".join(chunks)) > 44 + 2048:  # past the WAV header: audio
                first_audio.set()
    rate, _, _, frames = pcm_of(b"".join(chunks))
    assert stream.extension == "wav" and rate == 24000 and first_audio.is_set()
    assert len(sent) == 5 and len(frames) > 0


async def test_an_unknown_voice_is_an_error_home_assistant_shows(
    hass: HomeAssistant, added: Kazeia
) -> None:
    with pytest.raises(HomeAssistantError, match="unknown voice 'nobody'.*voice-not-found"):
        await one_shot(hass, "Hello.", {**WAV, "voice": "nobody"})


async def test_an_error_in_a_streamed_request_is_shown_too(
    hass: HomeAssistant, added: Kazeia
) -> None:
    async def pieces() -> AsyncGenerator[str]:
        yield "Hello there."

    stream = tts.async_create_stream(hass, ENTITY, "en", {**WAV, "voice": "nobody"})
    stream.async_set_message_stream(pieces())
    with pytest.raises(HomeAssistantError, match="unknown voice 'nobody'.*voice-not-found"):
        async with asyncio.timeout(60):
            async for _ in stream.async_stream_result():
                pass


async def test_a_speaker_is_taken_with_the_voice_home_assistant_sends_it_with(
    hass: HomeAssistant, added: Kazeia
) -> None:
    """HA sends `speaker` only beside a voice: the voice's language with another speaker."""
    extension, data = await one_shot(
        hass, "Hello.", {**WAV, "voice": "vivian-en", "speaker": "ryan"}
    )
    assert extension == "wav" and pcm_of(data)[3]
    assert "voice 'vivian-en' (ryan), language english" in added.log_text()


async def test_a_killed_server_fails_the_next_request_and_a_restarted_one_serves_again(
    hass: HomeAssistant, added: Kazeia
) -> None:
    added.kill()
    with pytest.raises((HomeAssistantError, OSError)):
        await one_shot(hass, "Anyone there?", WAV)
    await poll(hass)  # the poll fails: HA keeps the entity and its voices
    assert "vivian" in voice_ids(hass, "en")
    added.start()  # the same port, the same data
    await added.ready()
    extension, data = await one_shot(hass, "Back again.", WAV)
    assert extension == "wav" and pcm_of(data)[3]


async def test_a_server_killed_mid_answer_ends_the_audio_short_without_an_error(
    hass: HomeAssistant, added: Kazeia
) -> None:
    """What HA's client does when the connection ends: the audio so far is the answer."""
    stream = tts.async_create_stream(hass, ENTITY, "en", WAV)
    stream.async_set_message(" ".join(f"This is sentence number {i}." for i in range(40)))
    received = b""
    async with asyncio.timeout(120):
        async for chunk in stream.async_stream_result():
            received += chunk
            if len(received) > 44 + 4 * 1920 * 2:  # a few frames of the first sentence
                added.kill()
    frames = pcm_of(received)[3]
    assert 0 < len(frames) < 40 * 8 * 1920 * 2  # not all 40 sentences of 8 frames


async def test_voices_added_and_removed_appear_and_go_at_the_next_poll(
    hass: HomeAssistant, added: Kazeia
) -> None:
    voices = [f"{REPO}/.venv/bin/python", "-m", "wyoming_kazeia.voices"]
    voices += ["--data-dir", added.data_dir.host]
    run_on_host(*voices, "add", "grandma", "--speaker", "vivian", "--instruct", "Speak slowly.",
                "--language", "en")  # fmt: skip
    deadline = time.monotonic() + 30
    while "grandma" not in voice_ids(hass, "en"):
        assert time.monotonic() < deadline, voice_ids(hass, "en")
        await asyncio.sleep(1)  # the server looks at its library every few seconds
        await poll(hass)
    english = entity(hass).async_get_supported_voices("en") or []
    labels = [v.name for v in english]
    assert len(labels) == len(set(labels)), f"two voices with one label: {labels}"
    extension, _ = await one_shot(hass, "Hello, dear.", {**WAV, "voice": "grandma"})
    assert extension == "wav"
    run_on_host(*voices, "remove", "grandma")
    deadline = time.monotonic() + 30
    while "grandma" in voice_ids(hass, "en"):
        assert time.monotonic() < deadline
        await asyncio.sleep(1)
        await poll(hass)


@pytest.fixture
async def hub(tiny_checkpoint: HostFolder) -> AsyncGenerator[Hub]:
    hub = await Hub("kazeia-test/tiny", tiny_checkpoint.here).start()
    yield hub
    await hub.stop()


async def first_start(kazeia: list[Kazeia], hub: Hub, host_tmp: HostFolder) -> Kazeia:
    """A server on its first start, from a repo id: returns once the download of the weights
    has begun (and waits for the hub's release)."""
    data = host_tmp.child(f"first-{time.monotonic_ns()}")
    hf = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": data.child("hf").host,
          "HF_HUB_DOWNLOAD_TIMEOUT": "300", "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
    server = Kazeia(hub.repo_id, data, env=hf).start()
    kazeia.append(server)
    await server.listening()
    async with asyncio.timeout(60):
        while not hub.held_requests:
            await asyncio.sleep(0.05)
    return server


async def test_a_first_start_can_be_added_by_hand_and_from_discovery_and_gets_its_voices(
    hass: HomeAssistant, kazeia: list[Kazeia], hub: Hub, host_tmp: HostFolder
) -> None:
    """A first start downloads the model (held here until the test releases it): meanwhile
    the service is added by hand and from its discovery, synthesis fails at once saying why,
    and once the model is ready the entity has the model's voices at the next poll, with no
    reload."""
    server = await first_start(kazeia, hub, host_tmp)

    by_hand = await add_by_hand(hass, server.port)
    assert by_hand["type"] is FlowResultType.CREATE_ENTRY, by_hand
    discovered = await accept_discovery(hass, server.port)
    # The same host and port as the entry made by hand: HA updates that entry instead.
    assert discovered["type"] is FlowResultType.ABORT, discovered
    assert discovered["reason"] == "already_configured", discovered
    assert [e.state for e in hass.config_entries.async_entries(DOMAIN)] == [ConfigEntryState.LOADED]
    assert entity(hass).supported_languages  # an entity at once, with a voice to pick
    started = time.monotonic()
    with pytest.raises(HomeAssistantError, match="not ready yet: downloading.*model-loading"):
        await one_shot(hass, "Too early.", WAV)
    assert time.monotonic() - started < 5
    assert " ready in " not in server.log_text()  # all of it happened during the first start

    hub.release()
    await server.ready()
    await poll(hass)
    assert "vivian-fr" in voice_ids(hass, "fr")
    extension, data_wav = await one_shot(hass, "Now it works.", WAV)
    assert extension == "wav" and pcm_of(data_wav)[3]


async def test_a_discovered_first_start_becomes_an_entry(
    hass: HomeAssistant, kazeia: list[Kazeia], hub: Hub, host_tmp: HostFolder
) -> None:
    server = await first_start(kazeia, hub, host_tmp)
    result = await accept_discovery(hass, server.port)
    assert result["type"] is FlowResultType.CREATE_ENTRY and result["title"] == "kazeia", result
    assert entity(hass).supported_languages
    assert " ready in " not in server.log_text()
    hub.release()
    await server.ready()
    ready = time.monotonic()
    # On HA's own clock: its describe poll every 30 s brings the voices, no reload.
    while "vivian-de" not in voice_ids(hass, "de"):
        assert time.monotonic() - ready < 45, voice_ids(hass, "de")
        await asyncio.sleep(0.5)


async def test_a_warm_start_discovered_at_once_gets_its_voices_without_a_reload(
    hass: HomeAssistant, kazeia: list[Kazeia], tiny_model: HostFolder, host_tmp: HostFolder
) -> None:
    server = Kazeia(tiny_model.host, host_tmp.child(f"warm-{time.monotonic_ns()}")).start()
    kazeia.append(server)
    await server.listening()
    result = await accept_discovery(hass, server.port)
    assert result["type"] is FlowResultType.CREATE_ENTRY, result
    await server.ready()
    await poll(hass)  # the entity was made while loading, or just after: the voices either way
    assert "vivian-ja" in voice_ids(hass, "ja")
