"""Synthesize one text to a WAV file from the command line.

    python -m wyoming_kazeia.synth --model DIR --text "..." --out out.wav [--speaker vivian]
        [--language auto] [--stream-chunk K] [--seed N] [--decoder-subprocess] [--json-metrics]

--model is a converted model directory, a Hugging Face checkpoint directory or a repo id,
resolved as the server does (wyoming_kazeia.models) with --cache-dir (default
~/.cache/wyoming-kazeia) as its data directory: converted once into CACHE/converted and reused.
Metrics go to stdout (one JSON object with --json-metrics), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from .engine import Engine
from .errors import KazeiaError
from .models import resolve_model
from .settings import EngineSettings

_LOGGER = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia.synth",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--speaker")
    parser.add_argument("--language", default="auto")
    parser.add_argument("--stream-chunk", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--decoder-subprocess", action="store_true")
    parser.add_argument("--json-metrics", action="store_true")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "wyoming-kazeia",
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
        engine = Engine(resolve_model(args.model, settings.quant, args.cache_dir), settings)
        synthesis = engine.synthesize(args.text, speaker=args.speaker, language=args.language)
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
