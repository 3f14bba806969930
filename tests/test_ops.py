"""The custom kernels against numpy (float64): the sin^2 of SnakeBeta (its 8-lane and one-by-one
paths), the windowed attention, the residual convs in Winograd's form, and the portable loops a
CPU without AVX2 runs."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    REFERENCE,
    amd_cpu,
    cpu_flags,
    decode_with_kernels,
    ref_array,
    ref_codes,
    run_fresh,
)

from wyoming_kazeia import native
from wyoming_kazeia._native import testing
from wyoming_kazeia.convert import convert_part
from wyoming_kazeia.native import SpeechDecoder


def test_sin_squared_accuracy() -> None:
    rng = np.random.default_rng(0)
    xs = np.concatenate(
        [
            rng.uniform(-4, 4, 2000),
            rng.uniform(-200, 200, 2000),
            rng.uniform(-5e4, 5e4, 500),
            np.array([0.0, np.pi / 2, -np.pi / 2, np.pi, 1e-8, -1e-8, 3 * np.pi / 4]),
        ]
    ).astype(np.float32)
    assert len(xs) % 8 != 0  # the last few values take the one-by-one path
    exact = np.sin(xs.astype(np.float64)) ** 2
    lanes = testing.sin_squared(xs)
    one_by_one = np.concatenate([testing.sin_squared(xs[i : i + 1]) for i in range(len(xs))])
    # A few float32 ulp of a value <= 1, for arguments up to 5e4 (the Cody-Waite reduction by
    # pi/2 in three parts keeps large arguments exact enough). Measured max: 1.1e-7.
    for ours in (lanes, one_by_one):
        assert ours.dtype == np.float32 and ours.shape == xs.shape
        assert np.abs(ours - exact).max() < 3e-7


def attention_numpy(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, n_kv_heads: int, scale: float
) -> np.ndarray:
    n, heads, hd = q.shape
    group = heads // n_kv_heads
    out = np.zeros((n, heads, hd))
    for h in range(heads):
        g = h // group
        kh = k[:, g * hd : (g + 1) * hd].astype(np.float64)
        vh = v[:, g * hd : (g + 1) * hd].astype(np.float64)
        scores = q[:, h, :].astype(np.float64) @ kh.T * scale + mask
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h, :] = (p / p.sum(axis=1, keepdims=True)) @ vh
    return out.reshape(n, heads * hd)


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (6, 1)])
def test_window_attention_against_numpy(heads: int, kv_heads: int) -> None:
    """The decoder's attention op (grouped heads included, which the published decoders do not
    use) against float64 numpy: a sliding causal window where early queries see fewer keys."""
    rng = np.random.default_rng(heads * 10 + kv_heads)
    n, hist, hd = 5, 7, 16
    n_kv = hist + n
    q = rng.standard_normal((n, heads, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32)
    window = 4  # query i sees keys hist + i - window + 1 .. hist + i
    mask = np.full((n, n_kv), -np.inf, dtype=np.float32)
    for i in range(n):
        mask[i, hist + i - window + 1 : hist + i + 1] = 0.0
    scale = hd**-0.5
    ours = testing.window_attention(q, k, v, mask, kv_heads, scale)
    assert ours.shape == (n, heads * hd)
    np.testing.assert_allclose(ours, attention_numpy(q, k, v, mask, kv_heads, scale), atol=1e-5)


@pytest.mark.parametrize("in_ggml_ops", [False, True], ids=["our-op", "ggml-ops"])
@pytest.mark.parametrize("cache_capacity", [0, 19], ids=["rows-side-by-side", "head-major-cache"])
def test_attention_reads_only_the_slots_in_use_of_either_layout(
    cache_capacity: int, in_ggml_ops: bool
) -> None:
    """The talker's attention reads a head-major cache with spare slots (NaN here: read, they
    would poison every output), the decoder's rows of all heads side by side: both layouts, in
    our op and in the ggml ops a GPU runs, against float64 numpy, with grouped heads."""
    rng = np.random.default_rng(cache_capacity + in_ggml_ops)
    n, hist, hd, heads, kv_heads = 3, 9, 8, 6, 2
    n_kv = hist + n
    q = rng.standard_normal((n, heads, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32)
    mask = np.zeros((n, n_kv), np.float32)
    for i in range(n):  # causal: query i sees the history and itself
        mask[i, hist + i + 1 :] = -np.inf
    scale = hd**-0.5
    ours = testing.window_attention(
        q, k, v, mask, kv_heads, scale, cache_capacity=cache_capacity, in_ggml_ops=in_ggml_ops
    )
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, attention_numpy(q, k, v, mask, kv_heads, scale), atol=1e-5)


@pytest.mark.parametrize("hd", [48, 80, 128])
def test_attention_over_many_positions_with_masked_slots_between(hd: int) -> None:
    """Rows longer than the op's tiles of positions, heads wider than its blocks of outputs (and
    not a multiple of them), masked slots before, between and after the ones a query sees, in a
    head-major cache with spare slots: against float64 numpy."""
    rng = np.random.default_rng(hd)
    n, n_kv, heads, kv_heads = 3, 100, 4, 2
    q = rng.standard_normal((n, heads, hd)).astype(np.float32)
    k = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32)
    v = rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32)
    mask = np.where(rng.random((n, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, :5] = -np.inf
    mask[:, 90:] = -np.inf
    mask[:, 40] = 0.0  # every query sees something
    scale = hd**-0.5
    ours = testing.window_attention(q, k, v, mask, kv_heads, scale, cache_capacity=n_kv + 7)
    np.testing.assert_allclose(ours, attention_numpy(q, k, v, mask, kv_heads, scale), atol=1e-5)


# The talker's attention over an f16 cache (kv_cache_type f16) with grouped heads of two
# (scored in pairs), of one and of three (a pair, then one), heads not a multiple of the vector
# widths (the widening's and the pair's tails), rows longer than the op's tiles, masked and
# spare slots: ours and float64 numpy's on the values the cache holds (rounded to f16), every
# case concatenated.
F16_CACHE_ATTENTION = """
import sys
import numpy as np
from wyoming_kazeia._native import testing
ours, ref = [], []
cases = [(4, 2, 128, 100), (4, 2, 40, 37), (3, 3, 48, 70), (4, 2, 36, 50), (6, 2, 20, 60)]
for heads, kv_heads, hd, n_kv in cases:
    rng = np.random.default_rng(hd)
    q = rng.standard_normal((2, heads, hd)).astype(np.float32)
    k, v = (3 * rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32) for _ in "kv")
    mask = np.where(rng.random((2, n_kv)) < 0.3, -np.inf, 0.0).astype(np.float32)
    mask[:, :3] = -np.inf
    mask[:, 30] = 0.0
    out = testing.window_attention(q, k, v, mask, kv_heads, hd**-0.5, n_kv + 5, False, "f16")
    kr, vr = (x.astype(np.float16).astype(np.float64) for x in (k, v))
    group = heads // kv_heads
    expected = np.zeros((2, heads, hd))
    for h in range(heads):
        g = h // group
        s = q[:, h].astype(np.float64) @ kr[:, g * hd : (g + 1) * hd].T * hd**-0.5 + mask
        p = np.exp(s - s.max(axis=1, keepdims=True))
        expected[:, h] = (p / p.sum(axis=1, keepdims=True)) @ vr[:, g * hd : (g + 1) * hd]
    ours.append(out.ravel())
    ref.append(expected.ravel())
