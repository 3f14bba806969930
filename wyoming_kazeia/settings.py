"""Engine settings: one validated object, settable from code and from KZTTS_* variables.

Every option of the engine lives here with its default, its environment variable and its
bounds (`Bounds`), declared once: the check, the help texts and the MQTT entities derive from
them, so the CLI, the Wyoming server and the MQTT bridge all validate the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from .errors import SettingsError
from .native import DECODER_GPU_CHUNK_FRAMES, DECODER_PRECISIONS, KV_CACHE_TYPES

# The talker's weight types (the converter's --type): ggml's, from most exact to smallest, and
# q4_k_mix: 4-bit talker attention and MLP, q8_0 elsewhere (docs/hardware.md "Which weight type"
# compares them).
QUANT_TYPES = ("f32", "f16", "q8_0", "q6_k", "q5_k", "q4_k", "q4_k_mix")
# The model parts that can each be placed on a device (their --<part>-backend settings).
PARTS = ("talker", "predictor", "decoder")


@dataclass(frozen=True)
class Bounds:
    """The values a setting allows, declared once: the check, the help text (`text()`) and
    the Home Assistant entity (`entity`) all derive from it."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False  # low itself is excluded ("> 0")
    choices: tuple[str, ...] = ()
    # A text setting's form, a regular expression the whole (lower-cased) value matches, and
    # that form in words for help texts.
    pattern: str = ""
    pattern_text: str = ""
    optional: bool = False  # may be unset (None: the model's value, or random)
    # The range Home Assistant's number entity offers: (min, max, step); defaults to (low,
    # high, 1) for a bounded integer.
    entity: tuple[float, float, float] | None = None

    def allows(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if self.choices:
            return value in self.choices
        if self.pattern:
            return isinstance(value, str) and re.fullmatch(self.pattern, value.lower()) is not None
        if isinstance(value, bool):
            return True
        if self.low is not None and not (value > self.low if self.low_open else value >= self.low):
            return False  # also rejects nan
        return self.high is None or value <= self.high

    def text(self, kind: type) -> str:
        """The allowed values in words: "1..64", "(0, 1] or empty", "f32|f16|q8_0|q4_k"."""
        if self.choices:
            shown = "|".join(self.choices)
        elif self.pattern:
            shown = self.pattern_text
        elif kind is bool:
            shown = "true|false"
        elif self.low is not None and self.high is not None:
            shown = (
                f"({_num(self.low)}, {_num(self.high)}]"
                if self.low_open
                else (f"{_num(self.low)}..{_num(self.high)}")
            )
        elif self.low is not None:
            op = ">" if self.low_open else ">="
            shown = f"{'integer ' if kind is int else ''}{op} {_num(self.low)}"
        else:
            shown = "any"
        return f"{shown} or empty" if self.optional else shown

    def entity_range(self) -> tuple[float, float, float]:
        if self.entity is not None:
            return self.entity
        if self.low is None or self.high is None:
            raise SettingsError("this setting has no bounded range to offer")
        return (self.low, self.high, 1)


# Where a model part computes: the CPU, a GPU that a ggml built with Vulkan or CUDA sees
# (script/setup --backend vulkan|cuda), or "auto", the best device present. Whether the device
# is there is checked at start (engine.resolve_placements), where the devices are known.
PLACEMENT = Bounds(
    pattern=r"cpu|auto|(vulkan|cuda)(:\d+)?", pattern_text="cpu|auto|vulkan[:N]|cuda[:N]"
)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _opt(env: str, doc: str, bounds: Bounds, advanced: bool = False, **kw: Any) -> Any:
    """A setting: its variable, its help, its bounds; `advanced` ones are developer knobs
    (listed apart in --help)."""
    return field(metadata={"env": env, "doc": doc, "bounds": bounds, "advanced": advanced}, **kw)


def _part_placement(part: str, what: str, unset: str = "backend") -> Any:
    """The placement setting of one model part (PARTS); `unset` says where the part computes
    without one (EngineSettings.placement decides it)."""
    return _opt(
        f"KZTTS_{part.upper()}_BACKEND",
        f"where the {what} computes (unset: {unset})",
        dataclasses.replace(PLACEMENT, optional=True),
        advanced=True,
        default=None,
    )


def usable_cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass(frozen=True)
class EngineSettings:
    # The default is twice the 2 cores of the smallest box we size for: the generator's tasks
    # are taken from a shared counter, so spare threads cost nothing unloaded, and when other
    # processes compete for the cores each runnable thread is one more claim on them (with as
    # many threads as cores, the slowdown under load varies from run to run).
    threads: int = _opt(
        "KZTTS_THREADS",
        "generator (talker + code predictor) threads",
        Bounds(1, 64),
        default=4,
    )
    decoder_threads: int = _opt(
        "KZTTS_DECODER_THREADS", "speech decoder threads", Bounds(1, 64), default=2
    )
    # f32 is the official model's arithmetic; bf16 makes the decoder much faster where the CPU
    # has AMX, faster on AMD CPUs with AVX-512 BF16, and slower elsewhere
    # (docs/hardware.md has the figures and the error).
    decoder_precision: str = _opt(
        "KZTTS_DECODER_PRECISION",
        "how the speech decoder multiplies on the CPU: f32 (the official model's arithmetic), "
        "or bf16 (rounded to 8 significant bits: faster on CPUs with AMX, and on AMD CPUs with "
        "AVX-512 BF16)",
        Bounds(choices=DECODER_PRECISIONS),
        default="f32",
    )
    # f16 halves the bytes each step of a long answer reads (the talker attends to every earlier
    # frame); auto takes it only with quantized weights, whose rounding is far larger, so that
    # f32 weights keep the official model's arithmetic (docs/hardware.md has the error).
    kv_cache_type: str = _opt(
        "KZTTS_KV_CACHE_TYPE",
        "the talker's K/V cache: f32 (the official model's arithmetic), f16 (half the memory and "
        "the reads of a long answer), or auto (f16 with quantized weights, else f32)",
        Bounds(choices=KV_CACHE_TYPES),
        default="auto",
    )
    quant: str = _opt(
        "KZTTS_QUANT",
        "weight type when a checkpoint is converted",
        Bounds(choices=QUANT_TYPES),
        default="q8_0",
    )
    # The default is the width of a decoder graph on a GPU (native speech_decoder.h): every
    # push then fills a graph, none computes padding.
    stream_chunk: int = _opt(
        "KZTTS_STREAM_CHUNK",
        "frames (80 ms each) per decoded audio chunk; 0: the audio in one piece at the end",
        Bounds(0, 64),
        default=DECODER_GPU_CHUNK_FRAMES,
    )
    speakable_text: bool = _opt(
        "KZTTS_SPEAKABLE_TEXT",
        "read Markdown, HTML, links and emoji as a person would (false: the text as sent)",
        Bounds(),
        default=True,
    )
    prebuffer: bool = _opt(
        "KZTTS_PREBUFFER",
        "hold an answer's first audio just long enough that it then plays without a gap: on a box "
        "slower than real time until the rest can follow, on a faster one until the next chunk is "
        "made (false: audio goes out as it comes)",
        Bounds(),
        default=True,
    )
    decoder_subprocess: bool = _opt(
        "KZTTS_DECODER_SUBPROC",
        "decode in a kazeia-decoder child process started with each synthesis",
        Bounds(),
        advanced=True,
        default=False,
    )
    seed: int | None = _opt(
        "KZTTS_SEED",
        "sampling seed (unset: random per synthesis)",
        Bounds(0, optional=True),
        advanced=True,
        default=None,
    )
    temperature: float | None = _opt(
        "KZTTS_TEMPERATURE",
        "sampling temperature (unset: model)",
        # Home Assistant offers the useful range; the engine accepts any value > 0.
        Bounds(0, low_open=True, optional=True, entity=(0.05, 2.0, 0.05)),
        default=None,
    )
    top_k: int | None = _opt(
        "KZTTS_TOP_K",
        "top-k (unset: model; 0 disables)",
        Bounds(0, optional=True),
        default=None,
    )
    top_p: float | None = _opt(
        "KZTTS_TOP_P",
        "top-p (unset: model)",
        Bounds(0, 1, low_open=True, optional=True),
        default=None,
    )
    repetition_penalty: float | None = _opt(
        "KZTTS_REPETITION_PENALTY",
        "repetition penalty on code 0 (unset: model)",
        Bounds(0, low_open=True, optional=True),
        advanced=True,
        default=None,
    )
    max_frames: int = _opt(
        "KZTTS_MAX_FRAMES",
        "frame cap per synthesis; 0: bound by text length",
        Bounds(0),
        advanced=True,
        default=0,
    )
    # The default install's ggml has only its CPU backend (a GPU one is an opt-in build), so
    # the default stays the CPU; a part's own setting overrides this one.
    backend: str = _opt(
        "KZTTS_BACKEND",
        "where the talker, code predictor and speech decoder compute (unless their own "
        "settings say; a decoder_subprocess decoder computes on the CPU)",
        PLACEMENT,
        default="cpu",
    )
    talker_backend: str | None = _part_placement("talker", "talker")
    predictor_backend: str | None = _part_placement("predictor", "code predictor")
    decoder_backend: str | None = _part_placement(
        "decoder", "speech decoder", "backend; with decoder_subprocess, the CPU"
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            if not f.metadata["bounds"].allows(getattr(self, f.name)):
                raise SettingsError(
                    f"invalid {f.name} ({f.metadata['env']}) = {getattr(self, f.name)!r}; "
                    f"allowed: {_allowed(f)}"
                )

    def placement(self, part: str) -> str:
        """Where model part `part` (one of PARTS) computes, as set: its own setting, else
        `backend` (but the CPU for the decoder of a kazeia-decoder process, which has no GPU
        path), lower-cased, not yet resolved to a device."""
        own: str | None = getattr(self, f"{part}_backend")
        in_process = not (part == "decoder" and self.decoder_subprocess)
        return (own or (self.backend if in_process else "cpu")).lower()

    @staticmethod
    def is_advanced(name: str) -> bool:
        """A developer knob rather than a user's setting."""
        return bool(_field(name).metadata["advanced"])

    @staticmethod
    def bounds(name: str) -> Bounds:
        """The declared bounds of setting `name`."""
        bounds: Bounds = _field(name).metadata["bounds"]
        return bounds

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
        return [(f.name, f.metadata["env"], _allowed(f), f.metadata["doc"]) for f in fields(cls)]


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
    shown = "" if default is None else f"; default {default}".replace("%", "%%")
    group.add_argument(
        flag, default=os.environ.get(env, default), help=f"{help} ({env}{shown})", **kwargs
    )


def parse_setting(name: str, raw: str, origin: str | None = None) -> Any:
    """The value of setting `name` written as text (a flag or a command), validated for type
    and bounds; an error names `origin` (e.g. "--threads"), by default the variable."""
    f = _field(name)
    value = _parse(f, raw, origin)
    if origin is not None and not f.metadata["bounds"].allows(value):
        raise SettingsError(f"invalid {origin} {raw!r}; allowed: {_allowed(f)}")
    return value


def env_flag(env: str) -> bool:
    """A true/false environment variable (unset: false); SettingsError names it."""
    raw = os.environ.get(env, "").strip().lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("", "0", "false", "no", "off"):
        return False
    raise SettingsError(f"invalid {env}={raw!r}; allowed: true|false")


def _field(name: str) -> dataclasses.Field[Any]:
    for f in fields(EngineSettings):
        if f.name == name:
            return f
    raise SettingsError(f"unknown setting {name!r}")


def _kind(f: dataclasses.Field[Any]) -> type:
    """The value type of a setting (its annotation without "| None")."""
    text = str(f.type)
    return next((k for k in (bool, int, float) if text.startswith(k.__name__)), str)


def _allowed(f: dataclasses.Field[Any]) -> str:
    text: str = f.metadata["bounds"].text(_kind(f))
    return text


def _parse(f: dataclasses.Field[Any], raw: str, origin: str | None = None) -> Any:
    text = raw.strip()
    kind = _kind(f)
    try:
        if f.metadata["bounds"].optional and text == "":
            return None
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(text)
        if kind is int:
            return int(text)
        if kind is float:
            return float(text)
        return text
    except ValueError:
        where = f"{f.metadata['env']}={raw!r}" if origin is None else f"{origin} {raw!r}"
        raise SettingsError(f"invalid {where} for {f.name}; allowed: {_allowed(f)}") from None
