"""Quantized talker weights (q8_0, q6_k, q5_k, q4_k) against f32 on a mid-size random checkpoint.

The tiny references are too narrow for the quant block sizes (rows of 16 values fall back to
f16), so this test builds a checkpoint whose rows fit them: widths 256, the real vocabularies.
Reported: mean KL(f32 || quantized) of the next-token distributions and top-1 agreement, for
the talker (first code of 8 prompts) and the code predictor (15 heads of the first frame).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from conftest import mid_checkpoint, run_fresh
from kazeia_dev.bench.quality import mean_kl

from wyoming_kazeia._native import testing
from wyoming_kazeia.convert import convert_part
from wyoming_kazeia.errors import InputError
from wyoming_kazeia.native import Generator, formats


# Gaussian rows lose ~0.5% (q8_0), ~1.8% (q6_k), ~3.6% (q5_k), ~7% (q4_k): each bit less
# doubles the error. The bounds leave room for another seed, not for a wrong format.
@pytest.mark.parametrize(
    ("qtype", "max_err"), [("q8_0", 0.01), ("q6_k", 0.025), ("q5_k", 0.05), ("q4_k", 0.1)]
)
def test_weight_error(qtype: str, max_err: float) -> None:
    """Relative RMS error of ggml's quantizers on Gaussian rows, via gguf-py's dequantizer."""
    import gguf

    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    raw = np.frombuffer(formats.quantize(x, qtype), np.uint8).reshape(64, -1)
    y = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype.upper()])
    err = float(np.sqrt(((y - x) ** 2).mean() / (x**2).mean()))
    assert 0 < err < max_err


@pytest.mark.parametrize(
    ("shape", "qtype", "message"),
    [
        ((4, 0), "q6_k", "rows of 0 values"),
        ((0,), "q8_0", "rows of 0 values"),
        ((2, 128), "q5_k", "rows of 128 values, q5_k needs a multiple of 256"),
        ((2, 256), "q3_k", "must be one of f16, q8_0, q6_k, q5_k, q4_k, got q3_k"),
    ],
)
def test_quantize_refuses_what_it_cannot_store(
    shape: tuple[int, ...], qtype: str, message: str
) -> None:
    with pytest.raises(InputError, match=message):
        formats.quantize(np.zeros(shape, np.float32), qtype)


# Bounds. Random Gaussian weights have no structure for fewer bits to exploit: q4_k's weight
# error is ~7% RMS (q8_0: ~0.5%, see test_weight_error), it compounds through the layers, and
# random heads give flat logits whose top-2 gaps are small, so q4_k flips many argmaxes here
# (q6_k and q5_k fewer: measured KL about 1e-2 and 3e-2). Real checkpoints are more forgiving;
# these bounds catch a broken quantizer or kernel (which gives KL >> 1 and chance-level
# agreement, ~1/2048).
@pytest.mark.parametrize(
    ("qtype", "max_kl", "min_top1"),
    [
        ("q8_0", 5e-3, 0.95),
        ("q6_k", 0.05, 0.8),
        ("q5_k", 0.1, 0.65),
        ("q4_k", 0.3, 0.5),
        ("q4_k_mix", 0.3, 0.5),
    ],
)
def test_quantized_logits_close_to_f32(
    tmp_path_factory: pytest.TempPathFactory,
    qtype: str,
    max_kl: float,
    min_top1: float,
    caplog: pytest.LogCaptureFixture,
) -> None:
    base = tmp_path_factory.getbasetemp() / "mid"
    if not (base / "talker-f32.gguf").exists():
        ckpt = mid_checkpoint(base / "ckpt")
        convert_part("talker", ckpt, base / "talker-f32.gguf", "f32")
    ckpt = base / "ckpt"
    caplog.set_level(logging.INFO)
    convert_part("talker", ckpt, base / f"talker-{qtype}.gguf", qtype)
    assert not [r for r in caplog.records if "do not fit" in r.getMessage()]  # all rows fit

    ref, quant = (Generator(str(base / f"talker-{t}.gguf"), threads=2) for t in ("f32", qtype))
    rng = np.random.default_rng(1)
    talker_ref, talker_q, cp_ref, cp_q = [], [], [], []
    for _ in range(8):
        text = list(rng.integers(1000, 100000, size=int(rng.integers(3, 12))))
        ids = np.array([151644, 77091, 198, *text, 151645, 198, 151644, 77091, 198])
        a = testing.trace(ref, ids, "vivian", "english", False, 1)
        b = testing.trace(quant, ids, "vivian", "english", False, 1)
        talker_ref.append(a["talker_logits"][0])
        talker_q.append(b["talker_logits"][0])
        # Head g (predicting code g+1) sees codes 0..g: compare it while those agree, so both
        # runs have the same inputs up to the weights' noise.
        for g in range(15):
            if not np.array_equal(a["codes"][0, : g + 1], b["codes"][0, : g + 1]):
                break
            cp_ref.append(a["cp_logits"][0, g])
            cp_q.append(b["cp_logits"][0, g])
    suppressed = slice(2048, 3072)  # the control tokens are never sampled: compare the codes
    t_ref, t_q = (
        np.array(talker_ref)[:, : suppressed.start],
        np.array(talker_q)[:, : suppressed.start],
    )
    c_ref, c_q = np.array(cp_ref), np.array(cp_q)
    results = {
        "talker_kl": mean_kl(t_ref, t_q),
        "talker_top1": float((t_ref.argmax(-1) == t_q.argmax(-1)).mean()),
        "cp_kl": mean_kl(c_ref, c_q),
        "cp_top1": float((c_ref.argmax(-1) == c_q.argmax(-1)).mean()),
    }
    print(f"\n{qtype} vs f32: {results}")  # reported with pytest -s
    assert len(cp_ref) >= 8
    assert results["talker_kl"] < max_kl and results["cp_kl"] < max_kl, results
    assert results["talker_top1"] >= min_top1 and results["cp_top1"] >= min_top1, results


def test_the_mixed_type_puts_4_bits_on_the_talker_layers_only(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """q4_k_mix: the talker's attention and MLP matrices in q4_k, every other matrix (code
    predictor, embeddings, heads, text projection) in q8_0, norms and biases f32."""
    import gguf

    base = tmp_path_factory.getbasetemp() / "mid"
    path = base / "talker-q4_k_mix.gguf"
    if not path.exists():
        if not (base / "ckpt").exists():
            mid_checkpoint(base / "ckpt")
        convert_part("talker", base / "ckpt", path, "q4_k_mix")
    types: dict[str, set[str]] = {}
    for t in gguf.GGUFReader(path).tensors:
        if t.name.endswith(("norm.weight", ".bias")):
            kind = "norm/bias"
        elif t.name.startswith("tlk.blk."):
            kind = "talker layer"
        else:
            kind = "other matrix"
        types.setdefault(kind, set()).add(t.tensor_type.name)
    assert types == {"talker layer": {"Q4_K"}, "other matrix": {"Q8_0"}, "norm/bias": {"F32"}}


# Run in a fresh process (KAZEIA_KERNELS set or not): argv = out.npz, talker.gguf; a greedy trace
# of 3 frames.
Q8_TRACE = """
import sys
import numpy as np
from wyoming_kazeia import native
from wyoming_kazeia._native import testing
generator = native.Generator(sys.argv[2], threads=2)
ids = np.array([151644, 77091, 198, 5000, 60000, 7000, 151645, 198, 151644, 77091, 198])
trace = testing.trace(generator, ids, "vivian", "english", False, 3)
np.savez(sys.argv[1], codes=trace["codes"], talker_logits=trace["talker_logits"],
         cp_logits=trace["cp_logits"], panels=[trace["talker_panels"], trace["predictor_panels"]],
         joined=[trace["talker_joined"], trace["predictor_joined"]])
