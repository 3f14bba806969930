"""Streaming engine: text in, 24 kHz int16 PCM chunks out while the model is still generating.

    engine = Engine(model_dir, EngineSettings.from_env())
    synthesis = engine.synthesize("Hello there.", speaker="vivian")
    for chunk in synthesis:          # np.int16 arrays, the first long before the text is done
        play(chunk)
    print(synthesis.metrics)

Voices beyond the built-in speakers (a cloned, described or instructed voice) are a
VoicePrompt, made once per voice and passed to synthesize(voice=...).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .convert import TOKENIZER_FILES
from .decoder_process import DecoderProcess
from .errors import InputError, ModelNotFoundError, SettingsError, quoted
from .native import (
    CoreShare,
    Generator,
    SpeakerEncoder,
    SpeechDecoder,
    SpeechEncoder,
    Voice,
    read_decoder_hparams,
    resolve_placement,
    tool_path,
)
from .settings import PARTS, EngineSettings, usable_cpus
from .synthesis import Pipeline, Synthesis
from .tokenizer import TextTokenizer
from .voices.recording import resample

_LOGGER = logging.getLogger(__name__)

# How long the decoder subprocess may take to answer a push before it is killed: a base (process
# start, model load) and a time per frame, both far above what a small CPU takes.
SUBPROCESS_BASE_S = 30.0
SUBPROCESS_PER_FRAME_S = 0.5
# In-context voices whose decoder state (after their reference codes) is kept in memory.
PRIMED_VOICES = 8
# What the engine has loaded follows these settings: a synthesis cannot change them, only
# apply_settings (which reloads the part they concern).
LOADED_SETTINGS = (
    "threads",
    "kv_cache_type",
    "decoder_threads",
    "decoder_precision",
    "backend",
) + tuple(f"{part}_backend" for part in PARTS)


def follows_instructions(kind: str, size: str) -> bool:
    """Whether a model of this kind (config.json tts_model_type) and size (tts_model_size)
    takes a style instruction: VoiceDesign, and CustomVoice 1.7B (the official code drops the
    0.6B's)."""
    return kind == "voice_design" or (kind == "custom_voice" and size != "0b6")


@dataclass(frozen=True, eq=False)
class VoicePrompt:
    """What the engine needs to speak with a voice beyond a built-in speaker (each model kind
    takes its own, see native.Voice): a CustomVoice 1.7B speaker with instruction ids, a
    VoiceDesign description's ids, or a Base clone's x-vector (and, in context, the reference
    transcript's ids and the reference recording's codes [T, 16])."""

    speaker: str = ""
    instruct_ids: tuple[int, ...] = ()
    speaker_embedding: np.ndarray | None = None
    ref_ids: tuple[int, ...] = ()
    ref_codes: np.ndarray | None = None

    @property
    def in_context(self) -> bool:
        return self.ref_codes is not None

    def native(self) -> Voice:
        return Voice(
            instruct_ids=np.asarray(self.instruct_ids, dtype=np.int64)
            if self.instruct_ids
            else None,
            speaker_embedding=self.speaker_embedding,
            ref_ids=np.asarray(self.ref_ids, dtype=np.int64) if self.ref_ids else None,
            ref_codes=self.ref_codes,
        )


def resolve_placements(settings: EngineSettings) -> dict[str, str]:
    """The device each model part computes on, by part ("talker": "vulkan:0", ...), as
    `settings` place them. SettingsError, in one line that lists the devices this build sees
    here, when one is not here, or when a GPU is named for a decoder that runs as a
    kazeia-decoder process (which decodes on the CPU)."""
    devices = {}
    for part in PARTS:
        wanted = settings.placement(part)
        try:
            devices[part] = resolve_placement(wanted)
        except ValueError as err:
            raise SettingsError(f"{part}_backend {wanted!r}: {err}") from None
    if settings.decoder_subprocess and devices["decoder"] != "cpu":
        raise SettingsError(
            f"decoder_backend {settings.placement('decoder')!r}: the kazeia-decoder process of "
            "decoder_subprocess decodes on the CPU; unset one of the two"
        )
    return devices


class Engine:
    """A loaded model: talker.gguf, decoder.gguf and the tokenizer of a converted directory."""

    def __init__(self, model_dir: str | Path, settings: EngineSettings | None = None) -> None:
        self.model_dir = Path(model_dir)
        self.settings = settings or EngineSettings()
        for name in ("talker.gguf", "decoder.gguf"):
            if not (self.model_dir / name).is_file():
                raise ModelNotFoundError(
                    f"{self.model_dir} has no {name}: convert a checkpoint with "
                    "`python -m wyoming_kazeia.convert CHECKPOINT_DIR OUT_DIR`"
                )
        # What the model files were when loaded: a file changed on disk is loaded again
        # before the next synthesis (refresh), never used half old, half new.
        self._files = self._file_states()
        self.devices = resolve_placements(self.settings)  # SettingsError when one is not here
        # Generator and decoder compute at the same time while streaming: their idle workers
        # yield the cores to each other ("polite" pools), and while a decoder push would take
        # every core beside a frame being generated, the generator computes on one thread and
        # the push on the other cores (CoreShare).
        self._core_share = CoreShare()
        self.generator = self._load_generator(self.settings, self.devices)
        # The in-process decoder (hundreds of MB) is loaded only where it decodes: with the
        # subprocess placement the kazeia-decoder process holds the only copy.
        # The decoder's facts come from its file, checked now (not per synthesis) also when the
        # subprocess decodes: its header and tensor table through a memory map, no weights read.
        decoder_hp = read_decoder_hparams(str(self.model_dir / "decoder.gguf"))
        self.sample_rate: int = decoder_hp.sample_rate  # Hz of the PCM the engine yields
        self.hop_length: int = decoder_hp.hop_length  # samples per frame
        self._decoder: SpeechDecoder | None = None
        if not self.settings.decoder_subprocess:
            self._decoder = self._load_decoder(self.settings.decoder_threads)
        self.tokenizer = TextTokenizer.from_dir(self.model_dir)
        self._voice_model_key: str | None = None  # (voice_model_key)
        # Decoder states after in-context voices' reference codes (continue_after), by the
        # codes' hash, most recent last.
        self._primed: dict[bytes, bytes] = {}
        self._primed_lock = threading.Lock()
        # The kazeia-decoder command of the subprocess placement (a list, for tests to wrap),
        # and its deadline: a base and a time per frame.
        self.decoder_command = [str(tool_path("kazeia-decoder"))]
        self.subprocess_base_s = SUBPROCESS_BASE_S
        self.subprocess_per_frame_s = SUBPROCESS_PER_FRAME_S

    def _file_states(self) -> dict[str, tuple[int, int, int]]:
        states = {}
        for name in ("talker.gguf", "decoder.gguf"):
            st = (self.model_dir / name).stat()
            states[name] = (st.st_ino, st.st_size, st.st_mtime_ns)
        return states

    def refresh(self) -> None:
        """Loads the model files again if they changed on disk since they were loaded (e.g.
        replaced by a new conversion, or truncated by `cp` over them) or the talker's mapping
        found its file changed during a synthesis; ModelError when they cannot be loaded now
        (then the next call tries again). Call it only while no synthesis runs."""
        try:
            changed = self._file_states() != self._files
        except OSError as err:
            raise ModelNotFoundError(f"the model files of {self.model_dir}: {err}") from err
        if not (changed or self.generator.damaged):
            return
        _LOGGER.warning("the model files in %s changed on disk: loading them again", self.model_dir)
        files = self._file_states()
        # The new generator loads while the old one still holds its copies of the weights (both
        # for a moment), so that the engine keeps a model when the files cannot be loaded.
        self.generator = self._load_generator(self.settings, self.devices)
        decoder_hp = read_decoder_hparams(str(self.model_dir / "decoder.gguf"))
        self.sample_rate, self.hop_length = decoder_hp.sample_rate, decoder_hp.hop_length
        if self._decoder is not None:
            self._decoder = self._load_decoder(self.settings.decoder_threads)
        with self._primed_lock:
            self._primed.clear()
        self._voice_model_key = None
        self._files = files

    def _load_generator(self, settings: EngineSettings, devices: dict[str, str]) -> Generator:
        generator = Generator(
            str(self.model_dir / "talker.gguf"),
            threads=settings.threads,
            polite=True,
            talker_device=devices["talker"],
            predictor_device=devices["predictor"],
            core_share=self._core_share,
        )
        generator.kv_cache_type = settings.kv_cache_type
        return generator

    def _load_decoder(self, threads: int) -> SpeechDecoder:
        return SpeechDecoder(
            str(self.model_dir / "decoder.gguf"),
            threads=threads,
            polite=True,
            device=self.devices["decoder"],
            precision=self.settings.decoder_precision,
            core_share=self._core_share,
        )

    @property
    def decoder(self) -> SpeechDecoder:
        """The in-process speech decoder, loaded on first use."""
        if self._decoder is None:
            self._decoder = self._load_decoder(self.settings.decoder_threads)
        return self._decoder

    def apply_settings(self, settings: EngineSettings) -> None:
        """Makes `settings` the defaults of the next syntheses. Call it only while no synthesis
        runs. The generator takes a new thread count and K/V cache type as they are (each
        generation makes its own threads and cache); a changed placement loads it again (its
        weights move to the new device). The decoder owns its threads, so a changed count
        reloads it, when next used."""
        devices = resolve_placements(settings)
        if any(devices[p] != self.devices[p] for p in ("talker", "predictor")):
            self.generator = self._load_generator(settings, devices)
        else:
            self.generator.threads = settings.threads
            self.generator.kv_cache_type = settings.kv_cache_type
        if settings.decoder_precision != self.settings.decoder_precision:
            # Other samples: the saved decoder states of the old precision do not continue them.
            with self._primed_lock:
                self._primed.clear()
        if (
            settings.decoder_threads != self.settings.decoder_threads
            or devices["decoder"] != self.devices["decoder"]
            or settings.decoder_precision != self.settings.decoder_precision
        ):
            self._decoder = None  # reloaded with the new count, on its device, when next used
        self.devices = devices
        self.settings = settings

    @property
    def generation_defaults(self) -> dict[str, Any]:
        """The model's own sampling values (its generation_config.json), by setting name:
        what an unset temperature, top_k, top_p or repetition_penalty means."""
        prefix = "kazeia.gen."
        return {
            key[len(prefix) :]: value
            for key, value in self.generator.hparams.items()
            if key.startswith(prefix)
        }

    @property
    def kind(self) -> str:
        """The model's kind: "custom_voice", "base" or "voice_design" (config.json's
        tts_model_type, recorded in talker.gguf)."""
        return str(self.generator.hparams["kazeia.talker.model_type"])

    @property
    def follows_instructions(self) -> bool:
        return follows_instructions(
            self.kind, str(self.generator.hparams["kazeia.talker.model_size"])
        )

    @property
    def voice_model_key(self) -> str:
        """Names what a voice prompt depends on in this model (its encoders and tokenizer
        files): a prompt stored under another key was made by another model. Read once per
        load of the model files (refresh)."""
        if self._voice_model_key is None:
            self._voice_model_key = self._files_digest()
        return self._voice_model_key

    def _files_digest(self) -> str:
        digest = hashlib.sha256()
        for name in ("speaker_encoder.gguf", "speech_encoder.gguf", *TOKENIZER_FILES):
            path = self.model_dir / name
            if not path.is_file():
                continue
            size = path.stat().st_size
            digest.update(f"{name}:{size}:".encode())
            with path.open("rb") as f:  # the header, and the end (enough to tell files apart)
                digest.update(f.read(1 << 20))
                f.seek(max(0, size - (1 << 20)))
                digest.update(f.read(1 << 20))
        return digest.hexdigest()[:16]

    def _encoder_file(self, name: str) -> str:
        path = self.model_dir / name
        if not path.is_file() and self.kind == "base":
            raise ModelNotFoundError(
                f"{self.model_dir} lacks {name}: convert the Base checkpoint again "
                "(python -m wyoming_kazeia.convert)"
            )
        if not path.is_file():
            raise InputError(
                f"{self.model_dir} is a {self.kind!r} model: cloning a voice needs a Base model "
                f"(its {name}), e.g. Qwen/Qwen3-TTS-12Hz-0.6B-Base"
            )
        return str(path)

    @property
    def encoder_rate(self) -> int:
        """Hz of the audio a Base model's speaker encoder takes (its GGUF says; InputError for a
        model of another kind): the rate to bring a recording to (voices/recording.py)."""
        encoder = SpeakerEncoder(self._encoder_file("speaker_encoder.gguf"), threads=1)
        return int(encoder.sample_rate)  # its weights are mapped, not read: cheap to open

    def _encoder_threads(self) -> int:
        """The encoders run ggml graphs, whose threads spin at every node until all arrive:
        more of them than the usable cores only wait for one another."""
        return max(1, min(self.settings.threads, usable_cpus()))

    def clone_prompt(
        self, samples: np.ndarray, sample_rate: int, ref_text: str | None = None
    ) -> VoicePrompt:
        """The voice of a recording (mono float samples at any rate; resampled to each
        encoder's rate with soxr's high quality, as the official code through librosa): its
        x-vector, and with its transcript `ref_text` its codes for in-context cloning. Costs
        a fraction of a second (x-vector) to seconds (the codes): make it once per voice. The
        encoders are loaded for the call only (voices are made rarely; their weights are not
        kept)."""
        speaker_encoder = SpeakerEncoder(
            self._encoder_file("speaker_encoder.gguf"), threads=self._encoder_threads()
        )
        embedding = speaker_encoder.embed(
            resample(samples, sample_rate, speaker_encoder.sample_rate)
        )
        del speaker_encoder
        if ref_text is None or not ref_text.strip():
            return VoicePrompt(speaker_embedding=embedding)
        speech_encoder = SpeechEncoder(
            self._encoder_file("speech_encoder.gguf"), threads=self._encoder_threads()
        )
        codes, _ = speech_encoder.encode(resample(samples, sample_rate, speech_encoder.sample_rate))
        return VoicePrompt(
            speaker_embedding=embedding,
            ref_ids=tuple(self.tokenizer.reference_ids(ref_text)),
            ref_codes=codes,
        )

    def continue_after(self, stream: Any, codes: np.ndarray) -> None:
        """Brings a new decoder stream to where it has decoded `codes` (an in-context voice's
        reference, whose audio is not played): the first time by decoding them, then by
        restoring the state that left (a few MB per voice, kept for PRIMED_VOICES voices), so
        that a cloned voice's first audio does not wait for its reference to be decoded."""
        key = hashlib.sha256(np.ascontiguousarray(codes, dtype=np.int32).tobytes()).digest()
        with self._primed_lock:
            state = self._primed.pop(key, None)
            if state is not None:
                self._primed[key] = state
        if state is not None:
            stream.restore(state)
            return
        stream.push(codes)
        with self._primed_lock:
            self._primed[key] = stream.save()
            while len(self._primed) > PRIMED_VOICES:
                del self._primed[next(iter(self._primed))]

    def prepare_voice(self, voice: VoicePrompt) -> None:
        """Readies what a voice's syntheses share (an in-context voice's decoder state), so
        that its first request is as fast as the next ones."""
        if voice.ref_codes is not None and not self.settings.decoder_subprocess:
            self.continue_after(self.decoder.stream(), voice.ref_codes)

    def instruction_prompt(self, instruction: str, speaker: str = "") -> VoicePrompt:
        """A CustomVoice 1.7B speaker speaking in the style `instruction`, or (VoiceDesign,
        no speaker) the voice `instruction` describes."""
        if not self.follows_instructions:
            raise InputError(
                f"this {self.kind!r} model takes no instruction: styles need a CustomVoice 1.7B "
                "model, described voices a VoiceDesign model"
            )
        ids = self.tokenizer.instruction_ids(instruction) if instruction.strip() else []
        return VoicePrompt(speaker=speaker, instruct_ids=tuple(ids))

    @property
    def speakers(self) -> list[str]:
        return self.generator.speakers

    @property
    def languages(self) -> list[str]:
        return self.generator.languages

    def synthesize(
        self,
        text: str,
        speaker: str | None = None,
        language: str = "auto",
        voice: VoicePrompt | None = None,
        non_streaming: bool = False,
        greedy: bool = False,
        **overrides: Any,
    ) -> Synthesis:
        """Starts a synthesis with a built-in `speaker` or a `voice`; `overrides` are settings
        for this one (e.g. seed=7). `non_streaming`: the whole text in the prompt (the official
        non-streaming text mode) instead of one token per frame; `greedy`: argmax decoding."""
        loaded = sorted(set(overrides) & set(LOADED_SETTINGS))
        if loaded:
            raise SettingsError(
                f"{', '.join(loaded)}: the engine's, not one synthesis's (apply_settings changes "
                "them)"
            )
        settings = self.settings.replace(**overrides) if overrides else self.settings
        if voice is not None:
            speaker = voice.speaker
        elif speaker is None:
            speaker = self.speakers[0] if self.speakers else ""
        # Validate now (unknown speaker/language raise here, not in a thread).
        lowered = language.lower()
        if (speaker or voice is None) and speaker.lower() not in self.speakers:
            if not self.speakers:
                raise InputError(
                    f"this {self.kind!r} model has no built-in speakers: it speaks with a cloned "
                    "or described voice"
                )
            raise InputError(
                f"unknown speaker {quoted(speaker)}; valid speakers: {', '.join(self.speakers)}"
            )
        if lowered != "auto" and lowered not in self.languages:
            raise InputError(
                f"unknown language {quoted(language)}; valid languages: auto, "
                + ", ".join(self.languages)
            )
        ids = self.tokenizer.prompt_ids(text) if text.strip() else None
        return Synthesis(
            Pipeline(self, ids, speaker, language, settings, voice, non_streaming, greedy)
        )

    def decoder_process(self, cancel: threading.Event) -> DecoderProcess:
        """A kazeia-decoder child for one synthesis (the subprocess placement), started now; a
        crash, or no answer to a push within its deadline (then it is killed), becomes an
        EngineError for that synthesis only; `cancel` kills it within ~20 ms."""
        return DecoderProcess(
            self.decoder_command,
            str(self.model_dir / "decoder.gguf"),
            self.settings.decoder_threads,
            self.settings.decoder_precision,
            self.hop_length,
            cancel,
            self.subprocess_base_s,
            self.subprocess_per_frame_s,
        )
