"""Speakable text: a chat answer as a person would read it aloud, and SSML as its tags say.

Language models answer in Markdown, and Home Assistant hands their text to TTS as it is. This
step, between the Wyoming handler and the sentence splitter, drops what a reader would not say
and keeps every word; docs/speakable-text.md has the rules, with examples, and what is left to
the model (numbers, dates, units).

Streamed text (`SpeakableText.add`) comes out as if it had come whole. Only what may still turn
out to be markup is held back until the text that decides it arrives: a run of `*`, `_` or `~`,
repeated punctuation, a word that may begin a URL, an unclosed link, code span or tag (at most
MAX_HELD_CHARS), and the start of a line until its kind is known. The rest goes on at once, so
markup does not delay the first sentence.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from urllib.parse import urlsplit
from xml.etree import ElementTree

from .errors import SsmlError

# A construct that has not closed within this many characters (an unclosed `[`, `<` or code
# span, a tail such as a run of spaces) is text after all: said as it is, not held for ever.
MAX_HELD_CHARS = 400
# The start of a line that is only marker characters is held at most this long.
MAX_LINE_START_CHARS = 200

# Emoji shown as pictures by default (the pictograph planes and the BMP's emoji-presentation
# symbols); other symbols (★, ✓, ©) are emoji only with the presentation selector U+FE0F.
_PICTOGRAPHS = (
    "\U0001f000-\U0001faff"
    "\u231a\u231b\u23e9-\u23ec\u23f0\u23f3\u25fd\u25fe\u2614\u2615\u2648-\u2653\u267f\u2693"
    "\u26a1\u26aa\u26ab\u26bd\u26be\u26c4\u26c5\u26ce\u26d4\u26ea\u26f2\u26f3\u26f5\u26fa"
    "\u26fd\u2705\u270a\u270b\u2728\u274c\u274e\u2753-\u2755\u2757\u2795-\u2797\u27b0\u27bf"
    "\u2b1b\u2b1c\u2b50\u2b55"
)
# What continues an emoji: the selector, the joiner, skin tones, the tags of subdivision flags.
_EMOJI_PARTS = "\ufe0f\u200d\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f"
_SELECTED = r"[^\s\ufe0f#*0-9]\ufe0f"  # a symbol asked to show as an emoji (not a keycap's)
_EMOJI = rf"(?:[{_PICTOGRAPHS}]|{_SELECTED})(?:[{_PICTOGRAPHS}{_EMOJI_PARTS}]|{_SELECTED})*"
# Ends a heading, item or row as it is: anything else gets a full stop.
_SENTENCE_ENDS = ".!?;:…。！？；：,，、"
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]")
# After these, a space goes out at once: the sentence splitter ends a CJK sentence only once it
# sees what follows its mark.
_CJK_ENDS = "。！？"

# A line that is only these characters may still be a heading, item, rule, fence or table row.
_LINE_START = re.compile(r"[ \t>#*+\-_=~|:`\d.)\[\]xX•]*")
_FENCE = re.compile(r"[ \t]*(?:>[ \t]*)*(?:(?:[-*+]|\d{1,3}[.)])[ \t]+)?(`{3,}|~{3,})")
_PREFIX = re.compile(
    r"[ \t]*(?:>[ \t]*)*"
    r"(?:(?P<heading>#{1,6})(?:[ \t]+|$)"
    r"|(?P<item>(?:[-*+•]|\d{1,3}[.)])[ \t]+(?:\[[ xX]\][ \t]+)?))?"
    r"(?P<row>\|)?"
)
# Whole lines that say nothing: a horizontal rule, a setext underline, a table's separator row.
_RULE = re.compile(
    r"[ \t>]*(?:(?:[-*_][ \t]*){3,}|=+[ \t]*|-+[ \t]*"
    r"|\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*)"
)
# The HTML elements whose tags are dropped (another <word> is text: `<your-token>`), and those
# that end a line or block (a space where they were).
_BREAKING_TAGS = {"br", "p", "div", "li", "tr", "td", "th", "ul", "ol", "table", "blockquote", "hr"}
_BREAKING_TAGS |= {f"h{n}" for n in range(1, 7)}
_TAGS = _BREAKING_TAGS | {
    "a", "abbr", "b", "big", "cite", "code", "del", "details", "em", "font", "i", "img", "ins",
    "kbd", "mark", "pre", "q", "s", "small", "span", "strike", "strong", "sub", "summary", "sup",
    "tbody", "thead", "u", "center",
}  # fmt: skip
_URL_START = r"(?:https?://|www\.)"
_URL_CHAR = r"[^\s<>\"'()\[\]]"
# A URL, its balanced parentheses included (`wiki/Python_(language)`), not its last punctuation.
_URL = rf"{_URL_START}(?:{_URL_CHAR}|\({_URL_CHAR}*\))*(?:[^\s<>\"'()\[\].,;:!?]|\({_URL_CHAR}*\))"
_LINK = r"!?\[(?P<link>[^\]\n]*)\]\([ \t]*[^)\s]*(?:[ \t]+(?:\"[^\"\n]*\"|'[^'\n]*'))?[ \t]*\)"
_INLINE = re.compile(
    r"(?P<escape>\\[!-/:-@\[-`{-~])"
    r"|(?P<code>(?P<ticks>`+)(?P<code_text>.+?)(?<!`)(?P=ticks)(?!`))"
    r"|(?P<ticks_alone>`+)"
    r"|(?P<comment><!--.*?-->)"
    rf"|<(?P<autolink>{_URL_START}[^\s<>]+)>"
    r"|(?P<tag></?(?P<tag_name>[A-Za-z][A-Za-z0-9]*)(?:[ \t]*/?|[ \t]+[^<>]*=[^<>]*)>)"
    rf"|{_LINK}"
    rf"|(?<![\w/@.])(?P<url>{_URL})"
    r"|(?P<entity>&(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});)"
    r"|(?P<delim>\*+|_+|~~+)"
    r"|(?P<punct>[!?！？]{2,}|\.{4,}|…{2,}|,{2,}|，{2,}|;{2,})"
    r"|(?P<pipe>\|)"
    r"|(?P<keycap>[#*0-9])\ufe0f?\u20e3"
    rf"|(?P<emoji> ?{_EMOJI})"
    r"|(?P<emoji_part>[\ufe0f\u20e3])"
)
# What may still become markup at the end of the text held: it waits for what follows.
_TAIL = re.compile(
    rf"(?:\\|[*_~]+|[!?.…,;！？]+|&[#A-Za-z0-9]*(?:;[!?.…,;！？]*)?|[ \t]*\|[ \t]*"
    rf"|(?<![{_CJK_ENDS}])[ \t]+"
    rf"|(?<![\w/@.]){_URL_START}[^\s<>\[\]]*"
    r"|(?<![\w/@.])(?:h(?:t(?:t(?:p(?:s)?(?::/?)?)?)?)?|ww?w?)"
    r"|[#*0-9]\ufe0f?\u20e3?"
    rf"|[ \t]*(?:[\u00a9\u00ae\u2000-\u2bff\u3030\u303d\u3297\u3299]|{_EMOJI}))\Z"
)
_OPENER = re.compile(r"!?\[|<(?=[A-Za-z/!]|\Z)|`+")
_OPEN_LINK = re.compile(r"!?\[[^\]\n]*(?:\](?:\([^)\n]*)?)?\Z")
_CLOSED_LINK = re.compile(_LINK)
_OPEN_TAG = re.compile(r"<[^<>\n]*\Z")


def speakable(text: str) -> str:
    """The speakable form of a whole text."""
    converter = SpeakableText()
    return converter.add(text) + converter.finish()


class SpeakableText:
    """Converts text streamed in pieces; add() returns what is decided, finish() the rest."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._held = ""  # the current line's text not yet converted
        self._kind: str | None = None  # the current line's kind, once known
        self._fence = ""  # the open code fence's marker ("```", "~~~~"), "" outside one
        self._marker = ""  # the marker of the fence the current line may open
        self._info_at = 0  # where that line's info string starts in _held
        self._before = "\n"  # the last character converted (its neighbour decides a `*`)
        self._line_last = ""  # the last character said on this line, not a space
        self._space = False  # a space is due before what is said next on this line
        self._spaced = False  # that space went out already (after a CJK sentence's end)

    def add(self, text: str) -> str:
        out: list[str] = []
        text = text.replace("\r", "")
        start = 0
        while (newline := text.find("\n", start)) >= 0:
            self._held += text[start : newline + 1]
            out.append(self._whole_line())
            start = newline + 1
        self._held += text[start:]
        if self._held:
            out.append(self._partial_line())
        return "".join(out)

    def finish(self) -> str:
        out = self._whole_line() if self._held or self._kind is not None else ""
        self._reset()
        return out

    # -- lines ------------------------------------------------------------------------------

    def _partial_line(self) -> str:
        """What can be said of the current line before its end."""
        if self._fence:
            inside = self._held.lstrip(" \t>")
            if (
                self._kind == "code"
                or inside.strip(" \t" + self._fence[0])
                or (len(inside) > MAX_HELD_CHARS)
            ):
                self._kind, self._held = "code", ""  # not the closing fence: skipped
            return ""
        if self._kind is None:
            if len(self._held) < MAX_LINE_START_CHARS and _LINE_START.fullmatch(self._held):
                return ""
            self._decide()
        if self._kind == "fence":
            if self._opens_a_code_span():
                self._decide(fence=False)
            else:
                if len(self._held) - self._info_at > MAX_HELD_CHARS:  # its info is not said
                    self._held = self._held[: self._info_at]
                return ""
        return self._cut_and_say(line_end=False)

    def _cut_and_say(self, line_end: bool) -> str:
        """Says what is decided of the line held; with `line_end`, all of it."""
        out = []
        while cut := _decided_end(self._held, line_end):
            segment, self._held = self._held[:cut], self._held[cut:]
            last = line_end and not self._held
            out.append(self._say(self._inline(segment, self._held[:1] or " ", last)))
        return "".join(out)

    def _whole_line(self) -> str:
        """The rest of the current line (held), its newline included (none at the text's
        end)."""
        newline = "\n" if self._held.endswith("\n") else ""
        self._held = self._held[: len(self._held) - len(newline)]
        try:
            return self._line_end(newline)
        finally:
            self._held, self._kind, self._line_last, self._before = "", None, "", "\n"
            self._space = self._spaced = False

    def _line_end(self, newline: str) -> str:
        if self._fence:
            closing = rf"[ \t>]*{re.escape(self._fence[0])}{{{len(self._fence)},}}[ \t]*"
            if self._kind != "code" and re.fullmatch(closing, self._held):
                self._fence = ""
                return self._say(newline)
            return ""
        if self._kind is None:
            if self._held.strip() and _RULE.fullmatch(self._held):
                return self._say(newline)
            self._decide()
        if self._kind == "fence":
            if not self._opens_a_code_span():
                self._fence = self._marker
                return ""
            self._decide(fence=False)
        text = self._cut_and_say(line_end=True)
        if self._kind in ("item", "row") and self._line_last not in _SENTENCE_ENDS:
            text += "。" if _CJK.match(self._line_last) else "."
        return text + self._say(newline)

    def _opens_a_code_span(self) -> bool:
        """Whether the line taken for a backtick fence is ```code``` on one line after all (a
        backtick fence's info string has no backtick)."""
        return self._marker[0] == "`" and "`" in self._held[self._info_at :]

    def _decide(self, fence: bool = True) -> None:
        """The current line's kind, from its start, and its markers removed (a fence's are
        kept until the line's end shows it is one)."""
        opening = _FENCE.match(self._held) if fence else None
        if opening:
            self._kind, self._marker, self._info_at = "fence", opening.group(1), opening.end()
            return
        prefix = _PREFIX.match(self._held)
        assert prefix is not None  # every part of it is optional
        if prefix.group("row"):
            self._kind = "row"
        elif prefix.group("heading") or prefix.group("item"):
            self._kind = "item"
        else:
            self._kind = "text"
        self._held = self._held[prefix.end() :]

    # -- inline markup ------------------------------------------------------------------------

    def _inline(self, segment: str, after: str, line_end: bool) -> str:
        out = _inline(segment, self._before, after, self._kind == "row", line_end)
        if segment:
            self._before = segment[-1]
        return out

    def _say(self, text: str) -> str:
        """Text as it goes out: runs of spaces are one, also across pieces, and no line starts
        or ends with one (a space is said once a word follows it, or at once after a CJK
        sentence's end)."""
        out: list[str] = []
        for at, line in enumerate(re.sub(r"[ \t]+", " ", text).split("\n")):
            if at:
                out.append("\n")
                self._space, self._spaced, self._line_last = False, False, ""
            words = line.strip(" ")
            if self._kind == "row" and self._line_last in ("", ","):  # an empty cell: no comma
                words = words.lstrip(", ")
            if words:
                spaced = self._space or line[0] == " "
                if self._kind == "row" and words[0] == ",":  # a cell's end: `a, b`
                    spaced = False
                if spaced and self._line_last and not self._spaced:
                    out.append(" ")
                out.append(words)
                self._line_last, self._space, self._spaced = words[-1], line[-1] == " ", False
            elif line:
                self._space = True
            if self._space and self._line_last and self._line_last in _CJK_ENDS:
                if not self._spaced:
                    out.append(" ")
                self._space, self._spaced = False, True
        return "".join(out)