np.savez(sys.argv[1], ours=np.concatenate(ours), numpy=np.concatenate(ref))
"""


@pytest.mark.parametrize("kernels", ["", "portable"], ids=["this-cpu", "portable"])
def test_an_f16_cache_is_attended_as_the_values_it_holds(kernels: str, tmp_path: Path) -> None:
    """kv_cache_type f16: the op widens the stored halves exactly and then computes in f32, so
    its result is the attention of the rounded keys and values (float64 numpy on them) within
    f32 sums; against the unrounded ones it would be off by ~1e-3."""
    got = run_fresh(F16_CACHE_ATTENTION, tmp_path / "out.npz", [], {"KAZEIA_KERNELS": kernels})
    ours, expected = got["ours"], got["numpy"]
    assert np.isfinite(ours).all()
    np.testing.assert_allclose(ours, expected, atol=2e-5)


@pytest.mark.parametrize("in_ggml_ops", [False, True], ids=["our-op", "ggml-ops"])
def test_an_f16_cache_gives_the_same_attention_in_our_op_and_in_ggml_ops(in_ggml_ops: bool) -> None:
    """A GPU's talker reads its f16 cache through ggml's ops (widened to f32 first, so that the
    query and the weights are not rounded too): the same values as our op, within f32 sums."""
    rng = np.random.default_rng(7)
    n, n_kv, hd, heads, kv_heads = 3, 45, 64, 4, 2
    q = rng.standard_normal((n, heads, hd)).astype(np.float32)
    k, v = (rng.standard_normal((n_kv, kv_heads * hd)).astype(np.float32) for _ in "kv")
    mask = np.zeros((n, n_kv), np.float32)
    mask[:, 40:] = -np.inf
    scale = hd**-0.5
    kr, vr = (x.astype(np.float16).astype(np.float32) for x in (k, v))
    ours = testing.window_attention(
        q, k, v, mask, kv_heads, scale, cache_capacity=n_kv + 3, in_ggml_ops=in_ggml_ops,
        cache_type="f16",
    )  # fmt: skip
    np.testing.assert_allclose(ours, attention_numpy(q, kr, vr, mask, kv_heads, scale), atol=1e-5)


def test_window_attention_rejects_bad_shapes() -> None:
    q = np.zeros((2, 4, 8), np.float32)
    kv = np.zeros((3, 16), np.float32)
    with pytest.raises(ValueError, match="inconsistent shapes"):
        testing.window_attention(q, kv, kv, np.zeros((2, 3), np.float32), 3, 1.0)


def conv_numpy(w: np.ndarray, x: np.ndarray, taps: int, dilation: int) -> np.ndarray:
    """y[t] = sum_j W_j x[t + j * dilation] in float64 (w [out, taps * in], x [cols, in])."""
    n_in = x.shape[1]
    length = x.shape[0] - (taps - 1) * dilation
    y = np.zeros((length, w.shape[0]))
    for j in range(taps):
        tap = w[:, j * n_in : (j + 1) * n_in].astype(np.float64)
        y += x[j * dilation : j * dilation + length].astype(np.float64) @ tap.T
    return y


# (in, out, taps, dilation, period, frames): the vocoder's residual convs (7 taps, dilations 1,
# 3 and 9, frames of 32 and 160 columns, where a dilation's pairs leave columns over at the end
# of a frame), fewer taps, and the narrowest frame a dilation allows (2 * dilation columns).
WINOGRAD_SHAPES = [
    (32, 48, 7, 1, 8, 3),
    (64, 32, 7, 3, 32, 2),
    (96, 96, 7, 9, 32, 4),
    (48, 16, 7, 9, 160, 1),
    (40, 32, 3, 2, 5, 4),
    (16, 16, 2, 1, 2, 3),
    (24, 32, 5, 4, 8, 3),
]


@pytest.mark.parametrize(("n_in", "out", "taps", "dilation", "period", "frames"), WINOGRAD_SHAPES)
def test_winograd_conv_matches_numpy_and_frames_pushed_alone(
    n_in: int, out: int, taps: int, dilation: int, period: int, frames: int
) -> None:
    """The residual units' convs in Winograd's form F(2, taps): within 2e-5 of numpy (float64)
    on outputs of unit variance (measured up to 8.4e-6; the direct GEMM's error is 1.5e-6: the
    transforms round a few times more), and each frame computed alone, with its left context,
    gives the same bits as all frames at once (a streamed push holds whole frames)."""
    rng = np.random.default_rng(n_in * taps + dilation)
    w = (rng.standard_normal((out, taps * n_in)) / np.sqrt(taps * n_in)).astype(np.float32)
    context = (taps - 1) * dilation
    x = rng.standard_normal((frames * period + context, n_in)).astype(np.float32)
    whole = testing.conv_gemm(w, x, taps, dilation, "f32", 2, period)
    assert whole.shape == (frames * period, out)
    assert np.abs(whole - conv_numpy(w, x, taps, dilation)).max() < 2e-5
    alone = [
        testing.conv_gemm(
            w, x[f * period : (f + 1) * period + context], taps, dilation, "f32", 2, period
        )
        for f in range(frames)
    ]
    assert np.array_equal(np.concatenate(alone), whole)


def test_winograd_conv_rejects_frames_its_tiles_do_not_fit_and_other_precisions() -> None:
    w = np.zeros((16, 7 * 16), np.float32)
    x = np.zeros((40 + 18, 16), np.float32)
    for period in (5, 3):  # 40 columns are not whole frames of 3; 5 < 2 * dilation
        with pytest.raises(ValueError, match="Winograd"):
            testing.conv_gemm(w, x, 7, 3, "f32", 2, period)
    with pytest.raises(ValueError, match="f32 only"):
        testing.conv_gemm(w, x, 7, 3, "bf16", 2, 8)
    with pytest.raises(ValueError, match="unknown decoder precision"):
        testing.conv_gemm(w, x, 7, 3, "f64", 2, 8)


def test_the_portable_kernels_run_where_avx2_is_missing(
    decoder_gguf: dict[str, Path], tmp_path: Path
) -> None:
    """The kernels' run-time choice: forced to the portable loops (what an x86-64 CPU without
    AVX2 runs), sin^2 stays within a few ulp (6e-7: no fused multiply-adds), the decoder within
    1e-4 of the official forward and 6e-5 of the AVX2 path (measured 3.7e-5 on the tiny model:
    the residual convs' Winograd transforms round differently with and without fused
    multiply-adds; 1.3e-5 with those convs computed directly), and streaming still equals the
    full decode exactly."""
    codes = ref_codes("tiny-0.6b", "dec_codes")[:40]
    got = decode_with_kernels("portable", decoder_gguf["tiny-0.6b"], codes, tmp_path)
    assert str(got["isa"]).startswith("portable")
    exact = np.sin(got["xs"].astype(np.float64)) ** 2
    assert np.abs(got["sin2"] - exact).max() < 6e-7
    assert np.abs(got["full"] - ref_array("tiny-0.6b", "dec_wav_prefix40").ravel()).max() < 1e-4
    assert np.array_equal(got["streamed"], got["full"])
    vector = SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), threads=2).decode(codes)
    assert np.abs(got["full"] - vector).max() < 6e-5


@pytest.mark.parametrize("weights", ["f32", "f16"])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_decoder_gives_the_same_bits_on_the_avx2_and_avx512_paths(
    decoder_gguf: dict[str, Path], tmp_path: Path, weights: str, threads: int
) -> None:
    """The decoder GEMM's AVX-512 path (1 to 4 panels per kernel call, where the CPU has
    AVX-512F) runs every output lane's multiply-adds in the AVX2 path's order: forced to AVX2 in
    a fresh process, the full and the streamed decode give exactly the same samples, for f32 and
    f16 weights. With 2 threads the tiny decoder's tasks end in 1, 2 or 3 panels; with 1 thread
    they take 4 at a time."""
    if "decoder GEMM AVX-512" not in native.KERNEL_ISA:
        pytest.skip(f"this CPU runs no AVX-512 decoder GEMM ({native.KERNEL_ISA})")
    model = decoder_gguf["tiny-0.6b"]
    if weights == "f16":
        model = convert_part(
            "decoder", REFERENCE / "tiny-0.6b" / "model", tmp_path / "f16.gguf", "f16"
        )
    codes = ref_codes("tiny-0.6b", "dec_codes")[:40]
    got = decode_with_kernels("avx2", model, codes, tmp_path, threads)
    assert str(got["isa"]).startswith("AVX2 FMA F16C, q8_0")
    decoder = SpeechDecoder(str(model), threads=threads)
    stream = decoder.stream()
    assert np.array_equal(got["full"], decoder.decode(codes))
    streamed = np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, len(codes), 4)])
    assert np.array_equal(got["streamed"], streamed)


# Shapes of the q8_0 GEMM: talker-like, rows not a multiple of the 8-row panel (the rest goes
# through ggml's dot product), column counts around the micro-kernel's 8 and the threshold.
Q8_SHAPES = [(64, 256, 8), (64, 256, 13), (19, 64, 9), (256, 1024, 30), (40, 96, 17)]


def _q8_inputs(m: int, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(m * k + n)
    return rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal(
        (n, k), dtype=np.float32
    )


def test_weight_rows_are_read_as_one_stream_on_amd_and_as_streams_elsewhere() -> None:
    """The way the weight products that ggml's dot product computes row by row read their rows
    follows the CPU's vendor (what the prefetchers of each family serve best), unless
    KAZEIA_WEIGHT_READS forces one."""
    if os.environ.get("KAZEIA_WEIGHT_READS"):
        pytest.skip("KAZEIA_WEIGHT_READS is set in this environment")
    way = "one stream" if amd_cpu() else "4 prefetched streams"
    assert native.KERNEL_ISA.endswith(f"other rows read as {way}")


def test_q8_0_decoding_steps_run_our_dot_product_where_the_cpu_has_avx2() -> None:
    """The q8_0 products of a decoding step: our 4-row dot product where the CPU has AVX2 (its
    VNNI path where it has AVX-512 VNNI), ggml's row by row elsewhere (aarch64 included)."""
    if os.environ.get("KAZEIA_KERNELS"):
        pytest.skip("KAZEIA_KERNELS is set in this environment")
    assert f", q8_0 steps {q8_0_steps_path()}, " in native.KERNEL_ISA


