"""The voice library: voices beyond the built-in speakers, kept in the data directory.

    DATA_DIR/voices/NAME/voice.json      what the voice is (kind, transcript, description, ...)
    DATA_DIR/voices/NAME/reference.wav   a clone's recording, mono float at the encoders' rate
    DATA_DIR/voices/NAME/prompt-*.npz    its prompt for one model (x-vector, reference codes,
                                         token ids), computed once and reused

Three kinds, each spoken by its own kind of model:
  clone     a recording (+ its transcript: in-context cloning; without: x-vector only) - Base
  design    a voice described in words - VoiceDesign
  instruct  a built-in speaker with a style instruction - CustomVoice 1.7B

A voice's prompt file is named by the model's encoders and tokenizer (Engine.voice_model_key)
and the recording's hash: a restart, or any request, reuses it; another model makes its own.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import shutil
import tempfile
import time
import unicodedata
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import soundfile as sf

from ..errors import InputError, KazeiaError, VoiceError, quoted
from ..files import check_regular, read_text
from . import recording
from .recording import Recording

if TYPE_CHECKING:
    from ..engine import Engine, VoicePrompt

_LOGGER = logging.getLogger(__name__)

KINDS = {"clone": "base", "design": "voice_design", "instruct": "custom_voice"}  # -> model kind
NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
VOICE_FILE = "voice.json"
REFERENCE_FILE = "reference.wav"

# The scripts of the models' languages (zh, en, de, es, fr, it, pt, ru, ja, ko): a transcript in
# another script (Arabic, Devanagari, Greek, ...) is in a language the models lack.
_SCRIPTS = ("LATIN", "CYRILLIC", "CJK", "HIRAGANA", "KATAKANA", "HANGUL", "FULLWIDTH")


def check_name(name: str) -> str:
    """`name` as a voice name (a safe file name: lowercase letters, digits, '_'), or
    VoiceError."""
    if not NAME.match(name):
        raise VoiceError(
            f"invalid voice name {quoted(name)}: use 1-32 lowercase letters, digits and '_', "
            "starting with a letter (e.g. grandma, my_voice_2)"
        )
    return name


def check_transcript(text: str) -> str:
    """The transcript of a recording, or InputError when no model language writes it."""
    text = text.strip()
    if not text:
        raise InputError("the transcript is empty: give the words of the recording, or none")
    for ch in text:
        if ch.isalpha() and not unicodedata.name(ch, "").startswith(_SCRIPTS):
            raise InputError(
                f"the transcript is written in a script the models do not speak ({ch!r}, "
                f"{unicodedata.name(ch, 'unknown').split()[0].title()}): they speak Chinese, "
                "English, French, German, Italian, Japanese, Korean, Portuguese, Russian and "
                "Spanish"
            )
    return text


@dataclass(frozen=True)
class StoredVoice:
    name: str
    kind: str  # a key of KINDS
    language: str | None = None  # its default language (a model language name), None: auto
    text: str | None = None  # clone: the recording's transcript (None: x-vector only)
    description: str | None = None  # design
    speaker: str | None = None  # instruct: the built-in speaker
    instruct: str | None = None  # instruct: the style
    audio_sha256: str | None = None  # clone: of reference.wav's samples
    seconds: float | None = None  # clone: the recording's length

    @property
    def model_kind(self) -> str:
        return KINDS[self.kind]

    @property
    def summary(self) -> str:
        if self.kind == "clone":
            mode = f'transcript "{self.text}"' if self.text else "x-vector only"
            return f"cloned from a {self.seconds:.1f} s recording, {mode}"
        if self.kind == "design":
            return f'described: "{self.description}"'
        return f'{self.speaker}, instructed: "{self.instruct}"'

    @classmethod
    def from_json(cls, data: Any, folder: Path) -> StoredVoice:
        if not isinstance(data, dict) or data.get("kind") not in KINDS:
            raise ValueError("not a voice description")
        fields: dict[str, Any] = {k: data.get(k) for k in cls.__dataclass_fields__}
        voice = cls(**fields)
        for key in ("name", "language", "text", "description", "speaker", "instruct"):
            value = getattr(voice, key)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"its {key} is not a text")
        if voice.name != folder.name:
            raise ValueError(f"its name {voice.name!r} is not its folder's")
        required = {"clone": ("audio_sha256",), "design": ("description",),
                    "instruct": ("speaker", "instruct")}[voice.kind]  # fmt: skip
        if any(not getattr(voice, key) for key in required):
            raise ValueError(f"a {voice.kind} voice without {', '.join(required)}")
        return voice


class VoiceLibrary:
    """The voices stored under DATA_DIR/voices (see the module docstring)."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir) / "voices"

    # -- adding and removing ----------------------------------------------------------------

    def add_clone(
        self, name: str, rec: Recording, text: str | None = None, language: str | None = None
    ) -> StoredVoice:
        voice = StoredVoice(
            name=check_name(name),
            kind="clone",
            language=language,
            text=check_transcript(text) if text is not None else None,
            audio_sha256=rec.sha256,
            seconds=round(rec.seconds, 3),
        )
        return self._store(voice, rec)

    def add_design(self, name: str, description: str, language: str | None = None) -> StoredVoice:
        if not description.strip():
            raise InputError("the description is empty: describe the voice in words")
        return self._store(
            StoredVoice(check_name(name), "design", language, description=description.strip())
        )

    def add_instruct(
        self, name: str, speaker: str, instruct: str, language: str | None = None
    ) -> StoredVoice:
        if not instruct.strip():
            raise InputError("the instruction is empty: say how the speaker should speak")
        voice = StoredVoice(
            check_name(name),
            "instruct",
            language,
            speaker=speaker.strip().lower(),
            instruct=instruct.strip(),
        )
        return self._store(voice)

    def _store(self, voice: StoredVoice, rec: Recording | None = None) -> StoredVoice:
        folder = self.root / voice.name
        if folder.exists():
            raise VoiceError(f"a voice named {voice.name!r} exists: remove it first")
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{voice.name}.", dir=self.root))
        try:
            if rec is not None:
                sf.write(tmp / REFERENCE_FILE, rec.samples, rec.rate, subtype="FLOAT")
            data = {k: v for k, v in asdict(voice).items() if v is not None}
            (tmp / VOICE_FILE).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
            tmp.chmod(0o755)
            tmp.rename(folder)  # atomic: a voice is there whole or not at all
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return voice

    def remove(self, name: str) -> None:
        folder = self.root / check_name(name)
        if not folder.is_dir():
            raise VoiceError(f"no voice named {name!r} in {self.root}")
        trash = folder.with_name(f".{name}.removed.{time.monotonic_ns()}")
        folder.rename(trash)  # atomic, then deleted
        shutil.rmtree(trash, ignore_errors=True)

    def rename(self, name: str, new: str) -> StoredVoice:
        """Voice `name` under the name `new`, its recording and stored prompts kept (they are
        named by model and recording, not by voice); VoiceError when there is no such voice or
        `new` is taken. The renamed voice is there whole before the old one goes."""
        folder = self.root / check_name(name)
        try:
            voice = StoredVoice.from_json(json.loads(read_text(folder / VOICE_FILE)), folder)
        except (OSError, ValueError, TypeError) as err:
            raise VoiceError(f"no usable voice named {name!r} in {self.root} ({err})") from None
        if (self.root / check_name(new)).exists():
            raise VoiceError(f"a voice named {new!r} exists: remove it first")
        tmp = Path(tempfile.mkdtemp(prefix=f".{new}.", dir=self.root))
        try:
            for path in folder.iterdir():
                if path.is_file() and path.name != VOICE_FILE:
                    shutil.copy2(path, tmp / path.name)
            renamed = dataclasses.replace(voice, name=new)
            data = {k: v for k, v in asdict(renamed).items() if v is not None}
            (tmp / VOICE_FILE).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
            tmp.chmod(0o755)
            tmp.rename(self.root / new)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self.remove(name)
        return renamed

    # -- reading ----------------------------------------------------------------------------

    def scan(self) -> tuple[list[StoredVoice], list[str]]:
        """The stored voices by name, and one message per folder that is not a usable voice
        (reported, skipped: the others keep working)."""
        voices, problems = [], []
        if not self.root.is_dir():
            return [], []
        for folder in sorted(self.root.iterdir()):
            if folder.name.startswith(".") or not folder.is_dir():
                continue
            try:
                data = json.loads(read_text(folder / VOICE_FILE))
                voice = StoredVoice.from_json(data, folder)
                if voice.kind == "clone" and not (folder / REFERENCE_FILE).is_file():
                    raise ValueError(f"{REFERENCE_FILE} is missing")
                voices.append(voice)
            except (OSError, ValueError, TypeError) as err:
                problems.append(f"voice {folder.name!r} in {self.root} is unusable: {err}")
        return voices, problems

    def signature(self) -> tuple[tuple[str, int, int], ...]:
        """Changes when a voice is added, removed or changed (the service rescans then); not
        when a prompt is stored beside a voice (that changes its folder, not the voice)."""
        if not self.root.is_dir():
            return ()

        def mtime(path: Path) -> int:
            try:
                return path.stat().st_mtime_ns
            except OSError:
                return -1

        return tuple(
            sorted(
                (p.name, mtime(p / VOICE_FILE), mtime(p / REFERENCE_FILE))
                for p in self.root.iterdir()
                if not p.name.startswith(".")
            )
        )

    def prepare(self, voices: Iterable[StoredVoice], engine: Engine) -> dict[str, VoicePrompt]:
        """The prompts of `voices` for `engine`'s model by name (computed where missing), with
        what their syntheses share readied (Engine.prepare_voice); a voice that fails is
        reported in the log and left out."""
        prompts = {}
        for voice in voices:
            try:
                prompt = self.prompt(voice, engine)
                engine.prepare_voice(prompt)
            except KazeiaError as err:
                _LOGGER.warning("voice %r: %s", voice.name, err)
                continue
            prompts[voice.name] = prompt
        return prompts

    def prompt(self, voice: StoredVoice, engine: Engine) -> VoicePrompt:
        """The voice's prompt for `engine`'s model: read from its file when computed before,
        else computed now (a clone in context takes seconds) and stored."""
        from ..engine import VoicePrompt

        folder = self.root / voice.name
        key = engine.voice_model_key + (f"-{voice.audio_sha256[:16]}" if voice.audio_sha256 else "")
        path = folder / f"prompt-{key}.npz"
        if path.is_file():
            try:
                with np.load(path) as z:
                    return VoicePrompt(
                        speaker=str(z["speaker"]),
                        instruct_ids=tuple(int(x) for x in z["instruct_ids"]),
                        speaker_embedding=z["speaker_embedding"]
                        if z["speaker_embedding"].size
                        else None,
                        ref_ids=tuple(int(x) for x in z["ref_ids"]),
                        ref_codes=z["ref_codes"] if z["ref_codes"].size else None,
                    )
            except (OSError, ValueError, KeyError) as err:
                _LOGGER.warning(
                    "the prompt of voice %r is unreadable (%s): computing it again", voice.name, err
                )
        t0 = time.monotonic()
        if voice.kind == "clone":
            try:
                reference = check_regular(folder / REFERENCE_FILE)
            except OSError as err:
                raise VoiceError(f"the recording of voice {voice.name!r}: {err}") from err
            samples, rate = sf.read(str(reference), dtype="float32")
            # Stored as the recording was checked: its sha256 is of these very samples.
            if voice.audio_sha256 != recording.check(samples, rate, voice.name, rate).sha256:
                raise VoiceError(
                    f"the recording of voice {voice.name!r} changed on disk: add it again"
                )
            made = engine.clone_prompt(samples, rate, voice.text)
        elif voice.kind == "design":
            made = engine.instruction_prompt(voice.description or "")
        else:
            made = engine.instruction_prompt(voice.instruct or "", speaker=voice.speaker or "")
        empty_f, empty_i = np.zeros(0, np.float32), np.zeros((0, 16), np.int32)
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(
            tmp,
            speaker=np.asarray(made.speaker),
            instruct_ids=np.asarray(made.instruct_ids, dtype=np.int64),
            speaker_embedding=made.speaker_embedding
            if made.speaker_embedding is not None
            else empty_f,
            ref_ids=np.asarray(made.ref_ids, dtype=np.int64),
            ref_codes=made.ref_codes if made.ref_codes is not None else empty_i,
        )
        tmp.replace(path)
        _LOGGER.info(
            "voice %r: prompt computed in %.2f s and stored", voice.name, time.monotonic() - t0
        )
        return made