def _inline(segment: str, before: str, after: str, row: bool, line_end: bool) -> str:
    """The speakable form of a decided segment of a line; `before` and `after` are the
    characters around it (" " for none yet), `row` says the line is a table row, `line_end`
    that the segment ends the line."""

    text = before[-1:] + segment  # the lookbehinds see the character before the segment

    def replace(m: re.Match[str]) -> str:
        kind = m.lastgroup
        start, end = m.start() - 1, m.end() - 1  # in the segment
        prev = text[start]
        if kind == "escape":
            return m.group()[1]
        if kind == "code":
            return m.group("code_text")
        if kind in ("autolink", "url"):
            return _host(m.group(kind))
        if kind == "tag":
            name = m.group("tag_name").lower()
            if name not in _TAGS:
                return m.group()
            return " " if name in _BREAKING_TAGS else ""
        if kind == "link":
            return _inline(m.group("link"), " ", " ", False, True)
        if kind == "entity":
            return html.unescape(m.group()).replace("\xa0", " ")
        if kind == "delim":
            follows = segment[end] if end < len(segment) else after
            return m.group() if _literal(m.group(), prev, follows) else ""
        if kind == "punct":
            return _one_mark(m.group())
        if kind == "pipe":
            if not row:
                return m.group()
            return "" if line_end and end == len(segment) else ", "
        if kind == "keycap":
            return m.group("keycap")
        return ""  # a comment, a stray backtick, emoji and the space before them

    out, at = [], 1
    for m in _INLINE.finditer(text, 1):
        out += [text[at : m.start()], replace(m)]
        at = m.end()
    out.append(text[at:])
    said = "".join(out)
    return re.sub(r"[ \t]*(?:,[ \t]*)+", ", ", said) if row else said