def q8_0_steps_path(avx512: bool = True) -> str:
    """The path this CPU's q8_0 decoding steps take (`avx512`: unless AVX-512 is set aside)."""
    flags = cpu_flags()
    if platform.machine() != "x86_64" or not {"avx2", "fma", "f16c"} <= flags:
        return "ggml"
    return "AVX-512 VNNI" if avx512 and {"avx512_vnni", "avx512vl"} <= flags else "AVX2"


# Run in a fresh process with KAZEIA_KERNELS / KAZEIA_WEIGHT_READS set: the q8_0 products of a
# decoding step (rows x columns, threads); a last field 1 runs the prefill's q8_gemm first,
# which leaves the rows past the last whole 8-row panel to them.
ROW_READS = """
import sys
import numpy as np
from wyoming_kazeia import native
from wyoming_kazeia._native import testing
out = {}
for shape in sys.argv[2:]:
    m, k, n, threads, gemm = (int(v) for v in shape.split("x"))
    rng = np.random.default_rng(m * k + n)
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal((n, k), dtype=np.float32)
    got = testing.q8_matmul(w, x, gemm=bool(gemm), threads=threads)
    out[shape] = got["y"]
    out[shape + "_exact"] = got["x"].astype(np.float64) @ got["w"].astype(np.float64).T
np.savez(sys.argv[1], isa=np.array(native.KERNEL_ISA), **out)
"""

