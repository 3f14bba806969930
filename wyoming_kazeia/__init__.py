"""Kazeia TTS: a Wyoming text-to-speech service running Qwen3-TTS on a native ggml engine."""

__version__ = "0.1.0"