def _decided_end(text: str, line_end: bool) -> int:
    """How much of a line's text can be converted now: all but an unclosed link, code span
    or tag and a tail that may still become markup (at the line's end, all of it, but for
    what MAX_HELD_CHARS makes text). A cut never splits an escape."""
    end = len(text)
    closed_to = 0  # the tail never starts inside a closed link
    for opener in _OPENER.finditer(text):
        start = opener.start()
        if start < closed_to:
            continue
        if _escapes_at(text, start):  # `\[` is text; `\![` an escaped `!` and a `[`
            if text[start] != "!":
                continue
            start += 1
        rest = text[start:]
        window = rest[: MAX_HELD_CHARS + 1]
        if rest[0] == "`":
            ticks = opener.group()
            closing = re.search(rf"(?<!`){ticks}(?!`)", window[len(ticks) :])
            if closing and closing.end() + len(ticks) < len(window):
                closed_to = start + len(ticks) + closing.end()
            is_open = closed_to <= start
        elif rest.startswith("<!--"):
            is_open = "-->" not in window
        elif rest[0] == "<":
            is_open = _OPEN_TAG.match(window) is not None
        else:
            closed = _CLOSED_LINK.match(window)
            if closed:
                closed_to = start + closed.end()
            is_open = _OPEN_LINK.match(window) is not None
        if not is_open:
            continue
        if len(rest) > MAX_HELD_CHARS:  # not closed within the limit: text after all
            return opener.end()
        if line_end:  # never closed: text
            continue
        end = start
        break
    if not line_end:
        tail = _TAIL.search(text, max(closed_to, end - MAX_HELD_CHARS), end)
        if tail and end - tail.start() < MAX_HELD_CHARS:
            end = tail.start()
    while end and end < len(text) and _escapes_at(text, end):
        end -= 1
    return end


