"""Benchmarks of the native engine (``script/bench COMMAND [options]``).

Commands (one module per bench, each with its ``bench_<command>`` and its measuring child, the
``engine`` bench's parts in ``engine_*`` and ``competing_load``; ``common`` is the shared runner,
``targets`` the one table of targets; manual: dev/README.md):

``decoder``
    The native speech decoder on the full-size decoder of a random ``0.6b`` checkpoint (or of
    ``--model-dir``): one-shot ``decode`` and streaming ``push`` of k frames, each configuration
    in a fresh subprocess so that its peak RSS is its own, medians over ``--repeats``; beside it
    the official PyTorch decoder (fp32) when the reference environment is installed, and the
    largest difference between the two waveforms.

``generate``
    The native talker + code predictor (token ids -> codes) of the random ``0.6b`` checkpoint,
    its talker converted to each ``--types`` (f32, q8_0, q4_k), each in a fresh subprocess: time
    to the first frame, talker and code-predictor ms per steady-state frame (the engine's stats),
    total ms per frame, RSS after load and peak RSS, medians over ``--repeats``; beside it the
    official PyTorch ``generate`` (fp32) when the reference environment is installed.

``server``
    The Wyoming server over the protocol with ``wyoming-bench`` (``server.py``).

``engine``
    The streaming engine (``Engine.synthesize``: text -> int16 PCM chunks) on the random ``0.6b``
    checkpoint (q8_0 talker, f16 decoder), a fixed number of frames: one-shot, streaming with
    k-frame chunks and the subprocess decoder, each in a fresh subprocess after a warm-up
    synthesis: decoder / talker / code-predictor seconds, total, RTF, time to first audio, peak
    RSS, medians over ``--repeats``; then the same rows beside busy competing processes.

``prebuffer``
    The service's hold (``wyoming_kazeia.pacing.Prebuffer``) on streamed answers recorded here
    (``prebuffer.py``), replayed at faster speeds and with some answers slowed down: the
    answers a player at real time ran dry in, and the first audio's added delay.

``quality``
    The talker's weight types against f32 on the random checkpoint (``quality.py``): logit
    error, greedy agreement over ``--frames``, the f16 decoder's audio error.

Progress is logged to stderr; the result goes to stdout as a markdown table, or as one JSON object
with ``--json``. The random checkpoint and its conversion are cached (default ``.bench/`` in the
repository root) and reused.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from . import decoder, engine, generate, prebuffer, quality, server
from .common import BenchError, dev_child_env, logger, setup_logging


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="script/bench",
        description="Benchmarks of the Kazeia native engine (progress on stderr, results on "
        "stdout).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for bench in (decoder, generate, engine, prebuffer, quality, server):
        bench.add_parser(sub)
    args = parser.parse_args(argv)
    setup_logging()
    # Every child process (measuring children, converters) imports kazeia_dev from dev/.
    os.environ.update(dev_child_env())
    try:
        return int(args.func(args))
    except BenchError as err:
        logger.error("%s", err)
        return 1


if __name__ == "__main__":
    sys.exit(main())
