"""Every target the benches check, in one table, and the peer figures they quote.

A target is the bound an issue set for one measured figure on the reference box (2-core AVX2,
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
        "load_slowdown": 2.5,  # beside busy processes / unloaded
        "clone_ttfa_ms": 250.0,  # a cloned voice's first audio (issue 14)
        "long_ratio": 1.15,  # per-frame cost of a 2-minute synthesis / a sentence's (issue 15)
    },
}

# The engine bench's targets for other sizes and weight types (issue 15), over TARGETS["engine"].
ENGINE_TARGETS_BY_MODEL: dict[tuple[str, str], dict[str, float]] = {
    ("1.7b", "q8_0"): {"rtf": 1.8, "ttfa_ms": 200.0, "peak_rss_mb": 2200.0},
    ("1.7b", "q4_k"): {"rtf": 1.4, "ttfa_ms": 200.0, "peak_rss_mb": 2200.0},
}

# Peer figures quoted beside the reports: measured elsewhere (DESIGN.md section 3, the same random
# 0.6B weights, 2 threads, 40 frames on one 2-core box), not in the run that prints them.
PEER_NOTES: dict[str, tuple[str, ...]] = {
    "generate": (
        "official PyTorch fp32 1050 ms/frame (talker ~310 + code predictor 758)",
        "qwentts.cpp q8_0 118 ms/frame (46 + 72), 4.65 GB",
        "vox q8 129 ms/frame (34 + 95), 1.23 GB",
    ),
    "engine": (
        "vox q8: first audio 0.41 s with 1-frame chunks (1.09 s with 4), RTF 2.9, 1.2 GB",
        "qwentts.cpp q8_0: first audio 0.92 s, RTF 3.6-3.8, 4.5 GB (~20x slower per frame under "
        "a competing load)",
        "official PyTorch: RTF ~16",
    ),
}