def _escapes_at(text: str, at: int) -> bool:
    """Whether the character at `at` is escaped (an odd run of backslashes before it)."""
    run = len(text[:at]) - len(text[:at].rstrip("\\"))
    return run % 2 == 1


def _literal(run: str, before: str, after: str) -> bool:
    """A `*`, `_` or `~` run that is not emphasis: `2 * 3`, `2*x`, `snake_case`, `~5`,
    `*.log`: it touches no word, or is inside one."""
    if before.isspace() and after.isspace():
        return True
    if run[0] == "~":
        return len(run) < 2
    if before.isalnum() and after.isalnum():
        return True
    closing = before.isalnum() or before in ".!?,;:)]\"'`>…"
    opening = after.isalnum() or after in "([\"'`<"
    return not (closing or opening)


def _one_mark(run: str) -> str:
    """`!!!` -> `!`, `?!?!` -> `?!`, `.....` -> `...`."""
    if run[0] in ".…":
        return "..." if run[0] == "." else "…"
    return "".join(dict.fromkeys(run))


def _host(url: str) -> str:
    """A URL as it is said: its host, without `www.`."""
    host = urlsplit(url if "://" in url else "http://" + url).hostname or ""
    return host.removeprefix("www.") or "a link"


# -- SSML -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pause:
    """Silence of this many seconds, between sentences."""

    seconds: float


