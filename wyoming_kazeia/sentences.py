"""Text into the sentences the engine speaks one at a time: rhasspy's sentence-stream, fed so
that it stays linear on any input, with long runs without punctuation cut at a space."""

from __future__ import annotations

import asyncio

from sentence_stream import SentenceBoundaryDetector, stream_to_sentences

from .speakable import Pause, SpeakableText, ssml_parts

# A "sentence" longer than this (a text without punctuation) is cut at the last space or comma
# (ASCII or CJK) before the limit: the model is trained on sentences, and its prompt and KV
# cache stay small.
MAX_SENTENCE_CHARS = 400
# Text is made speakable and split into sentences this many characters at a time, other
# connections taking their turn between (a multiple of MAX_SENTENCE_CHARS: the same pieces as
# one split of the whole). A describe needs several turns of the event loop: a turn must be
# short (about a millisecond) for its answer to stay well under 100 ms.
TURN_CHARS = 2 * MAX_SENTENCE_CHARS


class StreamSentences:
    """The sentences of text streamed in chunks (rhasspy's sentence-stream), in linear time
    and with early audio whatever the text: its detector searches the whole text it holds on
    every chunk, so it is fed at most MAX_SENTENCE_CHARS at a time, and the text it holds
    without a sentence end (a markdown list, an answer without punctuation) is cut as
    split_sentences cuts it once it passes MAX_SENTENCE_CHARS. With `speakable`, the text is
    made speakable (`speakable.SpeakableText`) on its way to the detector."""

    def __init__(self, speakable: bool = False) -> None:
        self._detector = SentenceBoundaryDetector()
        self._speakable = SpeakableText() if speakable else None

    def add(self, chunk: str) -> list[str]:
        out: list[str] = []
        for at in range(0, len(chunk), MAX_SENTENCE_CHARS):
            piece = chunk[at : at + MAX_SENTENCE_CHARS]
            out += self._detect(piece if self._speakable is None else self._speakable.add(piece))
        return out

    def finish(self) -> list[str]:
        out = [] if self._speakable is None else self._detect(self._speakable.finish())
        return out + _split_held(self._detector.finish())

    def _detect(self, text: str) -> list[str]:
        out: list[str] = []
        for at in range(0, len(text), MAX_SENTENCE_CHARS):
            out.extend(self._detector.add_chunk(text[at : at + MAX_SENTENCE_CHARS]))
            held = self._detector.current_sentence + self._detector.remaining_text
            if len(held) > MAX_SENTENCE_CHARS:
                head, rest = _cut(held)
                out.append(head)
                self._detector.current_sentence, self._detector.remaining_text = "", rest
        return [s for s in out if s]


def _cut(text: str) -> tuple[str, str]:
    """The text before its last space or comma (ASCII or CJK) within MAX_SENTENCE_CHARS (or at
    MAX_SENTENCE_CHARS when it has none), and the rest."""
    head = text[:MAX_SENTENCE_CHARS]
    cut = max(head.rfind(c) for c in (" ", ",", "\uff0c", "\u3001"))  # also ， and 、
    cut = cut + 1 if cut > 0 else MAX_SENTENCE_CHARS
    return text[:cut].strip(), text[cut:].lstrip()


def split_sentences(text: str) -> list[str]:
    """The sentences of a text (rhasspy's sentence-stream), none over MAX_SENTENCE_CHARS, in
    linear time: fed to it as a stream (its search over the whole text it holds is quadratic
    in one piece: 350 s for 1 MB)."""
    sentences = StreamSentences()
    return sentences.add(text) + sentences.finish()


def _split_held(text: str) -> list[str]:
    """The sentences of a short text (what a stream holds at its end)."""
    pieces: list[str] = []
    for sentence in stream_to_sentences([text]):
        while len(sentence) > MAX_SENTENCE_CHARS:
            head, sentence = _cut(sentence)
            pieces.append(head)
        if sentence:
            pieces.append(sentence)
    return pieces


async def sentences_in_turns(stream: StreamSentences, text: str, end: bool = False) -> list[str]:
    """stream.add(text) (and with `end`, its last sentences), TURN_CHARS at a time with the
    other connections' turns between: splitting a megabyte takes longer than `describe` may
    wait, and a stop cancels it at the next turn."""
    sentences: list[str] = []
    for at in range(0, len(text), TURN_CHARS):
        if at:
            await asyncio.sleep(0)
        sentences += stream.add(text[at : at + TURN_CHARS])
    return sentences + stream.finish() if end else sentences


async def ssml_sentences(document: str) -> list[str | Pause]:
    """The sentences and pauses of an SSML document; SsmlError when it is malformed."""
    sentences: list[str | Pause] = []
    for part in ssml_parts(document):
        if isinstance(part, Pause):
            sentences.append(part)
        else:
            sentences += await sentences_in_turns(StreamSentences(), part, end=True)
    return sentences
