"""Generator API: sampling, determinism, streaming frames, cancellation and bad input."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import ref_array, run_fresh

from wyoming_kazeia import _native
from wyoming_kazeia._native import testing
from wyoming_kazeia.native import Generator, ModelError

IDS = ref_array("tiny-0.6b", "input_ids")


@pytest.fixture(scope="module")
def gen(talker_gguf: dict[str, Path]) -> Generator:
    return Generator(str(talker_gguf["tiny-0.6b"]), threads=2)


def test_same_seed_same_codes_any_thread_count(talker_gguf: dict[str, Path]) -> None:
    runs = []
    for threads in (1, 2, 3):
        g = Generator(str(talker_gguf["tiny-0.6b"]), threads=threads)
        runs.append(g.generate(IDS, "vivian", "english", seed=1234, max_frames=30))
    assert runs[0].shape[1] == 16
    assert all(np.array_equal(runs[0], r) for r in runs[1:])


def test_seeds_differ(gen: Generator) -> None:
    a = gen.generate(IDS, "vivian", seed=1, max_frames=20)
    b = gen.generate(IDS, "vivian", seed=2, max_frames=20)
    assert not np.array_equal(a, b)
    assert np.array_equal(a, gen.generate(IDS, "vivian", seed=1, max_frames=20))


def test_codes_in_range_and_no_early_eos(gen: Generator) -> None:
    hp = gen.hparams
    for seed in range(5):
        codes = gen.generate(IDS, "serena", "german", seed=seed, max_frames=25)
        assert 2 <= len(codes) <= 25  # eos is blocked for the first 2 frames
        assert (codes >= 0).all() and (codes[:, 1:] < 2048).all()
        # code 0 never takes a suppressed control token (2048..3071 except eos)
        assert (codes[:, 0] < hp["kazeia.talker.vocab_size"] - 1024).all()


def test_frames_stream_and_cancel(gen: Generator) -> None:
    it = gen.frames(IDS, "vivian", seed=5, max_frames=40)
    first = [next(it) for _ in range(3)]
    assert all(f.shape == (16,) and f.dtype == np.int32 for f in first)
    assert it.stats["frames"] == 3
    it.close()  # frees the session now
    with pytest.raises(StopIteration):
        next(it)
    full = gen.generate(IDS, "vivian", seed=5, max_frames=40)
    assert np.array_equal(np.stack(first), full[:3])


def test_sampling_options_change_output(gen: Generator) -> None:
    base = gen.generate(IDS, "vivian", seed=3, max_frames=15)
    greedy = gen.generate(IDS, "vivian", greedy=True, max_frames=15)
    assert np.array_equal(greedy, gen.generate(IDS, "vivian", greedy=True, seed=99, max_frames=15))
    top1 = gen.generate(IDS, "vivian", seed=3, top_k=1, max_frames=15, repetition_penalty=1.0)
    assert np.array_equal(
        top1, gen.generate(IDS, "vivian", greedy=True, max_frames=15, repetition_penalty=1.0)
    )
    assert not np.array_equal(base, top1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"speaker": "nobody"}, "unknown speaker 'nobody'; valid speakers: aiden, dylan, eric"),
        (
            {"language": "klingon"},
            "unknown language 'klingon'; valid languages: auto, beijing_dialect",
        ),
        ({"max_frames": 0}, "max_frames must be >= 1"),
        ({"temperature": 0.0}, "temperature must be > 0"),
        ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
        ({"top_k": -1}, "top_k must be >= 0"),
        ({"repetition_penalty": -1.0}, "repetition_penalty must be > 0"),
    ],
)
def test_bad_options(gen: Generator, kwargs: dict[str, object], message: str) -> None:
    args: dict[str, object] = {"speaker": "vivian", "max_frames": 5, **kwargs}
    with pytest.raises(ValueError, match=message):
        gen.generate(IDS, **args)  # type: ignore[arg-type]


def test_speaker_and_language_are_case_insensitive(gen: Generator) -> None:
    a = gen.generate(IDS, "Vivian", "English", greedy=True, max_frames=5)
    assert np.array_equal(a, gen.generate(IDS, "vivian", "english", greedy=True, max_frames=5))
    assert sorted(gen.speakers) == gen.speakers and "vivian" in gen.speakers
    assert "english" in gen.languages


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        (IDS[:8], "at least one text token"),
        (np.concatenate([[5], IDS[1:]]), "role tokens not found"),
        (np.where(np.arange(len(IDS)) == 4, 10**6, IDS), "outside 0..151935"),
        (IDS.astype(np.float32), "1-D sequence of integers"),
        (IDS.reshape(1, -1), "1-D sequence of integers"),
    ],
)
def test_bad_input_ids(gen: Generator, ids: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gen.generate(ids, "vivian", max_frames=3)


def test_decoder_gguf_is_not_a_talker(decoder_gguf: dict[str, Path]) -> None:
    with pytest.raises(ModelError, match="'kazeia-decoder' GGUF, expected 'kazeia-talker'"):
        Generator(str(decoder_gguf["tiny-0.6b"]))


def test_truncated_talker(tmp_path: Path, talker_gguf: dict[str, Path]) -> None:
    path = tmp_path / "t.gguf"
    path.write_bytes(talker_gguf["tiny-0.6b"].read_bytes()[:-100])
    with pytest.raises(ModelError, match="truncated"):
        Generator(str(path))


# --------------------------------------------------------------------------- processors


def draws(logits: np.ndarray, n: int = 2000, **kw: object) -> np.ndarray:
    args: dict[str, object] = {
        "history": [],
        "repetition_penalty": 1.0,
        "suppress_begin": 0,
        "suppress_end": 0,
        "keep": -1,
        "greedy": False,
        "temperature": 1.0,
        "top_k": 0,
        "top_p": 1.0,
        "seed": 7,
    }
    args.update(kw)
    return np.array(_native.testing.select_token(logits.astype(np.float32), n=n, **args))  # type: ignore[arg-type]


def test_suppressed_tokens_never_sampled() -> None:
    logits = np.zeros(32)
    logits[20:] = 5.0  # the suppressed range is the most likely one
    picks = draws(logits, suppress_begin=16, suppress_end=32, keep=30)
    assert set(picks) <= set(range(16)) | {30}
    assert 30 in picks  # the kept id (eos) stays possible


def test_top_k_respected() -> None:
    logits = np.linspace(0.0, 1.0, 50)
    picks = draws(logits, top_k=5)
    assert set(picks) == set(range(45, 50))


def test_top_k_keeps_ties() -> None:
    logits = np.array([1.0, 3.0, 2.0, 2.0, 0.5])
    assert set(draws(logits, top_k=2)) == {1, 2, 3}


def test_top_p_respected() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert set(draws(logits, top_p=0.7)) == {0, 1}
    assert set(draws(logits, top_p=0.85)) == {0, 1, 2}
    assert set(draws(logits, top_p=1e-6)) == {0}


def test_distribution_follows_temperature() -> None:
    logits = np.array([0.0, 1.0, 2.0])
    for temperature in (0.5, 1.0, 2.0):
        picks = draws(logits, n=20000, temperature=temperature)
        expected = np.exp(logits / temperature)
        expected /= expected.sum()
        observed = np.bincount(picks, minlength=3) / len(picks)
        assert np.abs(observed - expected).max() < 0.02, temperature


def test_repetition_penalty() -> None:
    logits = np.array([2.0, 1.9, -1.0, -1.1])
    assert draws(logits, n=1, greedy=True)[0] == 0
    # 2.0 / 1.2 < 1.9: the repeated token loses its lead
    assert draws(logits, n=1, greedy=True, history=[0, 0], repetition_penalty=1.2)[0] == 1
    # negative logits are multiplied: -1.0 * 1.2 < -1.1
    assert draws(logits[2:], n=1, greedy=True, history=[0], repetition_penalty=1.2)[0] == 1


def test_same_seed_same_draws() -> None:
    logits = np.random.default_rng(0).normal(size=100)
    assert np.array_equal(draws(logits, seed=11), draws(logits, seed=11))
    assert not np.array_equal(draws(logits, seed=11), draws(logits, seed=12))


def test_voice_prefix_cache_is_exact(talker_gguf: dict[str, Path]) -> None:
    """The voice rows' K/V are computed on first use and reused after: same results."""
    g = Generator(str(talker_gguf["tiny-1.7b"]), threads=2)
    ids = ref_array("tiny-1.7b", "input_ids")
    first = testing.trace(g, ids, "dylan", "auto", False, 6)  # computes and stores the prefix
    second = testing.trace(g, ids, "dylan", "auto", False, 6)  # loads it
    for key in ("talker_logits", "talker_hidden", "cp_logits", "codes"):
        assert np.array_equal(first[key], second[key]), key
    other = testing.trace(g, ids, "vivian", "english", False, 6)  # another voice: another prefix
    assert not np.array_equal(other["talker_logits"], first["talker_logits"])