# Every way a decoding step's q8_0 rows are computed: ours on this CPU's path, ours forced to
# AVX2, and ggml's row by row read as 4 prefetched streams or as one stream.
ROW_WAYS = {
    "ours": {},
    "ours-avx2": {"KAZEIA_KERNELS": "avx2"},
    "ggml-streams": {"KAZEIA_KERNELS": "portable", "KAZEIA_WEIGHT_READS": "streams"},
    "ggml-sequential": {"KAZEIA_KERNELS": "portable", "KAZEIA_WEIGHT_READS": "sequential"},
}
# The q8_0 path each way runs on this CPU (the banner says it).
ROW_WAY_PATHS = {
    "ours": q8_0_steps_path(),
    "ours-avx2": q8_0_steps_path(avx512=False),
    "ggml-streams": "ggml",
    "ggml-sequential": "ggml",
}


def test_every_way_of_computing_q8_0_rows_gives_ggml_bits_for_every_row(tmp_path: Path) -> None:
    """The q8_0 products of a decoding step, each way forced in a fresh process (ROW_WAYS): with
    tasks and streams of uneven length (rows that no 4-row call takes, rows shorter than their
    cache lines, rows of more blocks than lines), every row of every column is there, against
    float64 on the same quantized values, and every way gives the same bits: ours repeats
    ggml's AVX2 operations lane for lane, and ggml's dot product is the same call either way of
    reading."""
    shapes = [
        "301x64x1x3x0",
        "1000x96x2x2x0",
        "7x32x1x4x0",
        "3x32x1x1x0",
        "4099x128x1x2x0",
        "517x4096x1x2x0",
        "260x1024x5x1x0",
        "19x64x9x2x1",
        "1003x96x13x2x1",
    ]
    got = {}
    for way, env_vars in ROW_WAYS.items():
        got[way] = run_fresh(ROW_READS, tmp_path / f"{way}.npz", shapes, env_vars)
        assert f", q8_0 steps {ROW_WAY_PATHS[way]}, " in str(got[way]["isa"]), way
        for shape in shapes:
            m, _, n, _, _ = (int(v) for v in shape.split("x"))
            y, exact = got[way][shape], got[way][shape + "_exact"]
            assert y.shape == (n, m)
            assert np.abs(y - exact).max() < 1e-5 * np.abs(exact).max(), (way, shape)
    for way in ROW_WAYS:
        for shape in shapes:
            assert np.array_equal(got[way][shape], got["ggml-streams"][shape]), (way, shape)


