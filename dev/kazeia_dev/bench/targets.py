"""Every target the benches check, in one table, and the peer figures they quote.

A target is the bound set for one measured figure on the reference box (2-core AVX2,
2 threads); the reports print each beside its figure with "ok" or "MISSED". Change a bound
here and every report and verdict follows.
"""

from __future__ import annotations

TARGETS: dict[str, dict[str, float]] = {
    # speech decoder (full-size 0.6B decoder, f32)
    "decoder": {
        "full_rtf": 1.2,  # one-shot decode: compute s / audio s
        "stream_ratio": 1.10,  # streaming total / one-shot total
        "peak_rss_mb": 700.0,
        "full_peak_share": 0.5,  # one-shot GFLOP/s / the FMA peak of the same threads
    },
    # talker + code predictor (ms per steady-state frame)
    "generate": {
        "q8_talker_ms": 25.0,
        "q8_predictor_ms": 50.0,
        "q8_total_ms": 75.0,
        "q4_total_ms": 55.0,
        "q8_peak_rss_mb": 900.0,
    },
    # streaming engine (q8_0 talker, f16 decoder)
    "engine": {
        "ttfa_ms": 200.0,
        "stream_ratio": 1.05,  # streaming total / one-shot total
        "rtf": 2.2,
        "peak_rss_mb": 1100.0,
        "load_slowdown": 2.0,  # beside busy processes / alone around it, in every run
        "clone_ttfa_ms": 250.0,  # a cloned voice's first audio
        "long_ratio": 1.10,  # per-frame cost of a 2-minute synthesis / a sentence's
    },
}

# The engine bench's targets for other sizes and weight types, over TARGETS["engine"].
ENGINE_TARGETS_BY_MODEL: dict[tuple[str, str], dict[str, float]] = {
    ("1.7b", "q8_0"): {"rtf": 1.8, "ttfa_ms": 200.0, "peak_rss_mb": 2200.0},
    ("1.7b", "q4_k"): {"rtf": 1.4, "ttfa_ms": 200.0, "peak_rss_mb": 2200.0},
}
