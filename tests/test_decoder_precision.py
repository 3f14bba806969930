"""The decoder's bf16 products (decoder_precision bf16): their error against f32, exact streams,
every path (AMX, AVX-512 BF16, AVX-512, AVX2, portable) within that error, and the setting
through the kazeia-decoder process and its errors; the f32 decoder's memory for the weights it
transforms or widens."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from conftest import amd_cpu, cpu_flags, decode_with_kernels, ref_codes, run_fresh, snr_db

from wyoming_kazeia import native
from wyoming_kazeia.convert import convert_part
from wyoming_kazeia.native import SpeechDecoder

CLI = str(Path(sys.executable).parent / "kazeia-decoder")


def bf16_path(forced: str = "") -> str:
    """Where this CPU runs the bf16 products (with KAZEIA_KERNELS=forced): AMX where it has
    AMX-BF16 (Linux grants the tile registers to every process that asks), else AVX-512 BF16's
    pair dot products on an AMD CPU with those (or forced: avx512bf16), else the decoder GEMM's
    vector path."""
    flags = cpu_flags()
    if platform.machine() != "x86_64":
        return "NEON" if platform.machine() == "aarch64" else "portable"
    if not {"avx2", "fma", "f16c"} <= flags or forced == "portable":
        return "portable"
    if "avx512f" not in flags or forced == "avx2":
        return "AVX2"
    if {"amx_bf16", "amx_tile"} <= flags and not forced:
        return "AMX"
    if "avx512_bf16" in flags and (forced == "avx512bf16" or (amd_cpu() and not forced)):
        return "AVX-512 BF16"
    return "AVX-512"


def test_bf16_runs_on_amx_or_on_amds_avx512_bf16_where_the_cpu_has_them() -> None:
    if os.environ.get("KAZEIA_KERNELS"):
        pytest.skip("KAZEIA_KERNELS is set in this environment")
    assert native.decoder_bf16_isa() == bf16_path()


# Run in a fresh process: whether Linux granted this process the AMX tile registers, after the
# module's import and cpu_has_amx_bf16(), then after decoder_bf16_isa().
TILE_PERMISSION = """
import ctypes
import sys
import numpy as np
from wyoming_kazeia import native
libc = ctypes.CDLL(None, use_errno=True)
def granted():
    bits = ctypes.c_uint64(0)
    libc.syscall(158, 0x1022, ctypes.byref(bits))  # arch_prctl(ARCH_GET_XCOMP_PERM)
    return bool(bits.value & (1 << 18))  # XFEATURE_XTILEDATA
