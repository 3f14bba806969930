"""Engine settings: one validated object, settable from code and from KZTTS_* variables.

Every option of the engine lives here with its default, its environment variable and its
allowed values, so the CLI, the Wyoming server and the MQTT bridge all validate the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

QUANT_TYPES = ("f32", "f16", "q8_0", "q4_k")
BACKENDS = ("cpu",)


class SettingsError(ValueError):
    """An invalid setting; the message names it and its allowed values."""


def _opt(env: str, doc: str, allowed: str, **kw: Any) -> Any:
    return field(metadata={"env": env, "doc": doc, "allowed": allowed}, **kw)


@dataclass(frozen=True)
class EngineSettings:
    threads: int = _opt(
        "KZTTS_THREADS", "generator (talker + code predictor) threads", "1..64", default=2
    )
    decoder_threads: int = _opt(
        "KZTTS_DECODER_THREADS", "speech decoder threads", "1..64", default=2
    )
    quant: str = _opt(
        "KZTTS_QUANT",
        "weight type when a checkpoint is converted",
        "|".join(QUANT_TYPES),
        default="q8_0",
    )
    stream_chunk: int = _opt(
        "KZTTS_STREAM_CHUNK",
        "frames (80 ms each) per decoded audio chunk; 0 decodes once at the end",
        "0..64",
        default=4,
    )
    decoder_subprocess: bool = _opt(
        "KZTTS_DECODER_SUBPROC",
        "decode in a kazeia-decoder subprocess (one pass at the end)",
        "true|false",
        default=False,
    )
    seed: int | None = _opt(
        "KZTTS_SEED",
        "sampling seed (unset: random per synthesis)",
        "integer >= 0 or empty",
        default=None,
    )
    temperature: float | None = _opt(
        "KZTTS_TEMPERATURE", "sampling temperature (unset: model)", "> 0 or empty", default=None
    )
    top_k: int | None = _opt(
        "KZTTS_TOP_K", "top-k (unset: model; 0 disables)", "integer >= 0 or empty", default=None
    )
    top_p: float | None = _opt(
        "KZTTS_TOP_P", "top-p (unset: model)", "(0, 1] or empty", default=None
    )
    repetition_penalty: float | None = _opt(
        "KZTTS_REPETITION_PENALTY",
        "repetition penalty on code 0 (unset: model)",
        "> 0 or empty",
        default=None,
    )
    max_frames: int = _opt(
        "KZTTS_MAX_FRAMES",
        "frame cap per synthesis; 0: bound by text length",
        "integer >= 0",
        default=0,
    )
    # ggml from PyPI (libggml-python) ships only its CPU backend, and the decoder's own kernels
    # are CPU code: cpu is the one backend there is to offer.
    backend: str = _opt("KZTTS_BACKEND", "compute backend", "|".join(BACKENDS), default="cpu")

    def __post_init__(self) -> None:
        def bad(name: str) -> SettingsError:
            f = next(f for f in fields(self) if f.name == name)
            return SettingsError(
                f"invalid {name} ({f.metadata['env']}) = {getattr(self, name)!r}; "
                f"allowed: {f.metadata['allowed']}"
            )

        for name in ("threads", "decoder_threads"):
            if not 1 <= getattr(self, name) <= 64:
                raise bad(name)
        if self.quant not in QUANT_TYPES:
            raise bad("quant")
        if not 0 <= self.stream_chunk <= 64:
            raise bad("stream_chunk")
        if self.seed is not None and self.seed < 0:
            raise bad("seed")
        if self.temperature is not None and not self.temperature > 0:
            raise bad("temperature")
        if self.top_k is not None and self.top_k < 0:
            raise bad("top_k")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise bad("top_p")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise bad("repetition_penalty")
        if self.max_frames < 0:
            raise bad("max_frames")
        if self.backend not in BACKENDS:
            raise bad("backend")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> EngineSettings:
        """Defaults, then KZTTS_* variables of `env` (default os.environ), then `overrides`."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            raw = env.get(f.metadata["env"])
            if raw is not None:
                values[f.name] = _parse(f, raw)
        values.update(overrides)
        return cls(**values)

    def replace(self, **changes: Any) -> EngineSettings:
        """A validated copy with some settings changed (unknown names are an error)."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise SettingsError(f"unknown setting(s): {', '.join(sorted(unknown))}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def describe(cls) -> list[tuple[str, str, str, str]]:
        """(name, environment variable, allowed values, description) of every setting."""
        return [
            (f.name, f.metadata["env"], f.metadata["allowed"], f.metadata["doc"])
            for f in fields(cls)
        ]


def add_env_argument(
    group: argparse._ActionsContainer,
    flag: str,
    env: str,
    help: str,
    default: Any = None,
    **kwargs: Any,
) -> None:
    """A command-line flag whose default is environment variable `env`, else `default`; the
    help names both. A variable's text goes through `type` like a flag's, so a bad value is
    argparse's usual one-line error."""
    shown = "" if default is None else f"; default {default}"
    group.add_argument(
        flag, default=os.environ.get(env, default), help=f"{help} ({env}{shown})", **kwargs
    )


def parse_setting(name: str, raw: str) -> Any:
    """The value of setting `name` written as text (a flag or a command), validated for type
    (range checks happen when the settings object is built)."""
    matches = [f for f in fields(EngineSettings) if f.name == name]
    if not matches:
        raise SettingsError(f"unknown setting {name!r}")
    return _parse(matches[0], raw)


def _parse(f: dataclasses.Field[Any], raw: str) -> Any:
    text = raw.strip()
    kind = str(f.type)
    try:
        if "None" in kind and text == "":
            return None
        if kind.startswith("bool"):
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        return text
    except ValueError:
        raise SettingsError(
            f"invalid {f.metadata['env']}={raw!r} for {f.name}; allowed: {f.metadata['allowed']}"
        ) from None
