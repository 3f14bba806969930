"""Time the official PyTorch speech decoder (Qwen3-TTS 12 Hz tokenizer) on given codes.

Run with the reference interpreter (``build/reference-venv/bin/python``, see
``script/make-reference --setup``), not with the project's environment::

    python dev/kazeia_dev/reference/official_decoder.py SPEECH_TOKENIZER_DIR CODES.npy \
        [--threads N] [--repeats R] [--warmup-frames W] [--dtype f32|bf16] [--out WAV.npy]

Loads ``Qwen3TTSTokenizerV2Model`` from qwen-tts in fp32 or, with ``--dtype bf16``, in bf16
(the whole speech tokenizer, encoder included, as the official loader does), then decodes
``CODES.npy`` (int ``[T, 16]``, time-major) with ONE forward of ``model.decoder`` on ``[1, 16, T]``
under ``torch.inference_mode()`` (what the official ``decode()`` does for T <= 300 frames,
without its chunking). A decode of the first ``W`` frames warms up first. Prints one JSON
object on the last line of stdout: load seconds, every timed decode, their median, RSS before/
after loading and the peak RSS (VmHWM) in MB.

Imports only the standard library, numpy, torch, transformers and qwen_tts: never the project.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

logger = logging.getLogger("official_decoder")

NUM_QUANTIZERS = 16


def status_mb(key: str) -> float:
    """A ``VmRSS``/``VmHWM`` line of /proc/self/status in MB (0.0 where unavailable)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def load_model(tokenizer_dir: Path, dtype: str = "f32") -> Any:
    """The official speech tokenizer model in fp32 (or bf16: weights and activations, as the
    official loader makes it when its model is loaded with dtype=torch.bfloat16), eval mode."""
    import torch
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import (
        Qwen3TTSTokenizerV2Model,
    )

    torch_dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[dtype]
    model = Qwen3TTSTokenizerV2Model.from_pretrained(str(tokenizer_dir), dtype=torch_dtype)
    model.eval()
    return model


def run(args: argparse.Namespace) -> dict[str, Any]:
    rss_start = status_mb("VmRSS")
    # Library chatter (import warnings, prints) must not reach stdout: it carries the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        model = load_model(args.tokenizer_dir, args.dtype)
        load_s = time.perf_counter() - start
    rss_load = status_mb("VmRSS")

    codes = np.load(args.codes)
    if codes.ndim != 2 or codes.shape[1] != NUM_QUANTIZERS:
        raise SystemExit(f"official_decoder: codes must be [T, 16], got {codes.shape}")
    # Official layout: [batch, num_quantizers, frames], int64.
    codes_t = torch.from_numpy(np.ascontiguousarray(codes.T, dtype=np.int64))[None]
    decoder = model.decoder

    with torch.inference_mode():
        warm = max(1, min(args.warmup_frames, codes_t.shape[-1]))
        decoder(codes_t[..., :warm])
        times: list[float] = []
        wav = None
        for i in range(args.repeats):
            start = time.perf_counter()
            wav = decoder(codes_t)
            times.append(time.perf_counter() - start)
            logger.info("decode %d/%d: %.3f s", i + 1, args.repeats, times[-1])
    assert wav is not None
    if args.out is not None:
        np.save(args.out, wav[0, 0].float().numpy().astype(np.float32))
    return {
        "frames": int(codes.shape[0]),
        "threads": int(torch.get_num_threads()),
        "dtype": args.dtype,
        "load_s": load_s,
        "times_s": times,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "rss_start_mb": rss_start,
        "rss_load_mb": rss_load,
        "peak_rss_mb": status_mb("VmHWM"),
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="official_decoder.py",
        description="Time the official PyTorch speech decoder (fp32 or bf16) on int codes [T, 16].",
    )
    parser.add_argument("tokenizer_dir", type=Path, help="checkpoint's speech_tokenizer/ folder")
    parser.add_argument("codes", type=Path, help=".npy of int codes [T, 16] (time-major)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="timed decodes (default 3)")
    parser.add_argument(
        "--warmup-frames", type=int, default=4, help="frames of the warm-up decode (default 4)"
    )
    parser.add_argument(
        "--dtype",
        choices=("f32", "bf16"),
        default="f32",
        help="the model's weights and activations (default f32; bf16 as the official examples "
        "load the model on a GPU)",
    )
    parser.add_argument("--out", type=Path, help="write the waveform of the last decode (.npy)")
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1:
        parser.error("--threads and --repeats must be >= 1")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    result = run(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