has = native.cpu_has_amx_bf16()
before = granted()
isa = native.decoder_bf16_isa()
np.savez(sys.argv[1], has=has, before=before, after=granted(), isa=isa)
"""


@pytest.mark.skipif(platform.machine() != "x86_64", reason="AMX is x86-64's")
def test_only_naming_or_packing_the_amx_path_asks_linux_for_the_tiles(tmp_path: Path) -> None:
    """A process with the tile registers needs larger signal frames: an f32 process (the
    service's start log included, which asks cpu_has_amx_bf16) never asks for them; naming the
    bf16 path asks, as packing bf16 weights does."""
    got = run_fresh(TILE_PERMISSION, tmp_path / "perm.npz", [], {})
    assert bool(got["has"]) == (bf16_path() == "AMX")
    assert not got["before"]
    assert bool(got["after"]) == (str(got["isa"]) == "AMX")


# (out, in, taps, dilation, output columns): inputs of whole AMX K tiles (in % 32 == 0) and not,
# a streamed frame's 1-5 columns and wide inputs, dilated taps.
CONV_SHAPES = [
    (32, 64, 1, 1, 1),
    (48, 96, 3, 2, 40),
    (16, 24, 7, 3, 30),
    (64, 256, 2, 1, 100),
    (32, 32, 7, 9, 70),
    (16, 768, 1, 1, 5),
]

# Run in a fresh process with KAZEIA_KERNELS set: the GEMM of every shape, every thread count.
CONV_PATHS = """
import sys
import numpy as np
from wyoming_kazeia import native
from wyoming_kazeia._native import testing
shapes = [tuple(int(v) for v in s.split("x")) for s in sys.argv[2:]]
rng = np.random.default_rng(0)
out = {"isa": np.array(native.decoder_bf16_isa())}
for i, (m, n_in, taps, dilation, cols) in enumerate(shapes):
    w = rng.standard_normal((m, taps * n_in)).astype(np.float32)
    x = rng.standard_normal((cols + (taps - 1) * dilation, n_in)).astype(np.float32)
    out[f"w{i}"], out[f"x{i}"] = w, x
    out[f"f32_{i}"] = testing.conv_gemm(w, x, taps, dilation, "f32")
    for threads in (1, 3):
        out[f"bf16_{i}_{threads}"] = testing.conv_gemm(w, x, taps, dilation, "bf16", threads)
    out[f"first_{i}"] = testing.conv_gemm(w, x[: 1 + (taps - 1) * dilation], taps, dilation, "bf16")
np.savez(sys.argv[1], **out)
"""


def bf16_bits(a: np.ndarray) -> np.ndarray:
    """The bf16 bits of float32 values: to nearest, ties to even; a NaN keeps its high half with
    the quiet bit set."""
    u = a.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def bf16(a: np.ndarray) -> np.ndarray:
    """float32 values rounded to bf16 (to nearest, ties to even), as float64."""
    bits = bf16_bits(a.astype(np.float32)).astype(np.uint32) << 16
    return bits.view(np.float32).astype(np.float64)


def conv(w: np.ndarray, x: np.ndarray, taps: int, dilation: int) -> np.ndarray:
    """y[t] = sum_j W_j x[t + j * dilation] in float64 (w [out, taps * in], x [cols, in])."""
    n_in, cols = x.shape[1], x.shape[0] - (taps - 1) * dilation
    return sum(
        x[j * dilation : j * dilation + cols] @ w[:, j * n_in : (j + 1) * n_in].T
        for j in range(taps)
    )


@pytest.mark.parametrize("forced", ["", "avx512bf16", "avx512", "avx2", "portable"])
def test_every_bf16_path_multiplies_bf16_values_and_sums_in_f32(
    tmp_path: Path, forced: str
) -> None:
    """Each path's GEMM against float64 numpy on the same bf16-rounded weights and inputs: the
    products of two bf16 values are exact in f32, so only the f32 sums differ, within
    sqrt(K) * 2^-24 * sum |w x| (measured at most 0.05 of that bound on AMX, AVX2 and the
    portable loops, 0.13 on AVX-512 BF16). Skipping the rounding of the inputs (or of the
    weights) would be 190-2500 times that bound away: the f32 GEMM is checked to be, which shows
    the test can tell. Each shape's first column alone has the bits it has in the whole product:
    every output is one chain whatever the columns around it, so a streamed frame gets a full
    decode's bits."""
    if forced == "avx512bf16" and "avx512_bf16" not in cpu_flags():
        pytest.skip("no AVX512_BF16 on this CPU: the forced path would be another one again")
    shapes = ["x".join(map(str, s)) for s in CONV_SHAPES]
    got = run_fresh(CONV_PATHS, tmp_path / "conv.npz", shapes, {"KAZEIA_KERNELS": forced})
    assert str(got["isa"]) == bf16_path(forced)  # run_fresh leaves KAZEIA_KERNELS out for ""
    for i, (_, n_in, taps, dilation, _) in enumerate(CONV_SHAPES):
        w, x = got[f"w{i}"], got[f"x{i}"]
        expected = conv(bf16(w), bf16(x), taps, dilation)
        bound = (
            np.sqrt(taps * n_in) * 2.0**-24 * conv(np.abs(bf16(w)), np.abs(bf16(x)), taps, dilation)
        )
        for threads in (1, 3):
            assert np.all(np.abs(got[f"bf16_{i}_{threads}"] - expected) <= bound), (i, threads)
        assert np.array_equal(got[f"first_{i}"][0], got[f"bf16_{i}_1"][0]), i
        assert np.abs(got[f"f32_{i}"] - expected).max() > 100 * bound.max(), i


# Run in a fresh process with KAZEIA_KERNELS set: the bf16 bits of argv[2] float32 values.
BF16_BITS = """
import sys
import numpy as np
from wyoming_kazeia._native import testing
x = np.load(sys.argv[2])
np.savez(sys.argv[1], bits=testing.to_bf16(x))
"""


@pytest.mark.parametrize("forced", ["", "avx2", "portable"])
def test_every_path_rounds_to_bf16_with_the_same_bits(tmp_path: Path, forced: str) -> None:
    """The inputs' rounding (a vector loop where the CPU has one, 16 or 4 values at a time, the
    rest one by one) gives the portable conversion's bits: ties both ways, the largest finite
    values (to infinity), infinities, NaNs of both signs, subnormals, zeros."""
    specials = (
        np.frombuffer(
            bytes.fromhex(
                "00000000 80000000 3F808000 3F818000 3F807FFF 3F808001 7F7FFFFF FF7FFFFF 7F800000"
                "FF800000 7FC00000 FFC00001 7F800001 FF80FFFF 00000001 807FFFFF 00008000 00018000"
            ),
            dtype=">u4",
        )
        .astype(np.uint32)
        .view(np.float32)
    )
    rng = np.random.default_rng(1)
    noise = rng.integers(0, 2**32, 4000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([specials, noise, specials[:7]])  # a length of no whole vectors
    np.save(tmp_path / "x.npy", x)
    got = run_fresh(
        BF16_BITS, tmp_path / "bits.npz", [str(tmp_path / "x.npy")], {"KAZEIA_KERNELS": forced}
    )
    np.testing.assert_array_equal(got["bits"], bf16_bits(x))


def test_bf16_decoder_stays_within_its_stated_error_of_f32(
    decoder_gguf: dict[str, Path],
) -> None:
    """Weights and inputs rounded to bf16 (2^-9 relative), sums in f32. Random tiny weights
    amplify rounding more than trained ones: measured 23.0 dB (tiny, these codes) and 25.3 dB
    (full-size random 0.6B decoder) below the signal, where f16 weights alone give 30-46 dB;
    bound at 20 dB (the GEMM itself is checked far more tightly above), and above 60 dB would
    mean nothing was rounded at all."""
    codes = ref_codes("tiny-0.6b", "dec_codes_long")
    path = str(decoder_gguf["tiny-0.6b"])
    f32 = SpeechDecoder(path, threads=2).decode(codes)
    bf16_decoder = SpeechDecoder(path, threads=2, precision="bf16")
    assert bf16_decoder.precision == "bf16"
    assert 20 < snr_db(f32, bf16_decoder.decode(codes)) < 60


@pytest.mark.parametrize("threads", [1, 3])
def test_bf16_streams_give_the_samples_of_a_full_bf16_decode(
    decoder_gguf: dict[str, Path], threads: int
) -> None:
    """Each output is one chain of products in K order whatever the columns around it (an AMX
    tile of 16 columns or a streamed frame of 1): pushes of any size, any thread count, give
    the full decode's samples exactly."""
    codes = ref_codes("tiny-0.6b", "dec_codes_long")[:30]
    path = str(decoder_gguf["tiny-0.6b"])
    full = SpeechDecoder(path, threads=2, precision="bf16").decode(codes)
    stream = SpeechDecoder(path, threads=threads, precision="bf16").stream()
    sizes = [1, 3, 1, 16, 2, 7]
    pushed, at = [], 0
    for n in sizes:
        pushed.append(stream.push(codes[at : at + n]))
        at += n
    assert at == len(codes)
    assert np.array_equal(np.concatenate(pushed), full)


def test_every_bf16_decoder_path_stays_within_the_bf16_error(
    decoder_gguf: dict[str, Path], tmp_path: Path
) -> None:
    """The CPU's own path (AMX, or AVX-512 BF16 on AMD), AVX-512 BF16 with AMX set aside (where
    the CPU has it), AVX-512, AVX2 and the portable loops multiply the same bf16 weights and sum
    in f32, in other orders. A sum a rounding apart can round the next layer's input to the
    neighbouring bf16 value, so the paths do not agree to f32's rounding: each stays as far from
    f32 as the others (measured 23.0 dB on this model for every path) and they differ from each
    other by less than that (against portable: AMX 28.1 dB, AVX-512 BF16 37.7 dB, AVX2 43.5
    dB). Each streams exactly. run_fresh leaves KAZEIA_KERNELS out where forced is "", so every
    run's path is the one bf16_path names."""
    codes = ref_codes("tiny-0.6b", "dec_codes")[:40]
    model = decoder_gguf["tiny-0.6b"]
    runs = {
        forced: decode_with_kernels(forced, model, codes, tmp_path, precision="bf16")
        for forced in ("", "avx512bf16", "avx512", "avx2", "portable")
        if forced != "avx512bf16" or "avx512_bf16" in cpu_flags()
    }
    for forced, got in runs.items():
        assert str(got["bf16_isa"]) == bf16_path(forced), forced
    f32 = SpeechDecoder(str(model), threads=2).decode(codes)
    for forced, got in runs.items():
        assert np.array_equal(got["streamed"], got["full"]), forced
        assert 20 < snr_db(f32, got["full"]) < 60, forced
        if forced != "portable":
            assert snr_db(runs["portable"]["full"], got["full"]) > 20, forced


def test_the_decoder_process_multiplies_as_the_setting_says(
    decoder_gguf: dict[str, Path], tmp_path: Path
) -> None:
    """kazeia-decoder --precision bf16 gives the in-process bf16 decoder's samples; an unknown
    precision is a one-line error."""
    codes = ref_codes("tiny-0.6b", "dec_codes")[:12]
    path = str(decoder_gguf["tiny-0.6b"])
    (tmp_path / "codes.bin").write_bytes(codes.astype("<i4").tobytes())
    wav = tmp_path / "out.wav"
    args = [CLI, path, str(tmp_path / "codes.bin"), str(len(codes)), str(wav), "--float"]
    r = subprocess.run([*args, "--precision", "bf16"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    samples, _ = sf.read(wav, dtype="float32")
    expected = SpeechDecoder(path, threads=2, precision="bf16").decode(codes)
    assert np.array_equal(samples, expected)
    r = subprocess.run([*args, "--precision", "f16"], capture_output=True, text=True)
    assert r.returncode == 1
    assert "unknown decoder precision 'f16' (f32|bf16)" in r.stderr


def test_an_unknown_precision_is_an_input_error(decoder_gguf: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"unknown decoder precision 'int8' \(f32\|bf16\)"):
        SpeechDecoder(str(decoder_gguf["tiny-0.6b"]), precision="int8")


# Run in a fresh process: its resident memory grows only by what loading the decoder takes.
DECODER_LOAD_MEMORY = """
import sys
import numpy as np
from wyoming_kazeia.native import SpeechDecoder
def resident():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1]) << 10
before = resident()
decoder = SpeechDecoder(sys.argv[2], threads=1)
np.savez(sys.argv[1], grown=resident() - before)
"""


# The vocoder's convs whose f16 weights the loader holds in f32: those past the first block's
# upsampling (32 input columns a frame and more), where the kernels are bound by multiply-adds.
WIDENED = re.compile(r"dec\.voc\.blk\.([1-9]\d*\.up|\d+\.res\.\d+\.conv2)\.weight")


@pytest.mark.parametrize("weights", ["f32", "f16"])
def test_the_f32_decoder_holds_each_weight_once_in_the_form_it_reads(
    tmp_path: Path, weights: str
) -> None:
    """The residual convs' weights as the file holds them are read once, into Winograd's form
    (f32), and never again: their memory goes back. From an f16 file, the convs that the
    multiply-adds bound (past the first block's upsampling) are held widened to f32, and their
    f16 copy goes back too. So the full-size 0.6B decoder holds, from an f32 file, the file's
    weights plus the transformed ones less those (456 + 75 - 66 MB, not 532); from an f16 file
    the same less the f16 copies of the widened weights plus their f32 form (12 MB more)."""
    import gguf
    from kazeia_dev.bench.common import default_cache_dir, ensure_checkpoint, ensure_model

    if weights == "f32":
        path = ensure_model(default_cache_dir(), "0.6b", "f32") / "decoder.gguf"
    else:
        checkpoint = ensure_checkpoint(default_cache_dir(), "0.6b")
        path = convert_part("decoder", checkpoint, tmp_path / "decoder.gguf", "f16")
    tensors = gguf.GGUFReader(path).tensors
    file_bytes = sum(int(t.n_bytes) for t in tensors)
    res_conv1 = [
        t for t in tensors if t.name.startswith("dec.voc.") and t.name.endswith(".conv1.weight")
    ]
    assert len(res_conv1) == 12 and {t.tensor_type.name for t in res_conv1} == {weights.upper()}
    file_conv1 = sum(int(t.n_bytes) for t in res_conv1)
    winograd = sum(int(t.n_elements) for t in res_conv1) * 8 // 7 * 4  # 8 products for 7 taps
    widened = [t for t in tensors if WIDENED.fullmatch(t.name)]
    assert len(widened) == 15 and {t.tensor_type.name for t in widened} == {weights.upper()}
    # f32 weights are held as they are; f16 ones take twice their bytes in f32.
    widening = sum(int(t.n_bytes) for t in widened) if weights == "f16" else 0
    grown = int(run_fresh(DECODER_LOAD_MEMORY, tmp_path / "m.npz", [str(path)], {})["grown"])
    # What else loading takes (contexts, the thread pool): measured about 1 MB. Without the
    # transformed weights it would grow by the file's bytes alone, under the lower bound; without
    # the widening (12 MB from the f16 file) too.
    expected = file_bytes + winograd - file_conv1 + widening
    assert expected - (4 << 20) < grown < expected + (8 << 20), (grown - expected) / 1e6
