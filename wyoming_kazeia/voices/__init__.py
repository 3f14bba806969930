"""Voices as the Wyoming service advertises them: every speaker, in automatic language and in
each of the model's languages.

Home Assistant never sends a language: it lists the voices whose `languages` contain the
pipeline's language and sends the chosen voice's name. So a voice name carries both the speaker
and the language id the model is given:

    vivian        speaker vivian, automatic language (languages: every language code)
    vivian-fr     speaker vivian, the model's "french" language id (languages: ["fr"])

Speaker names may contain "_" (uncle_fu), never "-", so the name splits unambiguously. Dialect
entries of the model's language table (beijing_dialect, ...) are not voices of their own: the
engine applies a speaker's dialect by itself when the language is Chinese or automatic.

The voices of the library (cloned, described, instructed: voices/library.py) that the model
speaks are advertised the same way: `grandma` in its own default language (or automatic) and
`grandma-fr` in each other language.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .library import StoredVoice

from ..errors import VoiceError, quoted

# The default voice when none is configured: the official examples' speaker when the model has
# it, else the first speaker in alphabetical order (the order of the model's speaker table).
DEFAULT_SPEAKER = "vivian"

# The model's language names -> the codes Home Assistant uses for pipeline languages.
LANGUAGE_CODES = {
    "chinese": "zh",
    "english": "en",
    "german": "de",
    "italian": "it",
    "portuguese": "pt",
    "spanish": "es",
    "japanese": "ja",
    "korean": "ko",
    "french": "fr",
    "russian": "ru",
}


def model_language(language: str | None) -> str | None:
    """A --language value (a code such as fr, or a name such as french) as a model language
    name; None for automatic."""
    if language is None or language.strip().lower() == "auto":
        return None
    key = language.strip().lower().replace("_", "-").split("-")[0]
    for name, code in LANGUAGE_CODES.items():
        if key in (name, code):
            return name
    raise VoiceError(
        f"unknown language {quoted(language)}; valid languages: auto, "
        + ", ".join(f"{code} ({name})" for name, code in LANGUAGE_CODES.items())
    )


def language_code_of(name: str) -> str | None:
    """The language code a voice name carries (`vivian-fr` -> "fr"; `vivian` -> None), by the
    naming above, without a model."""
    speaker, _, code = name.strip().lower().rpartition("-")
    return code if speaker and code in LANGUAGE_CODES.values() else None


@dataclass(frozen=True)
class Voice:
    name: str
    speaker: str  # a built-in speaker ("" for a cloned or described voice)
    language: str  # a model language name, or "auto"
    codes: tuple[str, ...]  # the language codes Home Assistant may select this voice for
    stored: str | None = None  # the library voice it speaks with, if any

    @property
    def description(self) -> str:
        who = (self.stored or self.speaker).replace("_", " ").title()
        own = "own voice, " if self.stored is not None else ""
        if self.language == "auto":
            return f"{who} ({own}automatic language)"
        return f"{who} ({own}{self.language.title()})"


@dataclass(frozen=True)
class Choice:
    """What a request asked for: a built-in speaker, or a library voice (`stored`; its
    `speaker` is the built-in speaker of an instructed voice, else "")."""

    speaker: str
    language: str  # a model language name, or "auto"
    stored: str | None = None
    # A style instruction for a built-in speaker (a model that follows them: CustomVoice 1.7B)
    instruct: str | None = None


class VoiceCatalog:
    """The voices of one model, and the resolution of a Wyoming voice request."""

    def __init__(
        self, speakers: list[str], languages: list[str], stored: Sequence[StoredVoice] = ()
    ) -> None:
        self.speakers = list(speakers)
        # Dialects are chosen by the engine through the speaker (see the module docstring).
        self.languages = [lang for lang in languages if not lang.endswith("_dialect")]
        all_codes = tuple(LANGUAGE_CODES.get(lang, lang) for lang in self.languages)
        self.voices: list[Voice] = []
        for speaker in self.speakers:
            self.voices.append(Voice(speaker, speaker, "auto", all_codes))
            for lang, code in zip(self.languages, all_codes, strict=True):
                self.voices.append(Voice(f"{speaker}-{code}", speaker, lang, (code,)))
        names = {v.name for v in self.voices}
        self.stored = [s for s in stored if s.name not in names]  # a speaker's name wins
        # A library voice with a language of its own is not advertised a second time in that
        # language (`grandma-en` beside `grandma`, one label twice in a list); the name works.
        unlisted: list[Voice] = []
        for s in self.stored:
            own = s.language if s.language in self.languages else None
            codes = (LANGUAGE_CODES.get(own, own),) if own else all_codes
            self.voices.append(Voice(s.name, s.speaker or "", own or "auto", codes, s.name))
            for lang, code in zip(self.languages, all_codes, strict=True):
                voice = Voice(f"{s.name}-{code}", s.speaker or "", lang, (code,), s.name)
                (unlisted if lang == own else self.voices).append(voice)
        self._by_name = {v.name: v for v in [*self.voices, *unlisted]}
        self._language_by_code = {
            **{lang: lang for lang in self.languages},
            **dict(zip(all_codes, self.languages, strict=True)),
            "auto": "auto",
        }

    @property
    def default(self) -> str:
        """The voice used when none is configured (see DEFAULT_SPEAKER): else the first
        speaker, else the first library voice, else "" (no voices)."""
        if DEFAULT_SPEAKER in self.speakers:
            return DEFAULT_SPEAKER
        return self.speakers[0] if self.speakers else (self.stored[0].name if self.stored else "")

    def get(self, name: str) -> Voice:
        voice = self._by_name.get(name.strip().lower())
        if voice is None and not self.voices:
            raise VoiceError(
                "this model has no voices yet: add one with `python -m wyoming_kazeia.voices "
                "add NAME --audio FILE --text TRANSCRIPT` (a Base model clones it)"
            )
        if voice is None:
            raise VoiceError(
                f"unknown voice {quoted(name)}; valid voices: {', '.join(self._by_name)}"
            )
        return voice

    def choose(
        self,
        name: str | None,
        speaker: str | None = None,
        language: str | None = None,
        default: str | None = None,
    ) -> Choice:
        """The Choice of a request's voice name, speaker and language (see resolve)."""
        voice = self.get(name or default or self.default)
        if voice.stored is None:
            return Choice(*self.resolve(voice.name, speaker, language))
        if speaker and speaker.strip().lower() != voice.speaker:
            raise VoiceError(f"voice {voice.stored!r} is an own voice: it takes no speaker")
        chosen_language = voice.language
        if language:
            chosen_language = self._language(language)
        return Choice(voice.speaker, chosen_language, voice.stored)

    def resolve(
        self,
        name: str | None,
        speaker: str | None = None,
        language: str | None = None,
        default: str | None = None,
    ) -> tuple[str, str]:
        """(speaker, model language) for a request's voice name, speaker and language; unset
        parts come from the voice `default` (or the catalog's default voice)."""
        voice = self.get(name or default or self.default)
        chosen_speaker, chosen_language = voice.speaker, voice.language
        if speaker:
            chosen_speaker = speaker.strip().lower()
            if chosen_speaker not in self.speakers:
                raise VoiceError(
                    f"unknown speaker {quoted(speaker)}; valid speakers: {', '.join(self.speakers)}"
                )
        if language:
            chosen_language = self._language(language)
        return chosen_speaker, chosen_language

    def _language(self, language: str) -> str:
        # "fr", "fr-FR", "fr_FR", "french": the part before the region decides.
        key = language.strip().lower().replace("_", "-")
        found = self._language_by_code.get(key) or self._language_by_code.get(key.split("-")[0])
        if found is None:
            raise VoiceError(
                f"unknown language {quoted(language)}; valid languages: auto, "
                + ", ".join(f"{LANGUAGE_CODES.get(x, x)} ({x})" for x in self.languages)
            )
        return found
