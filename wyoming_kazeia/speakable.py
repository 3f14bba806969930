"""Speakable text: a chat answer as a person would read it aloud, and SSML as its tags say.

Language models answer in Markdown, and Home Assistant hands their text to TTS as it is. This
step, between the Wyoming handler and the sentence splitter, drops what a reader would not say
and keeps every word (docs/speakable-text.md has the rules with examples):

- emphasis `*`, `**`, `_`, `__`, `~~`: the markers go, the words stay (a `*` between spaces or
  digits, `2 * 3`, and a `_` inside a word, `snake_case`, are not markers);
- headings, list items (bullets, numbers, task boxes), block quotes: the markers go, and a
  heading or an item that ends without punctuation ends as a sentence;
- inline code loses its backticks; a fenced code block is skipped whole;
- tables are read row by row, the header row too, cells separated by commas, a row a sentence;
  the separator row goes;
- `[text](url)` and `![alt](url)` are their text; a bare or <angle-bracketed> URL is its host
  (`https://www.example.com/a?b=1` -> `example.com`);
- emoji are dropped, in every language;
- HTML tags go, HTML entities are their characters;
- repeated punctuation is one mark (`!!!` -> `!`, `?!?!` -> `?!`, `.....` -> `...`);
- horizontal rules and setext underlines go; runs of spaces are one space.

Nothing else is rewritten: numbers, dates, times and units are left to the model.

Streamed text (`SpeakableText.add`) comes out as if it had come whole. Only what may still turn
out to be markup is held back until the text that decides it arrives: a run of `*`, `_` or `~`,
trailing punctuation or spaces, a word that may begin a URL, an unclosed `[...](...)` or `<tag`,
and the start of a line until its kind (heading, item, row, fence, rule) is known. The rest of a
sentence goes on at once, so markup never delays the first sentence's audio.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from urllib.parse import urlsplit
from xml.etree import ElementTree

from .errors import SsmlError

# An unclosed `[` or `<` stops being a possible link or tag past this many characters: it is
# then text, and what follows it is spoken without waiting for a close that never comes.
MAX_HELD_CHARS = 400
# The start of a line that is only marker characters is held at most this long.
MAX_LINE_START_CHARS = 200

_EMOJI = (
    "\U0001f000-\U0001faff"  # pictographs, emoticons, transport, symbols, regional letters
    "\u2600-\u27bf"  # miscellaneous symbols and dingbats
    "\u231a\u231b\u2328\u23cf\u23e9-\u23f3\u23f8-\u23fa\u2b05-\u2b07\u2b1b\u2b1c\u2b50\u2b55"
    "\u3030\u303d\u3297\u3299"
    "\ufe0e\ufe0f\u200d\u20e3"  # presentation selectors, the joiner, the keycap
    "\U000e0020-\U000e007f"  # the tags of subdivision flags
)
# Ends a heading, item or row as it is: anything else gets a full stop.
_SENTENCE_ENDS = ".!?;:…。！？；：,，、"
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u9fff\uf900-\ufaff]")

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
    r"|\|?[ \t]*:?-+:?[ \t]*(?:\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*)\n?"
)
_LINK = r"!?\[(?P<link>[^\]\n]*)\]\([ \t]*[^)\s]*(?:[ \t]+(?:\"[^\"\n]*\"|'[^'\n]*'))?[ \t]*\)"
_URL_START = r"(?<![\w/@.])(?:https?://|www\.)"
_INLINE = re.compile(
    r"(?P<escape>\\[!-/:-@\[-`{-~])"
    r"|(?P<comment><!--.*?-->)"
    rf"|<(?P<autolink>{_URL_START}[^\s<>]+)>"
    r"|(?P<tag></?[A-Za-z][A-Za-z0-9-]*(?:\s[^<>]*)?/?>)"
    rf"|{_LINK}"
    rf"|(?P<url>{_URL_START}[^\s<>\"'()\[\]]*[^\s<>\"'()\[\].,;:!?])"
    r"|(?P<entity>&(?:[A-Za-z][A-Za-z0-9]{1,31}|#[0-9]{1,7}|#[xX][0-9A-Fa-f]{1,6});)"
    r"|(?P<code>`+)"
    r"|(?P<delim>\*+|_+|~~+)"
    r"|(?P<punct>[!?！？]{2,}|\.{4,}|…{2,}|,{2,}|，{2,}|;{2,})"
    r"|(?P<pipe>[ \t]*\|[ \t]*)"
    rf"|(?P<emoji>[ \t]*[{_EMOJI}]+)"
)
# What may still become markup at the end of the text held: it waits for what follows.
_TAIL = re.compile(
    r"(?:\\.?|[*_~]+|[!?.…,;！？。，；]+|&[#A-Za-z0-9]*;?|[ \t]*\|[ \t]*|[ \t]+"
    rf"|{_URL_START}[^\s<>()\[\]]*"
    r"|(?<![\w/@.])(?:h(?:t(?:t(?:p(?:s)?(?::/?)?)?)?)?|ww?w?))\Z"
)
_OPENER = re.compile(r"(?<!\\)(?:!?\[|<(?=[A-Za-z/!]|\Z))")
_OPEN_LINK = re.compile(r"!?\[[^\]\n]*(?:\](?:\([^)\n]*)?)?\Z")
_OPEN_TAG = re.compile(r"<[^<>\n]*\Z")
# HTML elements that end a line or a block: a space where they were.
_BREAKING_TAGS = {"br", "p", "div", "li", "tr", "td", "th", "ul", "ol", "table", "blockquote"}
_BREAKING_TAGS |= {f"h{n}" for n in range(1, 7)}


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
        self._marker = ""  # the marker of the fence the current line opens
        self._before = "\n"  # the last character converted (its neighbour decides a `*`)
        self._line_last = ""  # the last character said on this line, not a space
        self._space = False  # a space is due before what is said next on this line

    def add(self, text: str) -> str:
        self._held += text.replace("\r", "")
        return self._convert(end=False)

    def finish(self) -> str:
        out = self._convert(end=True)
        self._reset()
        return out

    def _convert(self, end: bool) -> str:
        out: list[str] = []
        while self._held:
            newline = self._held.find("\n")
            if newline < 0 and not end:
                out.append(self._partial_line())
                break
            cut = len(self._held) if newline < 0 else newline + 1
            rest, self._held = self._held[cut:], self._held[:cut]
            out.append(self._whole_line())
            self._held = rest
        if end and self._kind is not None:  # a last line said whole before the end: its end
            out.append(self._whole_line())
        return "".join(out)

    # -- lines ------------------------------------------------------------------------------

    def _partial_line(self) -> str:
        """What can be said of the current line before its end."""
        if self._fence:
            inside = self._held.lstrip(" \t>")
            if self._kind == "code" or inside.strip(" \t" + self._fence[0]):
                self._kind, self._held = "code", ""  # not the closing fence: skipped
            return ""
        if self._kind is None:
            if len(self._held) < MAX_LINE_START_CHARS and _LINE_START.fullmatch(self._held):
                return ""
            self._decide()
        if self._kind == "fence":
            self._held = ""
            return ""
        out = ""
        while cut := _decided_end(self._held):
            segment, self._held = self._held[:cut], self._held[cut:]
            out += self._say(self._inline(segment, line_end=False))
        return out

    def _whole_line(self) -> str:
        """The rest of the current line (held), its newline included (none at the text's
        end)."""
        newline = "\n" if self._held.endswith("\n") else ""
        self._held = self._held[: len(self._held) - len(newline)]
        try:
            return self._line_end(newline)
        finally:
            self._held, self._kind, self._line_last, self._before = "", None, "", "\n"

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
            self._fence = self._marker
            return ""
        text = self._inline(self._held, line_end=True)
        if self._kind in ("item", "row"):
            text = text.rstrip(" \t")
            last = text.rstrip()[-1:] or self._line_last
            if last and last not in _SENTENCE_ENDS:
                text += "。" if _CJK.match(last) else "."
        return self._say(text + newline)

    def _decide(self) -> None:
        """The current line's kind, from its start, and its markers removed."""
        fence = _FENCE.match(self._held)
        if fence:
            self._kind, self._marker, self._held = "fence", fence.group(1), ""
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

    def _inline(self, segment: str, line_end: bool) -> str:
        out = _inline(segment, self._before, self._kind == "row", line_end)
        if segment:
            self._before = segment[-1]
        return out

    def _say(self, text: str) -> str:
        """Text as it goes out: runs of spaces are one, also across pieces, and no line starts
        or ends with one (a space is said once a word follows it)."""
        out: list[str] = []
        for at, line in enumerate(re.sub(r"[ \t]+", " ", text).split("\n")):
            if at:
                out.append("\n")
                self._space, self._line_last = False, ""
            words = line.strip(" ")
            if words:
                if (self._space or line[0] == " ") and self._line_last:
                    out.append(" ")
                out.append(words)
                self._line_last, self._space = words[-1], line[-1] == " "
            elif line:
                self._space = True
        return "".join(out)