@pytest.mark.parametrize(("m", "k", "n"), Q8_SHAPES)
def test_q8_gemm_computes_the_quantized_product(m: int, k: int, n: int) -> None:
    """The prefill's q8_0 GEMM against float64 on the same quantized values (what the integer
    sums see) and against ggml's q8_0 dot product: both within 1e-5 of the largest output
    (float32 sums of K products; measured <= 3.2e-7)."""
    w, x = _q8_inputs(m, k, n)
    ours = testing.q8_matmul(w, x, gemm=True)
    ggml = testing.q8_matmul(w, x, gemm=False)
    exact = ours["x"].astype(np.float64) @ ours["w"].astype(np.float64).T
    scale = np.abs(exact).max()
    assert ours["y"].shape == (n, m)
    assert np.abs(ours["y"] - exact).max() < 1e-5 * scale
    assert np.abs(ours["y"] - ggml["y"]).max() < 1e-5 * scale


Q8_PATHS = """
import sys
import numpy as np
from wyoming_kazeia._native import testing
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2:]]
out = {}
for m, k, n in shapes:
    rng = np.random.default_rng(m * k + n)
    w = rng.standard_normal((m, k), dtype=np.float32)
    x = rng.standard_normal((n, k), dtype=np.float32)
    out[f"{m}x{k}x{n}"] = testing.q8_matmul(w, x)["y"]
    if m % 8 == 0:
        out[f"{m}x{k}x{n}_panels"] = testing.q8_matmul(w, x, panels=True)["y"]
np.savez(sys.argv[1], isa=np.array(testing.Q8_GEMM_ISA), **out)
"""

