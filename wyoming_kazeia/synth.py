"""Synthesize one text to a WAV file from the command line.

    python -m wyoming_kazeia.synth --text "..." --out out.wav [--model ...] [--voice vivian-fr]
        [--speaker S] [--language L] [--stream-chunk K] [--seed N] [--decoder-subprocess]
        [--data-dir DIR] [--json-metrics]
    voices beyond the built-in speakers:
        [--ref-audio FILE (--ref-text TEXT | --x-vector-only)]   clone (a Base model)
        [--instruct TEXT]       a style (CustomVoice 1.7B) or a voice description (VoiceDesign)
        [--voice NAME]          also a voice of the library (python -m wyoming_kazeia.voices)
    reproducing a run:
        [--non-streaming] [--greedy] [--repetition-penalty R] [--max-frames N]
        [--codes-out FILE.npy]  the generated codes, int32 [T, 16]

Models and voices are resolved exactly as the server resolves them: --model (KZTTS_MODEL, by
default the server's default model) is a converted model directory, a Hugging Face checkpoint
directory or a repo id, with the server's data directory (--data-dir, KZTTS_DATA_DIR) and
weight type (KZTTS_QUANT); --voice (KZTTS_VOICE) is a voice name as the server advertises it,
and --speaker / --language override its parts as a request's would. --non-streaming puts the
whole text in the prompt (the official non-streaming text mode; the default streams it in as
the server does); --greedy takes the most likely code at every step. Metrics go to stdout
(one JSON object with --json-metrics), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import cpu_floor  # noqa: F401 - first: it checks the CPU before numpy loads

# isort: split
import numpy as np
import soundfile as sf

from .engine import Engine, VoicePrompt
from .errors import KazeiaError, VoiceError
from .models import DEFAULT_MODEL, add_data_dir_argument, resolve_model
from .settings import PARTS, EngineSettings, add_env_argument
from .voices import VoiceCatalog, model_language, recording
from .voices.library import VoiceLibrary

_LOGGER = logging.getLogger(__name__)


def _voice(engine: Engine, args: argparse.Namespace) -> tuple[str | None, str, VoicePrompt | None]:
    """(speaker, language, voice prompt) of the command line."""
    language = model_language(args.language)
    if args.ref_audio is not None:
        if (args.ref_text is None) == (not args.x_vector_only):
            raise VoiceError("--ref-audio needs --ref-text TEXT (in context) or --x-vector-only")
        rec = recording.load(args.ref_audio, engine.encoder_rate)
        prompt = engine.clone_prompt(rec.samples, rec.rate, args.ref_text)
        return None, language or "auto", prompt
    if args.ref_text is not None or args.x_vector_only:
        raise VoiceError("--ref-text and --x-vector-only go with --ref-audio")
    library = VoiceLibrary(args.data_dir)
    stored = {v.name: v for v in library.scan()[0]}
    if args.voice and args.voice.strip().lower() in stored:
        voice = stored[args.voice.strip().lower()]
        return None, language or voice.language or "auto", library.prompt(voice, engine)
    if args.instruct is not None:
        speaker = args.speaker.strip().lower() if args.speaker else ""
        if engine.kind == "custom_voice" and not speaker:
            speaker = VoiceCatalog(engine.speakers, engine.languages).resolve(args.voice)[0]
        return None, language or "auto", engine.instruction_prompt(args.instruct, speaker)
    if not engine.speakers:
        return None, language or "auto", None  # the engine says what this model needs
    speaker, language = VoiceCatalog(engine.speakers, engine.languages).resolve(
        args.voice, args.speaker, args.language
    )
    return speaker, language, None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia.synth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_env_argument(parser, "--model", "KZTTS_MODEL", "as the server's --model", DEFAULT_MODEL)
    parser.add_argument("--text", required=True)
    parser.add_argument("--out", type=Path, required=True)
    add_env_argument(parser, "--voice", "KZTTS_VOICE", "a voice name, as the server's --voice")
    parser.add_argument("--speaker", help="overrides the voice's speaker")
    parser.add_argument("--language", help="overrides the voice's language (e.g. fr, english)")
    parser.add_argument("--ref-audio", type=Path, help="clone this recording (a Base model)")
    parser.add_argument("--ref-text", help="the transcript of --ref-audio (in-context cloning)")
    parser.add_argument(
        "--x-vector-only", action="store_true", help="clone --ref-audio from its x-vector alone"
    )
    parser.add_argument("--instruct", help="a style (CustomVoice 1.7B) or a voice description")
    parser.add_argument("--non-streaming", action="store_true", help="whole text in the prompt")
    parser.add_argument("--greedy", action="store_true", help="argmax decoding")
    parser.add_argument("--repetition-penalty", type=float)
    parser.add_argument("--max-frames", type=int, help="stop after this many frames")
    parser.add_argument("--codes-out", type=Path, help="write the codes (int32 [T, 16], .npy)")
    parser.add_argument("--stream-chunk", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--decoder-subprocess", action="store_true")
    placements = ("backend", *(f"{part}_backend" for part in PARTS))
    for name in ("decoder_precision", "kv_cache_type", *placements):
        parser.add_argument(
            "--" + name.replace("_", "-"),
            help=f"as the server's (KZTTS_{name.upper()}): {EngineSettings.bounds(name).text(str)}",
        )
    parser.add_argument("--json-metrics", action="store_true")
    add_data_dir_argument(
        parser, "downloaded and converted models and the voice library, as the server's"
    )
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {}
    engine_flags = (
        "stream_chunk",
        "seed",
        "repetition_penalty",
        "max_frames",
        "decoder_precision",
        "kv_cache_type",
    )
    for name in (*engine_flags, *placements):
        if getattr(args, name) is not None:
            overrides[name] = getattr(args, name)
    if args.decoder_subprocess:
        overrides["decoder_subprocess"] = True
    try:
        settings = EngineSettings.from_env(**overrides)
        engine = Engine(resolve_model(args.model, settings.quant, args.data_dir), settings)
        speaker, language, voice = _voice(engine, args)
        synthesis = engine.synthesize(
            args.text,
            speaker=speaker,
            language=language,
            voice=voice,
            non_streaming=args.non_streaming,
            greedy=args.greedy,
        )
        chunks = list(synthesis)
    except KazeiaError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    tmp = args.out.with_name(args.out.name + ".tmp")
    sf.write(tmp, pcm, engine.sample_rate, subtype="PCM_16", format="WAV")
    tmp.replace(args.out)
    if args.codes_out is not None:
        np.save(args.codes_out, synthesis.codes)
    metrics = synthesis.metrics.as_dict()
    if args.json_metrics:
        print(json.dumps(metrics))
    else:
        for key, value in metrics.items():
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
