"""Speakable text: each rule on a table of inputs, streamed text as if whole, SSML, and the
engine's greedy codes for a text with and without its Markdown."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from wyoming_kazeia.engine import Engine
from wyoming_kazeia.errors import SsmlError
from wyoming_kazeia.sentences import StreamSentences
from wyoming_kazeia.settings import EngineSettings
from wyoming_kazeia.speakable import (
    MAX_BREAK_S,
    MAX_BREAKS_S,
    MAX_HELD_CHARS,
    Pause,
    SpeakableText,
    speakable,
    ssml_parts,
)

RULES = {
    "emphasis": [
        ("**Hello** _world_!", "Hello world!"),
        ("It is ***very*** __hot__ and ~~cold~~ warm.", "It is very hot and cold warm."),
        ("un*frigging*believable: inside a word", "un*frigging*believable: inside a word"),
        ("rm *.log and a ~~ b", "rm *.log and a ~~ b"),
        ("2 * 3 = 6 and 2*3 too", "2 * 3 = 6 and 2*3 too"),
        ("snake_case_name stays", "snake_case_name stays"),
        ("about ~5 minutes", "about ~5 minutes"),
        (r"\*not emphasis\*", "*not emphasis*"),
    ],
    "headings": [
        ("# Weather today\nIt is sunny.", "Weather today.\nIt is sunny."),
        ("### Done!\nYes.", "Done!\nYes."),
        ("#hashtag stays", "#hashtag stays"),
    ],
    "lists": [
        ("Lights on:\n\n- Kitchen\n- Living room", "Lights on:\n\nKitchen.\nLiving room."),
        ("* one\n+ two\n• three", "one.\ntwo.\nthree."),
        ("1. Preheat the oven\n2) Bake it!", "Preheat the oven.\nBake it!"),
        ("- [ ] buy milk\n- [x] call mum", "buy milk.\ncall mum."),
        ("-5 degrees outside", "-5 degrees outside"),
        ("- 晴天\n- 多云", "晴天。\n多云。"),
    ],
    "block quotes": [
        ("> quoted text\n> more of it", "quoted text\nmore of it"),
        ("> - a quoted item", "a quoted item."),
    ],
    "code": [
        ("Run `ha core restart` now.", "Run ha core restart now."),
        ("`*args`, `__init__` and `<br>` as written", "*args, __init__ and <br> as written"),
        ("```ha core restart``` then reboot.", "ha core restart then reboot."),
        ("The YAML:\n```yaml\nlight:\n  - platform: x\n```\nDone.", "The YAML:\n\nDone."),
        ("~~~\ncode\n~~~~\nAfter.", "\nAfter."),
        ("```\nnever closed\nstill code", ""),
    ],
    "tables": [
        (
            "| Day | Temp |\n|-----|:----:|\n| Mon | 20 °C |\n| Tue | 18 °C |",
            "Day, Temp.\n\nMon, 20 °C.\nTue, 18 °C.",
        ),
        ("| Room | State |\n| --- | --- |\n| Hall | on! |", "Room, State.\n\nHall, on!"),
        ("a | b stays text", "a | b stays text"),
        ("| Mon | | 20 |", "Mon, 20."),
    ],
    "links": [
        ("See [the docs](https://www.home-assistant.io/docs) now.", "See the docs now."),
        ('[**bold** link](http://x.org "a title")', "bold link"),
        ("![a cat](cat.png) sleeps", "a cat sleeps"),
        ("[just brackets] stay", "[just brackets] stay"),
    ],
    "urls": [
        ("Go to https://www.example.com/a?b=1.", "Go to example.com."),
        (
            "Or <https://example.org/x> and www.kazeia.dev/tts, ok",
            "Or example.org and kazeia.dev, ok",
        ),
        ("http://192.168.1.10:8123/lovelace", "192.168.1.10"),
        ("See https://en.wikipedia.org/wiki/Python_(language) now", "See en.wikipedia.org now"),
        ("mail foo@www.example.com now", "mail foo@www.example.com now"),
    ],
    "emoji": [
        ("Great job 🎉! Hi 👋 there 👍🏽", "Great job! Hi there"),
        ("🇫🇷 Bonjour ❤️", "Bonjour"),
        ("Family 👨‍👩‍👧 time", "Family time"),
        ("1️⃣ first", "1 first"),
        ("▶️ Play ©️ it", "Play it"),
        ("5 ✕ 3, ★ ✓ © stay: symbols", "5 ✕ 3, ★ ✓ © stay: symbols"),
        ("ශ්‍රී ලංකා", "ශ්‍රී ලංකා"),
    ],
    "html": [
        ("Line<br>two &amp; <b>bold</b> &nbsp;x", "Line two & bold x"),
        ("<p>One</p><p>Two</p>", "One Two"),
        ("a < b and c > d, 3 < 4", "a < b and c > d, 3 < 4"),
        ("x <!-- hidden --> y", "x y"),
        ("if a<b and c>d then", "if a<b and c>d then"),
        ("Replace <your-token> with it.", "Replace <your-token> with it."),
        ("Say &quot;Hello&quot;.", 'Say "Hello".'),
    ],
    "punctuation": [
        ("Really!!! What?!?! Wait.....", "Really! What?! Wait..."),
        ("Yes,, no;; maybe…… 好！！", "Yes, no; maybe… 好！"),
        ("Wait... ok", "Wait... ok"),
    ],
    "rules": [
        ("One\n\n---\n\nTwo", "One\n\n\n\nTwo"),
        ("Title\n=====\ntext", "Title\n\ntext"),
        ("***\ntext", "\ntext"),
    ],
    "untouched": [
        (
            "On 2026-12-01 at 10:30, 21.5 °C and 3 kWh.",
            "On 2026-12-01 at 10:30, 21.5 °C and 3 kWh.",
        ),
        ("Dr. Smith's 1st appointment.", "Dr. Smith's 1st appointment."),
        (r"C:\\Users\me, $5, v1.2.3, it's 2*x", r"C:\Users\me, $5, v1.2.3, it's 2*x"),
    ],
}
CASES = [(rule, text, said) for rule, cases in RULES.items() for text, said in cases]


@pytest.mark.parametrize(("rule", "text", "said"), CASES, ids=[f"{c[0]}:{c[1]!r}" for c in CASES])
def test_each_rule_makes_text_speakable(rule: str, text: str, said: str) -> None:
    assert speakable(text) == said


def streamed(pieces: list[str]) -> str:
    converter = SpeakableText()
    return "".join(converter.add(piece) for piece in pieces) + converter.finish()


@pytest.mark.parametrize(("rule", "text", "said"), CASES, ids=[f"{c[0]}:{c[1]!r}" for c in CASES])
def test_text_streamed_in_any_pieces_is_spoken_as_if_whole(rule: str, text: str, said: str) -> None:
    assert streamed(list(text)) == said  # a character at a time
    for cut in range(1, len(text)):
        assert streamed([text[:cut], text[cut:]]) == said, cut


def test_markup_split_across_pieces_is_undone() -> None:
    assert streamed(["It is **bo", "ld** now."]) == "It is bold now."
    assert streamed(["Open https://www.exa", "mple.com/path now"]) == "Open example.com now"
    fence = ["Here:\n```py", "thon\nprint(1)\n", "x = 2\n``", "`\nDone."]
    assert streamed(fence) == "Here:\n\nDone."
    assert streamed(["[the", " docs](https://x", ".org) here"]) == "the docs here"


def test_markup_never_delays_the_first_sentence() -> None:
    """The first sentence comes out of the splitter with the same piece as without markup."""
    pieces = ["**Good** morning! The ", "kitchen is ", "warm."]
    plain = ["Good morning! The ", "kitchen is ", "warm."]
    with_markup, without = StreamSentences(speakable=True), StreamSentences()
    for marked, bare in zip(pieces, plain, strict=True):
        assert with_markup.add(marked) == without.add(bare)
    assert with_markup.finish() == without.finish() == ["The kitchen is warm."]
    # Plain text is passed on at once, up to a tail that may still be markup.
    converter = SpeakableText()
    assert converter.add("The lights are on") == "The lights are on"
    assert converter.add(" and **") == " and"
    assert converter.add("dimmed**.") == " dimmed"
    assert converter.finish() == "."


def test_an_unclosed_bracket_is_text_after_a_bounded_wait() -> None:
    converter = SpeakableText()
    long_text = "word " * (MAX_HELD_CHARS // 5 + 2)
    out = converter.add("See [" + long_text)
    assert out.startswith("See [word word")  # not held for ever
    assert (out + converter.finish()).split() == ["See", "[word"] + ["word"] * (
        MAX_HELD_CHARS // 5 + 1
    )


def test_a_long_text_converts_in_linear_time() -> None:
    import time

    text = "**Bold** [link](http://x.org) and `code` 🎉! " * 20000
    start = time.monotonic()
    out = StreamSentences(speakable=True).add(text)
    assert time.monotonic() - start < 20
    assert out[0] == "Bold link and code!"
    for unit in (" ", "[", "`", "&", "http://", "*", "[a](", "<a "):  # held tails, openers
        stream, start = StreamSentences(speakable=True), time.monotonic()
        for _ in range(0, 200_000, 400):
            stream.add((unit * (400 // len(unit) + 1))[:400])
        stream.finish()
        assert time.monotonic() - start < 20, unit


# -- SSML ---------------------------------------------------------------------------------


def test_ssml_is_spoken_without_its_tags() -> None:
    document = (
        '<?xml version="1.0"?><speak version="1.1" xmlns="http://www.w3.org/2001/10/synthesis">'
        'Hello <emphasis level="strong">there</emphasis>, <say-as interpret-as="date">'
        '2026-12-01</say-as>. <sub alias="World Wide Web">WWW</sub>'
        '<prosody rate="slow">slowly</prosody><mark name="m"/><p>A paragraph.</p></speak>'
    )
    assert ssml_parts(document) == [
        "Hello there, 2026-12-01. World Wide Webslowly\n\nA paragraph.\n\n"
    ]
    assert ssml_parts("a fragment &amp; no root") == ["a fragment & no root"]


@pytest.mark.parametrize(
    ("tag", "seconds"),
    [
        ('<break time="500ms"/>', 0.5),
        ('<break time="1.5s"/>', 1.5),
        ('<break time="60s"/>', MAX_BREAK_S),
        ('<break strength="strong"/>', 0.75),
        ('<break strength="none"/>', 0.0),
        ("<break/>", 0.4),
    ],
)
def test_a_break_is_a_pause_of_its_length(tag: str, seconds: float) -> None:
    assert ssml_parts(f"<speak>One.{tag}Two.</speak>") == ["One.", Pause(seconds), "Two."]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("<speak>Hello <break></speak>", "malformed SSML"),
        ("<speak>unclosed", "malformed SSML"),
        ('<speak>a<break time="soon"/></speak>', "use e.g. 500ms"),
        ('<speak>a<break strength="huge"/></speak>', "use none|x-weak"),
        ("<?xml version='1.0'?><voice>x</voice>", "malformed SSML"),
    ],
)
def test_malformed_ssml_is_an_error(document: str, message: str) -> None:
    with pytest.raises(SsmlError, match=message):
        ssml_parts(document)


def test_ssml_nested_too_deeply_is_an_error_and_silence_is_bounded() -> None:
    with pytest.raises(SsmlError, match="nested too deeply"):
        ssml_parts("<s>" * 5000 + "x" + "</s>" * 5000)
    parts = ssml_parts("<speak>" + '<break time="10s"/>a.' * 1000 + "</speak>")
    assert sum(p.seconds for p in parts if isinstance(p, Pause)) == MAX_BREAKS_S


# -- through the engine ---------------------------------------------------------------------


def test_markdown_and_plain_text_give_the_same_greedy_codes(tiny_model: Path) -> None:
    engine = Engine(tiny_model, EngineSettings(max_frames=10, top_k=1, seed=3))
    pairs = [
        ("**Good** morning, _Anna_! 🎉", "Good morning, Anna!"),
        ("# Today\n- [Sunny](https://weather.example/today) 🌞", "Today.\nSunny."),
        ("| Room | Temp |\n|---|---|\n| Hall | 20 °C |", "Room, Temp.\n\nHall, 20 °C."),
    ]
    for marked, plain in pairs:
        assert speakable(marked) == plain
        with engine.synthesize(speakable(marked), "vivian", "english") as a:
            list(a)
        with engine.synthesize(plain, "vivian", "english") as b:
            list(b)
        assert len(a.codes) > 0 and np.array_equal(a.codes, b.codes), marked
        with engine.synthesize(marked, "vivian", "english") as raw:
            list(raw)  # the markup itself would be read: other tokens, other codes
        assert not np.array_equal(raw.codes, b.codes), marked