def _inline(segment: str, before: str, row: bool, line_end: bool) -> str:
    """The speakable form of a decided segment of a line; `before` is the character before
    it, `row` says the line is a table row, `line_end` that the segment ends the line."""

    def replace(m: re.Match[str]) -> str:
        kind = m.lastgroup
        if kind == "escape":
            return m.group()[1]
        if kind in ("autolink", "url"):
            return _host(m.group(kind))
        if kind == "tag":
            name = re.match(r"</?([A-Za-z0-9-]+)", m.group())
            return " " if name and name.group(1).lower() in _BREAKING_TAGS else ""
        if kind == "link":
            return _inline(m.group("link"), " ", False, True)
        if kind == "entity":
            return html.unescape(m.group()).replace("\xa0", " ")
        if kind == "delim":
            start, end = m.span()
            prev = segment[start - 1] if start else before
            after = segment[end] if end < len(segment) else " "
            return m.group() if _literal(m.group(), prev, after) else ""
        if kind == "punct":
            return _one_mark(m.group())
        if kind == "pipe":
            if not row:
                return m.group()
            return "" if line_end and m.end() == len(segment) else ", "
        return ""  # a comment, a code marker, emoji and the spaces before them

    out = _INLINE.sub(replace, segment)
    return re.sub(r"(?:,[ \t]*){2,}", ", ", out) if row else out


