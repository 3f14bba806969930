"""Time the official PyTorch talker + code predictor (Qwen3-TTS 12 Hz ``generate``) on token ids.

Run with the reference interpreter (``build/reference-venv/bin/python``, see
``script/make-reference --setup``), not with the project's environment::

    python dev/kazeia_dev/reference/official_generate.py CHECKPOINT_DIR --ids 151644,77091,198,... \
        [--frames 40] [--mode stream|nonstream] [--speaker vivian] [--language english] \
        [--threads N] [--repeats R] [--seed S] [--warmup-frames W]

Loads ``Qwen3TTSForConditionalGeneration`` from qwen-tts in fp32 (eager attention; the official
loader loads the speech tokenizer too, which counts in the RSS), then runs the official
``generate`` (batch of one, ``do_sample=True`` with its default sampling parameters, the torch
seed fixed before every run, ``max_new_tokens = frames + 1``: the last sampled code 0 is dropped)
under ``torch.inference_mode()``. A run of ``W`` frames warms up first. Timers on the talker
forward (``model.talker``, which calls the code predictor of the previous frame inside) and on
``talker.code_predictor.generate`` split the wall time into the talker (prefill, then every step,
embedding sums included), the code predictor and the rest (the generation loop, sampling, the
text projection of the prompt). Prints one JSON object on the last line of stdout.

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

logger = logging.getLogger("official_generate")


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


def load_model(checkpoint: Path) -> Any:
    """The official model (talker + code predictor eager, speech tokenizer default) in fp32."""
    import torch
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import AutoConfig, AutoModel

    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoModel.register(Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, exist_ok=True)
    model = Qwen3TTSForConditionalGeneration.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    return model


class Timers:
    """Wall time of every talker forward and of every code-predictor generate."""

    def __init__(self, model: Any) -> None:
        self.talker: list[float] = []  # ms of each talker forward (code predictor included)
        self.talker_rows: list[int] = []  # input rows of each talker forward (prefill > 1)
        self.predictor: list[float] = []  # ms of each code-predictor generate
        self._t0 = 0.0
        talker = model.talker
        self._handles = [
            talker.register_forward_pre_hook(self._pre, with_kwargs=True),
            talker.register_forward_hook(self._post),
        ]
        cp = talker.code_predictor
        self._cp = cp
        original = cp.generate

        def timed_generate(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.predictor.append(1e3 * (time.perf_counter() - t0))

        cp.generate = timed_generate

    def _pre(self, _module: Any, _args: Any, kwargs: dict) -> None:
        embeds = kwargs.get("inputs_embeds")
        rows = int(embeds.shape[1]) if embeds is not None else 1
        self.talker_rows.append(rows)
        self._t0 = time.perf_counter()

    def _post(self, _module: Any, _args: Any, _output: Any) -> None:
        self.talker.append(1e3 * (time.perf_counter() - self._t0))

    def reset(self) -> None:
        self.talker.clear()
        self.talker_rows.clear()
        self.predictor.clear()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        with contextlib.suppress(AttributeError):
            del self._cp.generate  # back to the class method


def generate_once(model: Any, args: argparse.Namespace, ids: Any, frames: int) -> Any:
    import torch

    torch.manual_seed(args.seed)
    with torch.inference_mode():
        codes_list, _ = model.generate(
            input_ids=[ids],
            languages=[args.language],
            speakers=[args.speaker],
            non_streaming_mode=args.mode == "nonstream",
            max_new_tokens=frames + 1,
            do_sample=True,
        )
    return codes_list[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    rss_start = status_mb("VmRSS")
    # Library chatter (import warnings, prints) must not reach stdout: it carries the JSON.
    with contextlib.redirect_stdout(sys.stderr):
        import torch
        import transformers

        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        model = load_model(args.checkpoint)
        load_s = time.perf_counter() - start
    rss_load = status_mb("VmRSS")
    ids = torch.tensor([[int(x) for x in args.ids.split(",") if x.strip()]], dtype=torch.long)

    timers = Timers(model)
    runs: list[dict[str, float]] = []
    frames_out: list[int] = []
    try:
        with contextlib.redirect_stdout(sys.stderr):
            if args.warmup_frames > 0:
                generate_once(model, args, ids, args.warmup_frames)
            for i in range(args.repeats):
                timers.reset()
                t0 = time.perf_counter()
                codes = generate_once(model, args, ids, args.frames)
                wall_ms = 1e3 * (time.perf_counter() - t0)
                n = int(codes.shape[0])
                frames_out.append(n)
                if len(timers.predictor) != len(timers.talker) - 1:
                    logger.warning(
                        "unexpected call counts: %d talker, %d code predictor",
                        len(timers.talker),
                        len(timers.predictor),
                    )
                talker_total = sum(timers.talker)
                predictor_total = sum(timers.predictor)
                # Every talker step runs the code predictor of the previous frame inside.
                talker_steps_ms = sum(timers.talker[1:]) - predictor_total
                steps = len(timers.talker) - 1
                runs.append(
                    {
                        "frames": n,
                        "wall_ms": wall_ms,
                        "total_ms_per_frame": wall_ms / max(n, 1),
                        "prefill_ms": timers.talker[0],
                        "prefill_rows": timers.talker_rows[0],
                        "talker_ms_per_frame": talker_steps_ms / max(steps, 1),
                        "predictor_ms_per_frame": predictor_total / max(len(timers.predictor), 1),
                        "other_ms_per_frame": (wall_ms - talker_total) / max(n, 1),
                        "talker_calls": len(timers.talker),
                        "predictor_calls": len(timers.predictor),
                    }
                )
                logger.info(
                    "generate %d/%d: %d frames in %.1f s (%.0f ms/frame)",
                    i + 1,
                    args.repeats,
                    n,
                    wall_ms / 1e3,
                    wall_ms / max(n, 1),
                )
    finally:
        timers.close()

    keys = (
        "total_ms_per_frame",
        "prefill_ms",
        "talker_ms_per_frame",
        "predictor_ms_per_frame",
        "other_ms_per_frame",
        "wall_ms",
    )
    result: dict[str, Any] = {key: statistics.median(r[key] for r in runs) for key in keys}
    result.update(
        frames=min(frames_out),
        frames_requested=args.frames,
        eos_before_max=min(frames_out) < args.frames,
        runs=runs,
        mode=args.mode,
        prompt_tokens=int(ids.shape[1]),
        threads=int(torch.get_num_threads()),
        load_s=load_s,
        rss_start_mb=rss_start,
        rss_load_mb=rss_load,
        peak_rss_mb=status_mb("VmHWM"),
        torch=str(torch.__version__),
        transformers=str(transformers.__version__),
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="official_generate.py",
        description="Time the official PyTorch talker + code predictor generate (fp32).",
    )
    parser.add_argument("checkpoint", type=Path, help="Hugging Face checkpoint folder")
    parser.add_argument("--ids", required=True, help="comma-separated prompt token ids")
    parser.add_argument("--frames", type=int, default=40, help="frames to generate (default 40)")
    parser.add_argument("--mode", choices=("stream", "nonstream"), default="stream")
    parser.add_argument("--speaker", default="vivian")
    parser.add_argument("--language", default="english")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--repeats", type=int, default=1, help="timed runs (default 1)")
    parser.add_argument("--seed", type=int, default=0, help="torch seed before each run")
    parser.add_argument(
        "--warmup-frames", type=int, default=2, help="frames of the warm-up run (0: none)"
    )
    args = parser.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.frames < 1 or args.warmup_frames < 0:
        parser.error("--threads, --repeats and --frames must be >= 1, --warmup-frames >= 0")
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr
    )
    result = run(args)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