def test_stops_at_eos(gen: Generator) -> None:
    """With flattened logits eos (1 of ~2049 allowed codes) comes within a few thousand
    frames; generation stops there (seeded, so the test is deterministic)."""
    flat: dict[str, Any] = {
        "seed": 21,
        "temperature": 1000.0,
        "top_k": 0,
        "repetition_penalty": 1.0,
    }
    codes = gen.generate(IDS, "vivian", **flat, max_frames=50000)
    assert 2 <= len(codes) < 50000
    assert (codes[:, 0] != gen.hparams["kazeia.ids.codec_eos"]).all()  # eos is not a frame
    assert np.array_equal(codes, gen.generate(IDS, "vivian", **flat, max_frames=50000))


def test_kv_cache_growth_is_exact(gen: Generator) -> None:
    """The talker cache grows in blocks (old slots copied, step graph rebuilt): growing every 7
    slots gives what one big block gives (up to fp32 summation order: the softmax rows differ
    in length; a lost or misplaced slot would change the logits by ~1)."""
    big = testing.trace(gen, IDS, "vivian", "english", False, 60, kv_block=1024)
    small = testing.trace(gen, IDS, "vivian", "english", False, 60, kv_block=7)
    assert big["codes"].shape == (60, 16)
    assert np.array_equal(big["codes"], small["codes"])
    for key in ("talker_logits", "talker_hidden", "cp_logits", "step_embeds"):
        assert np.abs(big[key] - small[key]).max() < 1e-4, key


