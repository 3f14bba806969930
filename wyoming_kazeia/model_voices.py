"""Which voices each loaded model speaks: the main model's and a second model's for the library
voices the main one does not speak, and what a look at the voice library found."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import Engine, follows_instructions
from .errors import ModelNotFoundError
from .files import read_text
from .voices.library import StoredVoice


@dataclass(frozen=True)
class ModelVoices:
    """Which library voices a model speaks: clones need a Base model, described voices a
    VoiceDesign model, instructed ones a CustomVoice 1.7B model with that speaker."""

    kind: str
    speakers: tuple[str, ...]
    follows_instructions: bool

    @classmethod
    def of_engine(cls, engine: Engine) -> ModelVoices:
        return cls(engine.kind, tuple(engine.speakers), engine.follows_instructions)

    @classmethod
    def of_folder(cls, model_dir: Path) -> ModelVoices:
        """From a converted model's config.json (copied by the converter): for a model that is
        not loaded yet."""
        try:
            config = json.loads(read_text(model_dir / "config.json"))
            kind, size = str(config["tts_model_type"]), str(config.get("tts_model_size", ""))
            speakers = tuple(str(s).lower() for s in config["talker_config"]["spk_id"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ModelNotFoundError(
                f"{model_dir}/config.json: cannot tell its kind ({err})"
            ) from err
        return cls(kind, speakers, follows_instructions(kind, size))

    def speaks(self, voice: StoredVoice) -> bool:
        if voice.model_kind != self.kind:
            return False
        return voice.kind != "instruct" or (
            self.follows_instructions and (voice.speaker or "") in self.speakers
        )


@dataclass
class VoiceModel:
    """A second model, for the library voices the main model does not speak (e.g. a Base model
    for cloned voices beside the CustomVoice speakers): loaded on the first request for one of
    its voices, then kept."""

    name: str  # for the log
    voices: ModelVoices
    load: Callable[[], Engine]
    engine: Engine | None = None


@dataclass(frozen=True)
class LibraryLook:
    """What a look at the voice library found (see VoiceLibrary)."""

    signature: Any
    found: list[StoredVoice]
    problems: list[str]