# Products with a matrix kept as panels (the code predictor's): whole panels of rows, one column
# (a decoding step), two (the predictor's first pass) and more (a prefill).
Q8_PANEL_SHAPES = [(64, 256, 1), (2048, 1024, 1), (1024, 3072, 1), (256, 1024, 2), (64, 256, 13)]


@pytest.mark.parametrize(("m", "k", "n"), Q8_PANEL_SHAPES)
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_a_matrix_kept_as_panels_gives_the_bits_of_the_q8_gemm(
    m: int, k: int, n: int, threads: int
) -> None:
    """A q8_0 matrix packed once into the GEMM's panels and multiplied from them gives the bits
    of the GEMM that packs its panels per product (the same kernels on the same values), for
    any number of columns and threads, within 1e-5 of float64 on the same quantized values."""
    w, x = _q8_inputs(m, k, n)
    packed = testing.q8_matmul(w, x, panels=True, threads=threads)
    gemm = testing.q8_matmul(w, x, gemm=True, threads=threads)
    exact = packed["x"].astype(np.float64) @ packed["w"].astype(np.float64).T
    assert packed["y"].shape == (n, m)
    assert np.abs(packed["y"] - exact).max() < 1e-5 * np.abs(exact).max()
    assert np.array_equal(packed["y"], gemm["y"])


@pytest.mark.parametrize("n", [1, 2, 13])
@pytest.mark.parametrize("way", ["rows", "gemm", "panels"])
def test_a_row_gets_the_same_bits_in_a_joined_matrix_as_in_its_own(n: int, way: str) -> None:
    """A layer's q, k and v (and gate and up) are multiplied as one joined matrix: each of its
    rows gives the same bits as in the product of its own matrix, for one column (a step), two
    and more (a prefill), read as rows, by the GEMM or from panels, on 1 to 3 threads (parts
    of uneven size: the tasks do not split at their edges)."""
    rng = np.random.default_rng(n)
    parts = [rng.standard_normal((m, 256), dtype=np.float32) for m in (40, 24, 88)]
    x = rng.standard_normal((n, 256), dtype=np.float32)
    kwargs = {"gemm": way != "rows", "panels": way == "panels"}
    for threads in (1, 2, 3):
        joined = testing.q8_matmul(np.concatenate(parts), x, threads=threads, **kwargs)["y"]
        apart = [testing.q8_matmul(w, x, threads=threads, **kwargs)["y"] for w in parts]
        assert np.array_equal(joined, np.concatenate(apart, axis=1)), threads


@pytest.mark.parametrize("a_as_panels", [False, True])
def test_only_adjacent_copies_kept_alike_are_joined(a_as_panels: bool) -> None:
    """A layer's copies are joined into one matrix only where they lie back to back in the
    copies' buffer in the order given, of one type and row length, each a whole number of the
    GEMM's 8-row blocks, and kept the same way (rows or panels); elsewhere joined() refuses and
    the layer keeps its separate products. The copies, in buffer order: a, b, c (q8_0, 256
    columns; 16, 8, 24 rows), d (f32), e (q8_0, 12 rows), f (q8_0, 8 rows), g (q8_0, 128
    columns)."""
    if a_as_panels and testing.Q8_GEMM_ISA == "portable":
        pytest.skip("no q8_0 panels without a vector path")
    got = dict(testing.joined_rows(a_as_panels))
    assert got["bc"] == 32
    assert got["cb"] == 0  # not in buffer order
    assert got["ac"] == 0  # not adjacent
    assert got["cd"] == 0  # another type
    assert got["ef"] == 0  # 12 rows: not whole 8-row blocks
    assert got["fg"] == 0  # another row length
    # a kept as panels, b as rows: refused; both as rows: joined.
    assert (got["ab"], got["abc"]) == ((0, 0) if a_as_panels else (24, 48))