def test_teacher_forcing_feeds_the_given_codes(gen: Generator) -> None:
    """forced_codes (quality measurements): forcing a greedy run's own codes reproduces its
    trace exactly; forcing other codes records them, keeps the first frame's talker logits
    (same prompt) and changes what follows; the run ends with the forced frames."""
    free = testing.trace(gen, IDS, "vivian", "english", False, 12)
    again = testing.trace(gen, IDS, "vivian", "english", False, 50, forced_codes=free["codes"])
    assert again["codes"].shape == (12, 16)  # at most the forced frames, despite max_frames
    for key in ("codes", "talker_logits", "cp_logits", "step_embeds"):
        assert np.array_equal(again[key], free[key]), key
    other = (free["codes"] + 7) % 2048
    forced = testing.trace(gen, IDS, "vivian", "english", False, 12, forced_codes=other)
    assert np.array_equal(forced["codes"], other)
    assert np.array_equal(forced["talker_logits"][0], free["talker_logits"][0])
    assert not np.allclose(forced["talker_logits"][1], free["talker_logits"][1])
    assert not np.allclose(forced["cp_logits"][0, 1:], free["cp_logits"][0, 1:])


@pytest.mark.parametrize(
    ("codes", "message"),
    [
        (np.full((3, 16), 4000), "outside 0..3071"),
        (np.full((3, 16), -1), "outside 0.."),
        (np.zeros((3, 15), dtype=np.int32), r"shape \[T >= 1, 16\]"),
        (np.zeros((3, 16), dtype=np.float32), "integer array"),
    ],
)
def test_bad_forced_codes_are_refused(gen: Generator, codes: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        testing.trace(gen, IDS, "vivian", "english", False, 3, forced_codes=codes)


# Run in a fresh process: what loading a generator adds to its memory, by kind.
GENERATOR_LOAD_MEMORY = """
import sys
import numpy as np
from wyoming_kazeia.native import Generator
def kib(path, key):
    line = [l for l in open(path) if l.startswith(key + ":")][0]
    return int(line.split()[1]) << 10
def status(key):
    return kib("/proc/self/status", key)
def advised():
    # The mappings the process asked huge pages for ("hg" in their VmFlags), in bytes.
    total, size = 0, 0
    for line in open("/proc/self/smaps"):
        if line.startswith("Size:"):
            size = int(line.split()[1]) << 10
        elif line.startswith("VmFlags:") and "hg" in line.split()[1:]:
            total += size
    return total
before = {k: status(k) for k in ("RssAnon", "RssFile")}
generator = Generator(sys.argv[2], threads=1)
np.savez(sys.argv[1], anon=status("RssAnon") - before["RssAnon"],
         mapped=status("RssFile") - before["RssFile"], peak=status("VmHWM"), rss=status("VmRSS"),
         huge=kib("/proc/self/smaps_rollup", "AnonHugePages"), advised=advised(),
         thp=kib("/proc/self/status", "THP_enabled") >> 10)
"""

# The tensors that every step reads in full: the two stacks' layers and norms, the heads, the
# code predictor's input projection (1.7B). The embedding tables and the text projection are
# read a few rows, or once a request.
READ_EVERY_STEP = re.compile(
    r"(tlk|cp)\.(blk\..+|norm\.weight|codec_head\.weight|heads\.weight|in_proj\..+)"
)


def test_the_stacks_weights_are_held_once_in_private_memory(tmp_path: Path) -> None:
    """Loading the full-size 0.6B talker copies the weights every step reads (2.1 GB in f32)
    into the process's own memory, with huge pages where the system grants them on request,
    and gives the file's pages of each back once it is copied: the mapped file then holds only
    what is read a few rows at a time, and the two never add up (the peak exceeds the end by at
    most the largest tensor being copied)."""
    import gguf
    from kazeia_dev.bench.common import default_cache_dir, ensure_model

    path = ensure_model(default_cache_dir(), "0.6b", "f32") / "talker.gguf"
    tensors = gguf.GGUFReader(path).tensors
    every_step = [t for t in tensors if READ_EVERY_STEP.fullmatch(t.name)]
    assert {t.name for t in every_step} >= {"tlk.codec_head.weight", "cp.heads.weight"}
    stacks = sum(int(t.n_bytes) for t in every_step)
    largest = max(int(t.n_bytes) for t in every_step)
    m = run_fresh(GENERATOR_LOAD_MEMORY, tmp_path / "m.npz", [str(path)], {})
    anon, mapped, peak, rss = (int(m[k]) for k in ("anon", "mapped", "peak", "rss"))
    # What else loading takes (contexts, the thread pool, the metadata): a few MB.
    assert stacks < anon < stacks + (16 << 20), (anon - stacks) / 1e6
    # Left mapped: the ends of pages the copied tensors share with their neighbours, and the
    # pages of the file's header and tables read while loading.
    page = os.sysconf("SC_PAGE_SIZE")
    assert mapped < 2 * len(every_step) * page + (4 << 20), mapped / 1e6
    assert peak < rss + largest + (16 << 20), (peak - rss) / 1e6
    # Each buffer's whole pages (the two stacks': a page at each end may be shared).
    assert int(m["advised"]) >= stacks - 4 * page, int(m["advised"]) / 1e6
    # Granted where the process may have them, in 2 MB pages, and the kernel looks for free
    # blocks (or makes them) when asked.
    thp = Path("/sys/kernel/mm/transparent_hugepage")
    if (
        int(m["thp"]) == 1
        and (thp / "hpage_pmd_size").is_file()
        and int((thp / "hpage_pmd_size").read_text()) == 2 << 20
        and "[never]" not in (thp / "enabled").read_text()
        and any(
            f"[{d}]" in (thp / "defrag").read_text() for d in ("always", "madvise", "defer+madvise")
        )
    ):
        assert int(m["huge"]) > stacks // 2, int(m["huge"]) / 1e6