def _decided_end(text: str) -> int:
    """How much of a line's text can be converted now: all but an unclosed link or tag and a
    tail that may still become markup."""
    end = len(text)
    for opener in _OPENER.finditer(text):
        rest = text[opener.start() :]
        if _OPEN_LINK.match(rest) or (rest.startswith("<") and _OPEN_TAG.match(rest)):
            if end - opener.start() > MAX_HELD_CHARS:
                return opener.end()  # text after all: said as it is
            end = opener.start()
            break
    tail = _TAIL.search(text, 0, end)
    return tail.start() if tail else end


def _literal(run: str, before: str, after: str) -> bool:
    """A `*`, `_` or `~` run that is not emphasis: `2 * 3`, `2*3`, `snake_case`, `~5`."""
    if run[0] == "~":
        return len(run) < 2
    if before.isspace() and after.isspace():
        return True
    if run[0] == "*":
        return before.isdigit() and after.isdigit()
    return before.isalnum() and after.isalnum()


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


# A <break> is at most this long (as SSML engines commonly cap it).
MAX_BREAK_S = 10.0
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
    body = text.strip()
    if not re.match(r"(?:<\?xml[^>]*\?>\s*)?<speak[\s>/]", body):
        body = f"<speak>{body}</speak>"
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as err:
        raise SsmlError(f"malformed SSML: {err}") from None
    parts: list[str | Pause] = []

    def say(words: str | None) -> None:
        if not words:
            return
        if parts and isinstance(parts[-1], str):
            parts[-1] += words
        else:
            parts.append(words)

    def walk(element: ElementTree.Element) -> None:
        name = _local(element.tag)
        if name == "break":
            parts.append(Pause(_break_seconds(element)))
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

    walk(root)
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
