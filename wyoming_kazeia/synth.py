"""Synthesize one text to a WAV file from the command line.

    python -m wyoming_kazeia.synth --text "..." --out out.wav [--model ...] [--voice vivian-fr]
        [--speaker S] [--language L] [--stream-chunk K] [--seed N] [--decoder-subprocess]
        [--data-dir DIR] [--json-metrics]

Models and voices are resolved exactly as the server resolves them: --model (KZTTS_MODEL, by
default the server's default model) is a converted model directory, a Hugging Face checkpoint
directory or a repo id, with the server's data directory (--data-dir, KZTTS_DATA_DIR) and
weight type (KZTTS_QUANT); --voice (KZTTS_VOICE) is a voice name as the server advertises it,
and --speaker / --language override its parts as a request's would. Metrics go to stdout (one
JSON object with --json-metrics), progress to stderr.
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

from .engine import Engine
from .errors import KazeiaError
from .models import DEFAULT_DATA_DIR, DEFAULT_MODEL, resolve_model
from .settings import EngineSettings, add_env_argument
from .voices import VoiceCatalog

_LOGGER = logging.getLogger(__name__)


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
    parser.add_argument("--stream-chunk", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--decoder-subprocess", action="store_true")
    parser.add_argument("--json-metrics", action="store_true")
    add_env_argument(
        parser,
        "--data-dir",
        "KZTTS_DATA_DIR",
        "downloaded and converted models, as the server's",
        str(DEFAULT_DATA_DIR),
        type=Path,
    )
    parser.add_argument("--debug", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides: dict[str, Any] = {}
    if args.stream_chunk is not None:
        overrides["stream_chunk"] = args.stream_chunk
    if args.seed is not None:
        overrides["seed"] = args.seed
    if args.decoder_subprocess:
        overrides["decoder_subprocess"] = True
    try:
        settings = EngineSettings.from_env(**overrides)
        engine = Engine(resolve_model(args.model, settings.quant, args.data_dir), settings)
        voices = VoiceCatalog(engine.speakers, engine.languages)
        speaker, language = voices.resolve(args.voice, args.speaker, args.language)
        synthesis = engine.synthesize(args.text, speaker=speaker, language=language)
        chunks = list(synthesis)
    except KazeiaError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    pcm = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.int16)
    tmp = args.out.with_name(args.out.name + ".tmp")
    sf.write(tmp, pcm, engine.sample_rate, subtype="PCM_16", format="WAV")
    tmp.replace(args.out)
    metrics = synthesis.metrics.as_dict()
    if args.json_metrics:
        print(json.dumps(metrics))
    else:
        for key, value in metrics.items():
            print(f"{key}: {value:.3f}" if isinstance(value, float) else f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
