"""A measuring child: one configuration in a fresh process, one JSON line on stdout."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .common import GEN_SENTENCE, setup_logging
from .decoder import child_decoder
from .engine_child import child_engine
from .generate import child_generate

CHILDREN: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "decoder": child_decoder,
    "generate": child_generate,
    "engine": child_engine,
}


def child_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of a measuring child: prints one JSON object on stdout."""
    parser = argparse.ArgumentParser(prog="bench-child")
    sub = parser.add_subparsers(dest="child", required=True)
    p = sub.add_parser("decoder")
    p.add_argument("gguf", type=Path)
    p.add_argument("codes", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", default="f32")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--chunk", type=int, default=0, help="0: one-shot decode; k: push k frames")
    p.add_argument("--out", type=Path)
    p = sub.add_parser("generate")
    p.add_argument("gguf", type=Path)
    p.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--mode", choices=("stream", "nonstream"), default="stream")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--speaker", default="vivian")
    p.add_argument("--language", default="english")
    p = sub.add_parser("engine")
    p.add_argument("model_dir", type=Path)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--decoder-threads", type=int, default=2)
    p.add_argument("--decoder-precision", default="f32")
    p.add_argument("--kv-cache-type", default="auto")
    p.add_argument("--chunk", type=int, default=4, help="stream_chunk (0: decode at the end)")
    p.add_argument("--subprocess", action="store_true", help="decoder_subprocess=True")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frames", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--text", default=GEN_SENTENCE)
    p.add_argument("--speaker", default="vivian")
    p.add_argument("--language", default="english")
    p.add_argument("--out", type=Path, required=True, help="npy file: the last run's audio")
    p.add_argument(
        "--arrivals", action="store_true", help="also every synthesis's chunks' arrivals"
    )
    p.add_argument(
        "--clone",
        choices=("xvec", "icl"),
        help="speak with a voice cloned from a --ref-seconds recording (model_dir: a Base model)",
    )
    p.add_argument("--ref-seconds", type=float, default=6.0)
    p.add_argument("--also-load", type=Path, help="another model folder loaded beside (its RSS)")
    p.add_argument("--warmup-frames", type=int, help="frames of the warm-up (default --frames)")
    p.add_argument("--talker-backend", default="cpu", help="where the talker computes")
    p.add_argument("--predictor-backend", default="cpu", help="where the code predictor computes")
    p.add_argument("--decoder-backend", default="cpu", help="where the speech decoder computes")
    args = parser.parse_args(argv)
    setup_logging()
    result = CHILDREN[args.child](args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0
