"""The web page in a real browser: Debian's chromium, headless, driven by Selenium through
Debian's chromium-driver (no browser is downloaded), against a real server on tiny random
checkpoints. The page plays what it hears through Web Audio; its meter (every played sample
passes through it) says how many samples it played.

Without chromium the tests are skipped for a developer and fail in CI (CI=true): script/setup
installs it. KAZEIA_SCREENSHOTS=DIR keeps a screenshot of the page there (never in the repo)."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from test_http_api import FRAMES, HOP, HttpServer, cloning_server, http
from test_server import free_port

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
WAIT_S = 60.0


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        message = "chromium and chromium-driver are not installed: run script/setup"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root
        "--disable-dev-shm-usage",
        "--window-size=1100,1400",
        "--autoplay-policy=no-user-gesture-required",
        "--use-fake-ui-for-media-stream",  # the microphone: a fake device, allowed
        "--use-fake-device-for-media-stream",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(options=options, service=Service(str(CHROMEDRIVER)))
    driver.set_page_load_timeout(WAIT_S)
    yield driver
    driver.quit()


@pytest.fixture
def server(tiny_model: Path, tiny_base_model: Path, tmp_path: Path) -> Iterator[HttpServer]:
    with cloning_server(tiny_model, tiny_base_model, tmp_path / "data") as running:
        yield running


def wait(browser: Any, condition: Any, what: str) -> Any:
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(browser, WAIT_S, 0.05).until(lambda _: condition(), message=what)


def heard(browser: Any) -> dict[str, float]:
    result: dict[str, float] = browser.execute_script("return window.kazeia.heard;")
    return result


def speak_on_page(browser: Any, voice: str) -> float:
    """Speaks the page's text with `voice`; the page's first audio time (ms)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    def listed() -> bool:
        options = Select(browser.find_element(By.ID, "voice")).options
        return voice in [o.get_attribute("value") for o in options]

    wait(browser, listed, f"voice {voice} listed")
    Select(browser.find_element(By.ID, "voice")).select_by_value(voice)
    before = heard(browser)["samples"]
    browser.execute_script("window.kazeia.firstAudioMs = null;")
    browser.find_element(By.ID, "speak").click()
    status = browser.find_element(By.ID, "speak-status")
    wait(browser, lambda: "synthesized in" in status.text or "error" in
         (status.get_attribute("class") or ""), "the speech to end")  # fmt: skip
    assert "error" not in (status.get_attribute("class") or ""), status.text
    # Every sample the page received is played: FRAMES frames at 24 kHz, more at the
    # context's own rate (48 kHz in Chrome); the meter sees them as they play.
    wait(browser, lambda: heard(browser)["samples"] - before >= FRAMES * HOP, "the audio played")
    assert heard(browser)["peak"] > 0.001
    first = browser.execute_script("return window.kazeia.firstAudioMs;")
    assert first is not None and "First audio after" in status.text
    return float(first)


def test_the_page_speaks_and_the_browser_plays_the_stream(
    browser: Any, server: HttpServer, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    wait(browser, lambda: browser.find_element(By.ID, "state").text == "idle", "the model ready")
    assert speak_on_page(browser, "vivian") > 0
    settings = browser.find_element(By.ID, "settings").text
    assert "threads" in settings and "default voice vivian" in settings
    assert (
        "Cloning needs a Base model" not in browser.page_source
        or not browser.find_element(By.ID, "clone-note").is_displayed()
    )
    keep = os.environ.get("KAZEIA_SCREENSHOTS")
    shot = Path(keep) if keep else tmp_path
    shot.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot / "page.png"))