"""


def test_the_code_predictor_keeps_its_q8_0_matrices_as_panels_where_they_pay(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    """Where the CPU has a vector path for the q8_0 GEMM, the code predictor's q8_0 layer
    matrices are kept as its panels (here forced on: whether the last-level cache holds them
    depends on the machine; KAZEIA_Q8_PANELS=off keeps rows), the talker's stay rows, and the
    code predictor's logits and codes are the same with our kernels forced to AVX2 as on this
    CPU's own path (each product's bits on every path: tests/test_ops.py)."""
    if testing.Q8_GEMM_ISA not in ("AVX2", "AVX-512 VNNI"):
        pytest.skip(f"this CPU has no AVX2 ({testing.Q8_GEMM_ISA})")
    base = tmp_path_factory.getbasetemp() / "mid"
    talker = base / "talker-q8_0.gguf"
    if not talker.exists():
        convert_part("talker", mid_checkpoint(base / "ckpt"), talker, "q8_0")
    runs = {"cpu": ("", "on"), "avx2": ("avx2", "on"), "rows": ("", "off")}
    got = {
        name: run_fresh(
            Q8_TRACE,
            tmp_path / f"{name}.npz",
            [str(talker)],
            {"KAZEIA_KERNELS": kernels, "KAZEIA_Q8_PANELS": panels},
        )
        for name, (kernels, panels) in runs.items()
    }
    layers = 2  # the mid checkpoint's talker and code predictor: 7 matrices a layer
    assert list(got["cpu"]["panels"]) == list(got["avx2"]["panels"]) == [0, 7 * layers]
    assert list(got["rows"]["panels"]) == [0, 0]
    assert got["cpu"]["cp_logits"].shape == (3, 15, 2048)
    assert np.array_equal(got["cpu"]["cp_logits"], got["avx2"]["cp_logits"])
    assert np.array_equal(got["cpu"]["codes"], got["avx2"]["codes"])


@pytest.mark.parametrize(("qtype", "panels"), [("q8_0", "on"), ("q8_0", "off"), ("f32", "off")])
def test_joined_products_give_the_bits_of_separate_ones(
    qtype: str, panels: str, mid_talkers: dict[str, Path], tmp_path: Path
) -> None:
    """Each layer of both stacks multiplies its q, k, v and its gate, up as one joined matrix
    each (KAZEIA_JOINED=off: separately), and the talker's and code predictor's logits and the
    codes are the same bits either way: q8_0 kept as panels or as rows (a prompt of 11 rows: the
    GEMM, then single-column steps), and f32."""
    got = {
        joined: run_fresh(
            Q8_TRACE,
            tmp_path / f"{joined}.npz",
            [str(mid_talkers[qtype])],
            {"KAZEIA_Q8_PANELS": panels, "KAZEIA_JOINED": "" if joined == "on" else "off"},
        )
        for joined in ("on", "off")
    }
    layers = 2  # the mid checkpoint's, in each stack
    assert list(got["on"]["joined"]) == [2 * layers, 2 * layers]
    assert list(got["off"]["joined"]) == [0, 0]
    for key in ("talker_logits", "cp_logits", "codes"):
        assert got["on"][key].size > 0
        assert np.array_equal(got["on"][key], got["off"][key]), key