def test_panels_need_whole_panels_of_rows() -> None:
    """A matrix whose rows are not a whole number of 8-row panels is refused, not misread."""
    w, x = _q8_inputs(20, 64, 1)
    with pytest.raises(ValueError, match="multiple of 8"):
        testing.q8_matmul(w, x, panels=True)


@pytest.mark.parametrize("forced", ["portable", "avx2"])
def test_q8_gemm_gives_the_same_bits_on_every_path(forced: str, tmp_path: Path) -> None:
    """Every path of the GEMM (forced by KAZEIA_KERNELS in a fresh process) gives exactly the
    bits of the path this CPU runs, whether it packs its panels per product or multiplies a
    matrix kept as panels: integer sums are exact and the float steps are the same operations
    in the same order. (The NEON path: tests/test_arm64.py.)"""
    if forced == "avx2" and testing.Q8_GEMM_ISA not in ("AVX2", "AVX-512 VNNI"):
        pytest.skip(f"this CPU has no AVX2 ({testing.Q8_GEMM_ISA})")
    shapes = [f"{m}x{k}x{n}" for m, k, n in Q8_SHAPES]
    got = run_fresh(Q8_PATHS, tmp_path / "forced.npz", shapes, {"KAZEIA_KERNELS": forced})
    assert str(got["isa"]) == {"portable": "portable", "avx2": "AVX2"}[forced]
    for m, k, n in Q8_SHAPES:
        native_y = testing.q8_matmul(*_q8_inputs(m, k, n))["y"]
        assert np.array_equal(got[f"{m}x{k}x{n}"], native_y), (m, k, n)
        if m % 8 == 0:  # a matrix kept as panels, packed for the forced path
            assert np.array_equal(got[f"{m}x{k}x{n}_panels"], native_y), (m, k, n)


# /proc/cpuinfo's names for the instruction sets ggml reports (x86 "flags", ARM "Features").
CPUINFO_NAMES = {"SSE3": "pni", "AVX512": "avx512f", "NEON": "asimd", "AVX_VNNI": "avx_vnni"}


def test_the_ggml_cpu_library_uses_only_what_this_cpu_has() -> None:
    """The banner's CPU line: the ggml CPU library that runs here reports instruction sets,
    and each one is in this CPU's /proc/cpuinfo (a variant above the CPU would die with
    SIGILL instead)."""
    cpuinfo = Path("/proc/cpuinfo").read_text()
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    features = native.ggml_cpu_features()
    assert native.ggml_cpu_variant() and features
    for feature in features:
        assert CPUINFO_NAMES.get(feature, feature.lower()) in flags, feature


@pytest.mark.skipif(platform.machine() != "x86_64", reason="names an x86-64 variant")
@pytest.mark.skipif(
    native.ggml_cpu_variant() == "linked", reason="ggml has one CPU library: no variant to name"
)
def test_kazeia_ggml_cpu_loads_the_named_variant_or_says_why_not() -> None:
    """KAZEIA_GGML_CPU names the ggml CPU library to load (an older CPU's, for a bench), and a
    name that is not there, or needs more than this CPU has, is an error that names it."""
    code = "from wyoming_kazeia import native; print(native.ggml_cpu_variant())"

    def variant(name: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "KAZEIA_GGML_CPU": name}
        return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)

    run = variant("sse42")  # x86-64-v2: every x86-64 CPU the engine runs on
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "sse42"
    run = variant("no-such-cpu")
    assert run.returncode != 0
    assert "KAZEIA_GGML_CPU=no-such-cpu" in run.stderr


