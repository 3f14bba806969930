"""Developer tools: random-weight checkpoints and other helpers for tests and benchmarks."""