def test_an_uploaded_recording_becomes_a_voice_that_speaks_then_is_deleted(
    browser: Any, server: HttpServer, reference_recording: Path, tmp_path: Path
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    browser.get(server.url + "/")
    wait(browser, lambda: browser.find_element(By.ID, "state").text == "idle", "the model ready")
    browser.find_element(By.ID, "new-name").send_keys("grandma")
    Select(browser.find_element(By.ID, "new-language")).select_by_value("en")
    browser.find_element(By.ID, "new-text").send_keys("Hello world, I am here.")
    browser.find_element(By.ID, "new-audio").send_keys(str(reference_recording))
    wait(browser, lambda: browser.find_element(By.ID, "preview").is_displayed(), "a preview")
    # Without the owner's consent the browser does not send it.
    browser.find_element(By.ID, "add").click()
    assert not (tmp_path / "data" / "voices" / "grandma").exists()
    browser.find_element(By.ID, "consent").click()
    browser.find_element(By.ID, "add").click()
    status = browser.find_element(By.ID, "add-status")
    wait(browser, lambda: "Added grandma" in status.text, f"the voice added ({status.text})")
    row = 'tr[data-voice="grandma"]'
    wait(browser, lambda: browser.find_elements(By.CSS_SELECTOR, row), "the voice listed")
    assert (tmp_path / "data" / "voices" / "grandma" / "voice.json").is_file()
    speak_on_page(browser, "grandma")

    browser.find_element(By.CSS_SELECTOR, f'{row} button[data-action="delete"]').click()
    browser.switch_to.alert.accept()
    wait(browser, lambda: not browser.find_elements(By.CSS_SELECTOR, row), "the voice gone")
    assert not (tmp_path / "data" / "voices" / "grandma").exists()
    voices = http("GET", server.url + "/v1/audio/voices").json()["voices"]
    assert "grandma" not in [v["id"] for v in voices]


def test_a_recording_made_with_the_microphone_is_previewed_as_wav(
    browser: Any, server: HttpServer
) -> None:
    """Chromium's fake microphone (a beep) stands in for a person: the page records it into
    a WAV the server reads."""
    from selenium.webdriver.common.by import By

    browser.get(server.url + "/")
    record = browser.find_element(By.ID, "record")
    record.click()
    wait(browser, lambda: float((browser.find_element(By.ID, "record-time").text or "0 s")
         .split()[0]) >= 1.5, "1.5 s recorded")  # fmt: skip
    record.click()
    wait(browser, lambda: browser.find_element(By.ID, "preview").is_displayed(), "a preview")
    size = browser.execute_script(
        "const blob = await fetch(document.getElementById('preview').src).then(r => r.blob());"
        "const head = new Uint8Array(await blob.slice(0, 4).arrayBuffer());"
        "return [blob.size, String.fromCharCode(...head)];"
    )
    assert size[1] == "RIFF" and size[0] > 44 + 2 * 16000


INGRESS = "/api/hassio_ingress/f3a9_Token-1"


class IngressProxy:
    """A stand-in for Home Assistant's ingress: INGRESS/PATH is the server's /PATH, with the
    X-Ingress-Path header, streamed both ways; nothing else of the server is reachable."""

    def __init__(self, target: str) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        self.loop = asyncio.new_event_loop()
        started = threading.Event()
        self._stop = asyncio.Event()

        async def forward(request: web.Request) -> web.StreamResponse:
            headers = {k: v for k, v in request.headers.items() if k.lower() in _PASSED}
            headers["X-Ingress-Path"] = INGRESS
            async with (
                aiohttp.ClientSession() as session,
                session.request(
                    request.method,
                    f"{target}/{request.match_info['path']}",
                    headers=headers,
                    data=await request.read(),
                ) as upstream,
            ):
                response = web.StreamResponse(
                    status=upstream.status,
                    headers={k: v for k, v in upstream.headers.items() if k.lower() in _PASSED},
                )
                await response.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
                await response.write_eof()
                return response

        async def main() -> None:
            app = web.Application(client_max_size=32 << 20)
            app.router.add_route("*", INGRESS + "/{path:.*}", forward)
            runner = web.AppRunner(app)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", int(self.url.rsplit(":", 1)[1])).start()
            started.set()
            await self._stop.wait()
            await runner.cleanup()

        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(main(),))
        self._thread.start()
        assert started.wait(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)


_PASSED = {"content-type", "authorization", "retry-after", "x-sample-rate", "accept"}


def test_the_page_works_behind_home_assistants_ingress_path(
    browser: Any, server: HttpServer
) -> None:
    """Everything the page asks for goes through the prefix: the server's root is not
    reachable through the proxy, so an absolute URL would fail."""
    from selenium.webdriver.common.by import By

    proxy = IngressProxy(server.url)
    try:
        browser.get(proxy.url + INGRESS + "/")
        wait(browser, lambda: browser.find_element(By.ID, "state").text == "idle", "ready")
        assert speak_on_page(browser, "vivian-en") > 0
        api = browser.find_element(By.ID, "api-url").text
        assert api == proxy.url + INGRESS + "/v1"
    finally:
        proxy.stop()