# Run in a fresh process (KAZEIA_SHORT_SLICES set or not): argv = out.npz. The main thread
# first goes back to the kernel's slice (a process inherits its parent's: pytest's main thread
# runs pools too), then to SCHED_BATCH and nice 5, which the pool's threads inherit and must
# keep; then whether the kernel takes a 0.1 ms slice on a thread of the script's own, and what
# the kernel says of a pool's threads: [slice, nice, policy] each.
POOL_SCHEDULING = """
import os
import sys
import threading
import numpy as np
from wyoming_kazeia._native import testing
reset = testing.set_thread_time_slice(0)
os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
os.nice(5)
default = testing.thread_time_slice_ns()
took = []
def probe():
    testing.set_thread_time_slice(testing.SHORT_TIME_SLICE_NS)
    took.append(testing.thread_time_slice_ns() == testing.SHORT_TIME_SLICE_NS)
thread = threading.Thread(target=probe)
thread.start()
thread.join()
got = testing.pool_thread_scheduling(3)
np.savez(sys.argv[1], reset=reset, default=default, took=took[0],
         threads=[got["caller"], *got["workers"]])
"""


@pytest.mark.parametrize("setting", ["", "off"])
def test_a_pools_threads_ask_the_kernel_for_short_time_slices(setting: str, tmp_path: Path) -> None:
    """Every thread that runs a pool's tasks, its caller included, runs with 0.1 ms time slices
    where the kernel grants them (Linux's EEVDF scheduler: see docs/hardware.md), and keeps its
    policy and nice value; KAZEIA_SHORT_SLICES=off leaves their slices as they were."""
    got = run_fresh(POOL_SCHEDULING, tmp_path / "sched.npz", [], {"KAZEIA_SHORT_SLICES": setting})
    if not (bool(got["reset"]) and bool(got["took"])):
        pytest.skip("the kernel did not take a 0.1 ms time slice on a thread of this process")
    short, default = int(testing.SHORT_TIME_SLICE_NS), int(got["default"])
    assert default != short
    threads = [tuple(int(v) for v in t) for t in got["threads"]]
    assert len(threads) >= 2, "no worker took a task"
    slice_ = default if setting == "off" else short
    assert threads == [(slice_, 5, os.SCHED_BATCH)] * len(threads)


@pytest.mark.parametrize(
    ("cores", "decoder_threads", "alone"),
    [(2, 2, True), (3, 3, True), (2, 0, False), (2, 1, False), (3, 2, False)],
)
def test_a_generators_pool_computes_alone_while_a_decoder_push_takes_every_core(
    cores: int, decoder_threads: int, alone: bool
) -> None:
    """While a decoder push computes on as many threads as the cores the two share, the
    generator's pool runs every task on its own thread; with no push, or with cores to spare
    beside the push, its workers take tasks too. A negative core count is refused."""
    with pytest.raises(ValueError, match="cores must be >= 0"):
        native.CoreShare(cores=-1)
    share = native.CoreShare(cores=cores)
    assert share.cores == cores
    seconds = 0.5 if alone else 2.0  # waiting for a worker that should never come, or should
    threads = testing.pool_threads_beside_decoder(3, share, decoder_threads, seconds)
    assert (threads == 1) is alone, f"{threads} threads took tasks"
    assert not share.generator_alone  # the push is over


@pytest.mark.parametrize(
    ("cores", "threads", "generator_computing", "expected"),
    [(2, 2, True, 1), (2, 2, False, 2), (3, 3, True, 2), (3, 2, True, 2), (1, 2, True, 1)],
)
def test_a_decoder_push_leaves_a_core_to_the_generator_computing_beside_it(
    cores: int, threads: int, generator_computing: bool, expected: int
) -> None:
    """While a decoder push takes every core the two stages share and a generation computes
    beside it (alone on its own thread), each of the push's jobs runs on one core fewer (at
    least one); with no generation computing (the first push of an answer, which the generator
    waits for), or with cores to spare beside the push, on all of the decoder's threads."""
    share = native.CoreShare(cores=cores)
    got = testing.decoder_pool_threads(threads, share, generator_computing)
    assert got == expected, f"{got} threads took the tasks of one job"


L3_OF_CPU0 = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")


@pytest.mark.skipif(not L3_OF_CPU0.exists(), reason="the kernel reports no L3 cache here")
def test_the_panels_choice_reads_the_l3_cache_the_kernel_reports() -> None:
    """The size of the L3 cache that decides whether the code predictor keeps panels is the one
    the first CPU uses as the kernel reports it, not glibc's figure (from a CPUID leaf that gave
    320 MB on a 2-vCPU AMD EPYC guest whose vCPUs share a 32 MB L3)."""
    text = L3_OF_CPU0.read_text().strip()
    units = {"K": 1024, "M": 1024 * 1024}
    expected = int(text.rstrip("KM")) * units.get(text[-1], 1)
    assert testing.last_level_cache_bytes() == expected