# A <break> is at most this long (as SSML engines commonly cap it), and a document's breaks
# together at most MAX_BREAKS_S: silence costs the engine thread its time too.
MAX_BREAK_S = 10.0
MAX_BREAKS_S = 60.0
_BREAK_STRENGTHS = {
    "none": 0.0,
    "x-weak": 0.1,
    "weak": 0.25,
    "medium": 0.4,
    "strong": 0.75,
    "x-strong": 1.2,
}
# Elements whose content is not spoken.
_UNSPOKEN = {"mark", "metadata", "desc", "lexicon"}
# Elements that are sentences or paragraphs of their own.
_BLOCKS = {"p", "s", "paragraph", "sentence"}


def ssml_parts(text: str) -> list[str | Pause]:
    """The texts and pauses of an SSML document (a `<speak>` root, or a fragment that is
    then read as if inside one). Every element's text is spoken; `<break>` is a pause of its
    `time` (`500ms`, `1.5s`) or `strength`; `<sub alias>` is its alias; `<p>` and `<s>` are
    sentences of their own; `<prosody>`, `<emphasis>`, `<say-as>`, `<phoneme>`, `<voice>` and
    `<lang>` are their text (the model has no exact control of rate, pitch or stress).
    SsmlError for a document that is not well-formed or a bad <break>."""
    body = text.strip().lstrip("\ufeff")
    if not re.match(r"(?:<\?xml[^>]*\?>\s*)?<speak[\s>/]", body):
        body = f"<speak>{body}</speak>"
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as err:
        raise SsmlError(f"malformed SSML: {err}") from None
    parts: list[str | Pause] = []
    words: list[str] = []  # the text since the last pause
    silence = [0.0]  # the breaks' seconds so far

    def say(text: str | None) -> None:
        if text:
            words.append(text)

    def pause(seconds: float) -> None:
        parts.append("".join(words))
        words.clear()
        parts.append(Pause(seconds))

    def walk(element: ElementTree.Element) -> None:
        name = _local(element.tag)
        if name == "break":
            seconds = min(_break_seconds(element), MAX_BREAKS_S - silence[0])
            silence[0] += seconds
            pause(seconds)
        elif name == "sub" and element.get("alias") is not None:
            say(element.get("alias"))
        elif name not in _UNSPOKEN:
            block = name in _BLOCKS
            if block:
                say("\n\n")
            say(element.text)
            for child in element:
                walk(child)
            if block:
                say("\n\n")
        say(element.tail)

    try:
        walk(root)
    except RecursionError:
        raise SsmlError("malformed SSML: elements nested too deeply") from None
    parts.append("".join(words))
    return [p for p in parts if isinstance(p, Pause) or p.strip()]


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _break_seconds(element: ElementTree.Element) -> float:
    time = element.get("time")
    if time is not None:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(ms|s)\s*", time)
        if not m:
            raise SsmlError(f"malformed SSML: <break time={time!r}>: use e.g. 500ms or 1.5s")
        seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
        return min(seconds, MAX_BREAK_S)
    strength = element.get("strength", "medium")
    if strength not in _BREAK_STRENGTHS:
        choices = "|".join(_BREAK_STRENGTHS)
        raise SsmlError(f"malformed SSML: <break strength={strength!r}>: use {choices}")
    return _BREAK_STRENGTHS[strength]
