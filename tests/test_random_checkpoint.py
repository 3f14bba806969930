"""Tests of the random-weight checkpoint generator (dev/kazeia_dev/random_checkpoint.py).

Only the tiny sizes are written to disk here; the full sizes are checked through their tensor
specifications (names, shapes, dtypes), which is what the generator streams to disk.
The tiny reference checkpoints (official implementation, see tests/.data/reference/README.md) are
used when they can be found: $KAZEIA_REFERENCE_DIR, tests/.data/reference or ../shared/reference.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kazeia_dev import random_checkpoint as rc

REPO = Path(__file__).resolve().parents[1]

# The real Qwen2 tokenization of the assistant prompt around "Hello world" (the published ids:
# im_start 151644, "assistant" 77091, "\n" 198, im_end 151645; "Hello" 9707, " world" 1879).
PROMPT = "<|im_start|>assistant\nHello world<|im_end|>\n<|im_start|>assistant\n"
PROMPT_IDS = [151644, 77091, 198, 9707, 1879, 151645, 198, 151644, 77091, 198]
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------


def read_header(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header


def read_raw(path: Path, name: str) -> tuple[str, tuple[int, ...], bytes]:
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        entry = header[name]
        begin, end = entry["data_offsets"]
        f.seek(8 + n + begin)
        return entry["dtype"], tuple(entry["shape"]), f.read(end - begin)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def reference_root() -> Path | None:
    env = os.environ.get("KAZEIA_REFERENCE_DIR")
    candidates = [Path(env)] if env else []
    candidates += [REPO / "tests" / ".data" / "reference", REPO.parent / "shared" / "reference"]
    for root in candidates:
        if (root / "tiny-0.6b" / "model" / "config.json").is_file():
            return root
    return None


def specs_by_name(size: str, variant: str = "custom_voice") -> dict[str, rc.TensorSpec]:
    return {s.name: s for specs in rc.tensor_specs(size, variant).values() for s in specs}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str, int], Path]:
    """Tiny checkpoints written once for the whole module, keyed by (size, variant, seed)."""
    root = tmp_path_factory.mktemp("checkpoints")
    out = {}
    for key in (
        ("tiny", "custom_voice", 7),
        ("tiny", "custom_voice", 8),
        ("tiny", "base", 7),
        ("tiny-1.7b", "custom_voice", 7),
    ):
        out[key] = rc.write_checkpoint(root / "-".join(map(str, key)), *key)
    return out


@pytest.fixture(scope="module")
def tiny(checkpoints: dict[tuple[str, str, int], Path]) -> Path:
    return checkpoints[("tiny", "custom_voice", 7)]


def load_f32(path: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(str(path))


# ---------------------------------------------------------------------------------------------
# layout
# ---------------------------------------------------------------------------------------------

EXPECTED_FILES = [
    "config.json",
    "generation_config.json",
    "merges.txt",
    "model.safetensors",
    "speech_tokenizer/config.json",
    "speech_tokenizer/model.safetensors",
    "speech_tokenizer/preprocessor_config.json",
    "tokenizer_config.json",
    "vocab.json",
]


def test_writes_the_hugging_face_layout(tiny: Path) -> None:
    files = sorted(str(p.relative_to(tiny)) for p in tiny.rglob("*") if p.is_file())
    assert files == EXPECTED_FILES


@pytest.mark.parametrize("size", ["tiny", "tiny-1.7b"])
def test_written_headers_match_the_specs(
    checkpoints: dict[tuple[str, str, int], Path], size: str
) -> None:
    ckpt = checkpoints[(size, "custom_voice", 7)]
    for rel, specs in rc.tensor_specs(size).items():
        header = read_header(ckpt / rel)
        assert list(header) == [s.name for s in specs]
        offset = 0
        for spec in specs:
            entry = header[spec.name]
            assert (entry["dtype"], tuple(entry["shape"])) == (spec.dtype, spec.shape)
            assert entry["data_offsets"] == [offset, offset + spec.nbytes]
            offset += spec.nbytes
        assert (ckpt / rel).stat().st_size == len(rc.safetensors_header(specs)) + offset


@pytest.mark.parametrize(("size", "ref"), [("tiny", "tiny-0.6b"), ("tiny-1.7b", "tiny-1.7b")])
def test_tiny_matches_the_official_reference_checkpoint(
    checkpoints: dict[tuple[str, str, int], Path], size: str, ref: str
) -> None:
    root = reference_root()
    if root is None:
        pytest.skip("tiny reference checkpoints not found (set KAZEIA_REFERENCE_DIR)")
    ours = checkpoints[(size, "custom_voice", 7)]
    theirs = root / ref / "model"
    for rel in (rc.MODEL_FILE, rc.SPEECH_TOKENIZER_FILE):
        a, b = read_header(ours / rel), read_header(theirs / rel)
        assert sorted(a) == sorted(b), rel
        for name in b:
            assert (a[name]["dtype"], a[name]["shape"]) == (b[name]["dtype"], b[name]["shape"])
    for rel in (
        "config.json",
        "generation_config.json",
        "speech_tokenizer/config.json",
        "speech_tokenizer/preprocessor_config.json",
    ):
        assert json.loads((ours / rel).read_text()) == json.loads((theirs / rel).read_text()), rel


def test_config_ids_are_the_real_ones(tiny: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    assert config["model_type"] == "qwen3_tts"
    assert config["tts_model_type"] == "custom_voice"
    assert (config["im_start_token_id"], config["im_end_token_id"]) == (151644, 151645)
    assert (config["tts_pad_token_id"], config["tts_bos_token_id"]) == (151671, 151672)
    assert (config["tts_eos_token_id"], config["assistant_token_id"]) == (151673, 77091)
    talker = config["talker_config"]
    codec = {k: v for k, v in talker.items() if k.startswith("codec_") and isinstance(v, int)}
    assert codec == {
        "codec_bos_id": 2149,
        "codec_eos_token_id": 2150,
        "codec_pad_id": 2148,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
    }
    languages = talker["codec_language_id"]
    assert languages["english"] == 2050 and languages["german"] == 2053
    assert languages["beijing_dialect"] == 2074 and languages["sichuan_dialect"] == 2062
    assert len(languages) == 12
    assert talker["spk_id"]["vivian"] == 3065 and talker["spk_id"]["dylan"] == 2878
    assert talker["spk_is_dialect"]["eric"] == "sichuan_dialect"
    assert sum(1 for v in talker["spk_is_dialect"].values() if v) == 2
    assert len(talker["spk_id"]) == 9


def test_config_ids_match_the_reference(tiny: Path) -> None:
    root = reference_root()
    if root is None:
        pytest.skip("tiny reference checkpoints not found (set KAZEIA_REFERENCE_DIR)")
    ours = json.loads((tiny / "config.json").read_text())
    theirs = json.loads((root / "tiny-0.6b" / "model" / "config.json").read_text())
    for key in theirs:
        if key.endswith("_id"):
            assert ours[key] == theirs[key], key
    for key, value in theirs["talker_config"].items():
        if "id" in key or key == "spk_is_dialect":
            assert ours["talker_config"][key] == value, key


# ---------------------------------------------------------------------------------------------
# full sizes (specifications only: nothing is written)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "hidden", "inter"), [("0.6b", 1024, 3072), ("1.7b", 2048, 6144)])
def test_full_size_talker_shapes(size: str, hidden: int, inter: int) -> None:
    config = rc.model_config(size)
    talker = config["talker_config"]
    assert (talker["num_hidden_layers"], talker["hidden_size"]) == (28, hidden)
    assert talker["rope_scaling"]["mrope_section"] == [24, 20, 20]
    assert config["tts_model_size"] == ("0b6" if size == "0.6b" else "1b7")
    specs = rc.tensor_specs(size)[rc.MODEL_FILE]
    shapes = {s.name: s.shape for s in specs}
    assert {s.dtype for s in specs} == {"BF16"}
    assert shapes["talker.model.text_embedding.weight"] == (151936, 2048)
    assert shapes["talker.text_projection.linear_fc1.weight"] == (2048, 2048)
    assert shapes["talker.text_projection.linear_fc1.bias"] == (2048,)
    assert shapes["talker.text_projection.linear_fc2.weight"] == (hidden, 2048)
    assert shapes["talker.text_projection.linear_fc2.bias"] == (hidden,)
    assert shapes["talker.model.codec_embedding.weight"] == (3072, hidden)
    assert shapes["talker.codec_head.weight"] == (3072, hidden)
    for i in range(28):
        p = f"talker.model.layers.{i}"
        assert shapes[f"{p}.self_attn.q_proj.weight"] == (16 * 128, hidden)
        assert shapes[f"{p}.self_attn.k_proj.weight"] == (8 * 128, hidden)
        assert shapes[f"{p}.self_attn.v_proj.weight"] == (8 * 128, hidden)
        assert shapes[f"{p}.self_attn.o_proj.weight"] == (hidden, 16 * 128)
        assert shapes[f"{p}.self_attn.q_norm.weight"] == (128,)
        assert shapes[f"{p}.self_attn.k_norm.weight"] == (128,)
        assert shapes[f"{p}.mlp.gate_proj.weight"] == (inter, hidden)
        assert shapes[f"{p}.mlp.down_proj.weight"] == (hidden, inter)
    assert "talker.model.layers.28.input_layernorm.weight" not in shapes
    assert not any("bias" in n for n in shapes if ".layers." in n)


@pytest.mark.parametrize(("size", "hidden"), [("0.6b", 1024), ("1.7b", 2048)])
def test_full_size_code_predictor_shapes(size: str, hidden: int) -> None:
    shapes = {s.name: s.shape for s in rc.tensor_specs(size)[rc.MODEL_FILE]}
    c = "talker.code_predictor"
    for g in range(15):
        assert shapes[f"{c}.model.codec_embedding.{g}.weight"] == (2048, hidden)
        assert shapes[f"{c}.lm_head.{g}.weight"] == (2048, 1024)
    assert f"{c}.lm_head.15.weight" not in shapes
    for i in range(5):
        assert shapes[f"{c}.model.layers.{i}.self_attn.q_proj.weight"] == (2048, 1024)
        assert shapes[f"{c}.model.layers.{i}.self_attn.k_proj.weight"] == (1024, 1024)
        assert shapes[f"{c}.model.layers.{i}.mlp.up_proj.weight"] == (3072, 1024)
    assert f"{c}.model.layers.5.input_layernorm.weight" not in shapes
    # identity for 0.6B (talker hidden == code-predictor hidden), Linear(2048, 1024) for 1.7B
    if size == "0.6b":
        assert not any("small_to_mtp_projection" in n for n in shapes)
    else:
        assert shapes[f"{c}.small_to_mtp_projection.weight"] == (1024, 2048)
        assert shapes[f"{c}.small_to_mtp_projection.bias"] == (1024,)


@pytest.mark.parametrize("size", ["0.6b", "1.7b"])
def test_full_size_speech_decoder(size: str) -> None:
    specs = rc.tensor_specs(size)[rc.SPEECH_TOKENIZER_FILE]
    shapes = {s.name: s.shape for s in specs}
    assert {s.dtype for s in specs} == {"F32"}
    decoder_params = sum(s.numel for s in specs if s.name.startswith("decoder."))
    assert 113e6 < decoder_params < 115.5e6  # "about 114M parameters" (docs/model.md)
    q = "decoder.quantizer"
    assert shapes[f"{q}.rvq_first.vq.layers.0._codebook.embedding_sum"] == (2048, 256)
    assert shapes[f"{q}.rvq_first.output_proj.weight"] == (512, 256, 1)
    for i in range(15):
        assert shapes[f"{q}.rvq_rest.vq.layers.{i}._codebook.cluster_usage"] == (2048,)
    assert f"{q}.rvq_rest.vq.layers.15._codebook.cluster_usage" not in shapes
    assert shapes["decoder.pre_conv.conv.weight"] == (1024, 512, 3)
    t = "decoder.pre_transformer"
    assert shapes[f"{t}.input_proj.weight"] == (512, 1024)
    assert shapes[f"{t}.output_proj.weight"] == (1024, 512)
    assert shapes[f"{t}.layers.7.self_attn.q_proj.weight"] == (16 * 64, 512)
    assert shapes[f"{t}.layers.7.mlp.gate_proj.weight"] == (1024, 512)
    assert shapes[f"{t}.layers.7.mlp_layer_scale.scale"] == (512,)
    assert f"{t}.layers.8.input_layernorm.weight" not in shapes
    for i in range(2):
        assert shapes[f"decoder.upsample.{i}.0.conv.weight"] == (1024, 1024, 2)
        assert shapes[f"decoder.upsample.{i}.1.pwconv1.weight"] == (4096, 1024)
    assert shapes["decoder.decoder.0.conv.weight"] == (1536, 1024, 7)
    channels = [1536, 768, 384, 192, 96]
    for b, rate in enumerate([8, 5, 4, 3]):
        block = f"decoder.decoder.{b + 1}.block"
        assert shapes[f"{block}.1.conv.weight"] == (channels[b], channels[b + 1], 2 * rate)
        assert shapes[f"{block}.4.conv1.conv.weight"] == (channels[b + 1],) * 2 + (7,)
    assert shapes["decoder.decoder.5.alpha"] == (96,)
    assert shapes["decoder.decoder.6.conv.weight"] == (1, 96, 7)
    # the Mimi encoder half is present with its real sizes (32 quantizers of 2048 x 256)
    e = "encoder.quantizer"
    assert shapes[f"{e}.semantic_residual_vector_quantizer.layers.0.codebook.embed_sum"] == (
        2048,
        256,
    )
    assert f"{e}.acoustic_residual_vector_quantizer.layers.30.codebook.embed_sum" in shapes
    assert f"{e}.acoustic_residual_vector_quantizer.layers.31.codebook.embed_sum" not in shapes
    assert shapes["encoder.encoder.layers.0.conv.weight"] == (64, 1, 7)
    assert shapes["encoder.encoder.layers.14.conv.weight"] == (512, 1024, 3)
    assert shapes["encoder.encoder_transformer.layers.7.mlp.fc1.weight"] == (2048, 512)
    assert shapes["encoder.downsample.conv.weight"] == (512, 512, 4)


def test_full_sizes_share_one_speech_tokenizer() -> None:
    a = rc.tensor_specs("0.6b")[rc.SPEECH_TOKENIZER_FILE]
    b = rc.tensor_specs("1.7b")[rc.SPEECH_TOKENIZER_FILE]
    assert a == b
    assert rc.speech_tokenizer_config("0.6b") == rc.speech_tokenizer_config("1.7b")


@pytest.mark.parametrize(("size", "hidden"), [("0.6b", 1024), ("1.7b", 2048)])
def test_base_variant_adds_the_speaker_encoder(size: str, hidden: int) -> None:
    custom = specs_by_name(size, "custom_voice")
    base = specs_by_name(size, "base")
    assert not any(n.startswith("speaker_encoder.") for n in custom)
    extra = sorted(set(base) - set(custom))
    assert extra and all(n.startswith("speaker_encoder.") for n in extra)
    assert set(custom) <= set(base)
    assert base["speaker_encoder.fc.weight"].shape == (hidden, 3072, 1)
    assert base["speaker_encoder.blocks.0.conv.weight"].shape == (512, 128, 5)
    assert base["speaker_encoder.blocks.3.res2net_block.blocks.6.conv.weight"].shape == (64, 64, 3)
    assert base["speaker_encoder.mfa.conv.weight"].shape == (1536, 1536, 1)
    config = rc.model_config(size, "base")
    assert config["tts_model_type"] == "base"
    assert config["talker_config"]["spk_id"] == {}
    assert config["speaker_encoder_config"]["enc_dim"] == hidden
    # Only CustomVoice has dialect speakers, and with them the dialect languages.
    assert not any(n.endswith("_dialect") for n in config["talker_config"]["codec_language_id"])


def test_voice_design_variant_has_no_speakers_and_no_speaker_encoder() -> None:
    custom = specs_by_name("1.7b", "custom_voice")
    design = specs_by_name("1.7b", "voice_design")
    assert set(design) == set(custom)
    config = rc.model_config("1.7b", "voice_design")
    assert config["tts_model_type"] == "voice_design"
    assert "speaker_encoder_config" not in config
    assert config["talker_config"]["spk_id"] == {} == config["talker_config"]["spk_is_dialect"]
    assert len(config["talker_config"]["codec_language_id"]) == 10


def test_full_size_checkpoint_sizes() -> None:
    gb = {
        size: sum(s.nbytes for specs in rc.tensor_specs(size).values() for s in specs) / 1e9
        for size in ("0.6b", "1.7b")
    }
    assert 2.3 < gb["0.6b"] < 2.7  # 0.9B bf16 parameters + 171M f32 speech tokenizer
    assert 4.3 < gb["1.7b"] < 4.7


def test_unknown_size_or_variant_is_refused() -> None:
    with pytest.raises(ValueError):
        rc.tensor_specs("7b")
    with pytest.raises(ValueError):
        rc.model_config("tiny", "voice_clone")


# ---------------------------------------------------------------------------------------------
# values
# ---------------------------------------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_bytes(
    checkpoints: dict[tuple[str, str, int], Path], tmp_path: Path
) -> None:
    again = rc.write_checkpoint(tmp_path / "again", "tiny", "custom_voice", 7)
    first = checkpoints[("tiny", "custom_voice", 7)]
    other = checkpoints[("tiny", "custom_voice", 8)]
    for rel in EXPECTED_FILES:
        assert sha256(first / rel) == sha256(again / rel), rel
    for rel in (rc.MODEL_FILE, rc.SPEECH_TOKENIZER_FILE):
        assert sha256(first / rel) != sha256(other / rel), rel


def test_each_tensor_depends_only_on_seed_and_name(
    checkpoints: dict[tuple[str, str, int], Path],
) -> None:
    custom = checkpoints[("tiny", "custom_voice", 7)] / rc.MODEL_FILE
    base = checkpoints[("tiny", "base", 7)] / rc.MODEL_FILE
    other_seed = checkpoints[("tiny", "custom_voice", 8)] / rc.MODEL_FILE
    name = "talker.model.layers.1.mlp.up_proj.weight"
    assert read_raw(custom, name) == read_raw(base, name)
    assert read_raw(custom, name) != read_raw(other_seed, name)


def test_values_have_meaningful_scales(tiny: Path) -> None:
    model = load_f32(tiny / rc.MODEL_FILE)
    speech = load_f32(tiny / rc.SPEECH_TOKENIZER_FILE)
    for name, value in {**model, **speech}.items():
        assert value.dtype == np.float32 and np.isfinite(value).all(), name
        if value.size > 1:
            assert value.std() > 0, f"{name} is constant"
    norms = [v for n, v in model.items() if "norm.weight" in n]
    assert all(0.9 < v.mean() < 1.1 and not np.allclose(v, 1.0) for v in norms)
    q = model["talker.model.layers.0.self_attn.q_proj.weight"]
    assert q.std() == pytest.approx(1 / math.sqrt(q.shape[1]), rel=0.3)
    for name, value in speech.items():
        if name.endswith("cluster_usage"):
            assert value.min() >= 0.5 and value.max() <= 2.0 and value.std() > 0.1, name
        if name.endswith(".alpha") or name.endswith(".beta"):
            assert 0.02 < value.std() < 0.5 and np.abs(value).max() > 0, name
        if name.endswith("layer_scale.scale"):
            assert value.min() >= 0.01 and value.max() <= 0.1, name
    cb = "decoder.quantizer.rvq_first.vq.layers.0._codebook"
    embedding = speech[f"{cb}.embedding_sum"] / speech[f"{cb}.cluster_usage"][:, None]
    assert embedding.std() == pytest.approx(1.0, rel=0.1)
    assert 0.05 < speech["decoder.upsample.0.1.gamma"].mean() < 0.15


def test_bf16_rounding() -> None:
    x = np.array([1.0, -2.5, 3.14159265, 1e-3, 65504.0, 1 + 2**-8, 1 + 3 * 2**-8], np.float32)
    bits = rc.float32_to_bf16_bits(x)
    assert bits.dtype == np.uint16
    assert bits[0] == 0x3F80 and bits[1] == 0xC020
    back = rc.bf16_bits_to_float32(bits)
    assert np.all(np.abs(back - x) <= np.abs(x) * 2**-8)
    # ties go to even: 1 + 2^-8 -> 1.0, 1 + 3 * 2^-8 -> 1 + 2^-6
    assert back[5] == 1.0 and back[6] == np.float32(1 + 2**-6)


def test_bf16_file_holds_the_rounded_values(tmp_path: Path) -> None:
    specs = [
        spec
        for spec in rc.model_tensor_specs(rc.model_config("tiny-1.7b"), "BF16")
        if spec.name.startswith("talker.code_predictor.small_to_mtp")
        or spec.name == "talker.model.norm.weight"
    ]
    path = tmp_path / "bf16.safetensors"
    rc.write_safetensors(path, specs, seed=3)
    for spec in specs:
        dtype, shape, raw = read_raw(path, spec.name)
        assert (dtype, shape) == ("BF16", spec.shape)
        got = rc.bf16_bits_to_float32(np.frombuffer(raw, "<u2")).reshape(shape)
        want = rc.tensor_values(spec, seed=3)
        np.testing.assert_allclose(got, want, rtol=2**-8, atol=0)


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------


def load_tokenizer(ckpt: Path) -> Any:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

    tok = tokenizers.Tokenizer(
        models.BPE.from_file(str(ckpt / "vocab.json"), str(ckpt / "merges.txt"))
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    config = json.loads((ckpt / "tokenizer_config.json").read_text())
    added = sorted((int(i), v) for i, v in config["added_tokens_decoder"].items())
    tok.add_special_tokens(
        [AddedToken(v["content"], special=v["special"], normalized=False) for _, v in added]
    )
    return tok


def test_tokenizer_gives_the_real_prompt_ids(tiny: Path) -> None:
    tok = load_tokenizer(tiny)
    assert tok.encode(PROMPT).ids == PROMPT_IDS
    assert tok.decode(PROMPT_IDS, skip_special_tokens=False) == PROMPT


@pytest.mark.parametrize(
    ("text", "ids"),
    [  # real Qwen2 tokenizations
        ("<|im_start|>system\n", [151644, 8948, 198]),
        ("<|im_start|>user\n", [151644, 872, 198]),
        ("Hello\nworld", [9707, 198, 14615]),
        ("Hello, world!", [9707, 11, 1879, 0]),
    ],
)
def test_tokenizer_known_real_tokenizations(tiny: Path, text: str, ids: list[int]) -> None:
    assert load_tokenizer(tiny).encode(text).ids == ids


def test_special_tokens_sit_at_the_config_ids(tiny: Path) -> None:
    tok = load_tokenizer(tiny)
    config = json.loads((tiny / "config.json").read_text())
    for key, token in (
        ("im_start_token_id", "<|im_start|>"),
        ("im_end_token_id", "<|im_end|>"),
        ("tts_pad_token_id", "<tts_pad>"),
        ("tts_bos_token_id", "<tts_text_bos>"),
        ("tts_eos_token_id", "<tts_text_eod>"),
    ):
        assert tok.token_to_id(token) == config[key], token
        assert tok.encode(token).ids == [config[key]]
    assert tok.token_to_id("<|endoftext|>") == 151643
    assert tok.get_vocab_size() == 151643 + len(rc.ADDED_TOKENS)
    assert tok.get_vocab_size() <= config["talker_config"]["text_vocab_size"]


def test_tokenizer_round_trips_any_text(tiny: Path) -> None:
    tok = load_tokenizer(tiny)
    text = "Guten Tag! Zürich, 21 °C — naïve café 你好 🙂\n\nThe lights are ON.  Done?"
    ids = tok.encode(text).ids
    assert tok.decode(ids) == text
    assert max(ids) < 151643
    assert tok.encode("\n").ids == [198] and tok.encode(" ").ids == [220]


def test_vocab_is_dense_and_merges_are_valid(tiny: Path) -> None:
    vocab = json.loads((tiny / "vocab.json").read_text(encoding="utf-8"))
    assert sorted(vocab.values()) == list(range(151643))
    lines = (tiny / "merges.txt").read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("#version")
    merges = [tuple(line.split(" ")) for line in lines[1:]]
    assert 200 <= len(merges) <= 1000
    assert all(len(m) == 2 and m[0] + m[1] in vocab for m in merges)
    assert vocab["assistant"] == 77091 and vocab["\u010a"] == 198


def test_transformers_qwen2_tokenizer_if_available(tiny: Path) -> None:
    transformers = pytest.importorskip("transformers")
    tok = transformers.Qwen2TokenizerFast.from_pretrained(str(tiny))
    assert tok(PROMPT)["input_ids"] == PROMPT_IDS
    assert tok.convert_tokens_to_ids(["<tts_pad>", "<tts_text_bos>", "<tts_text_eod>"]) == [
        151671,
        151672,
        151673,
    ]
    assert tok.eos_token_id == 151645 and tok.pad_token_id == 151643


# ---------------------------------------------------------------------------------------------
# the speech decoder makes audible, unclipped noise from random codes
# ---------------------------------------------------------------------------------------------


def _causal_conv(
    x: np.ndarray, w: np.ndarray, b: np.ndarray, dilation: int = 1, depthwise: bool = False
) -> np.ndarray:
    k = w.shape[2]
    xp = np.pad(x, ((0, 0), ((k - 1) * dilation, 0)))
    t = x.shape[1]
    y = np.zeros((w.shape[0], t))
    for j in range(k):
        tap = xp[:, j * dilation : j * dilation + t]
        y += w[:, 0, j, None] * tap if depthwise else w[:, :, j] @ tap
    return y + b[:, None]


def _trans_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, stride: int) -> np.ndarray:
    k, t = w.shape[2], x.shape[1]
    y = np.zeros((w.shape[1], (t - 1) * stride + k))
    for j in range(k):
        y[:, j : j + (t - 1) * stride + 1 : stride] += w[:, :, j].T @ x
    return (y + b[:, None])[:, : t * stride]


def _snake(x: np.ndarray, alpha: np.ndarray, beta: np.ndarray) -> np.ndarray:
    return x + np.sin(x * np.exp(alpha)[:, None]) ** 2 / (np.exp(beta)[:, None] + 1e-9)


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return w * x / np.sqrt((x**2).mean(-1, keepdims=True) + eps)


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    d = x.shape[-1]
    freqs = np.arange(x.shape[1])[:, None] / theta ** (np.arange(0, d, 2) / d)
    emb = np.concatenate([freqs, freqs], -1)
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * np.cos(emb) + rotated * np.sin(emb)


def decode_numpy(w: dict[str, np.ndarray], dc: dict[str, Any], codes: np.ndarray) -> np.ndarray:
    """Single-forward float64 decode of codes [16, T] (Qwen3TTSTokenizerV2Decoder.forward)."""
    q = "decoder.quantizer"

    def codebook(prefix: str) -> np.ndarray:
        usage = np.maximum(w[f"{prefix}._codebook.cluster_usage"], 1e-5)
        return w[f"{prefix}._codebook.embedding_sum"] / usage[:, None]

    first = codebook(f"{q}.rvq_first.vq.layers.0")[codes[0]].T
    rest = sum(codebook(f"{q}.rvq_rest.vq.layers.{i}")[c].T for i, c in enumerate(codes[1:]))
    h = w[f"{q}.rvq_first.output_proj.weight"][:, :, 0] @ first
    h = h + w[f"{q}.rvq_rest.output_proj.weight"][:, :, 0] @ rest
    h = _causal_conv(h, w["decoder.pre_conv.conv.weight"], w["decoder.pre_conv.conv.bias"])

    p = "decoder.pre_transformer"
    x = h.T @ w[f"{p}.input_proj.weight"].T + w[f"{p}.input_proj.bias"]
    t, heads, hd, eps = x.shape[0], dc["num_attention_heads"], dc["head_dim"], dc["rms_norm_eps"]
    i, j = np.arange(t)[:, None], np.arange(t)[None]
    mask = (j <= i) & (i - j < dc["sliding_window"])
    for n in range(dc["num_hidden_layers"]):
        layer = f"{p}.layers.{n}"
        y = _rms_norm(x, w[f"{layer}.input_layernorm.weight"], eps)
        qh, kh, vh = (
            (y @ w[f"{layer}.self_attn.{m}_proj.weight"].T).reshape(t, -1, hd).transpose(1, 0, 2)
            for m in "qkv"
        )
        kh, vh = (np.repeat(a, heads // a.shape[0], axis=0) for a in (kh, vh))
        qh, kh = _rope(qh, dc["rope_theta"]), _rope(kh, dc["rope_theta"])
        s = np.where(mask, qh @ kh.transpose(0, 2, 1) / math.sqrt(hd), -np.inf)
        s = np.exp(s - s.max(-1, keepdims=True))
        a = ((s / s.sum(-1, keepdims=True)) @ vh).transpose(1, 0, 2).reshape(t, heads * hd)
        x = x + w[f"{layer}.self_attn_layer_scale.scale"] * (
            a @ w[f"{layer}.self_attn.o_proj.weight"].T
        )
        y = _rms_norm(x, w[f"{layer}.post_attention_layernorm.weight"], eps)
        g, u = y @ w[f"{layer}.mlp.gate_proj.weight"].T, y @ w[f"{layer}.mlp.up_proj.weight"].T
        m = (g / (1 + np.exp(-g)) * u) @ w[f"{layer}.mlp.down_proj.weight"].T
        x = x + w[f"{layer}.mlp_layer_scale.scale"] * m
    x = _rms_norm(x, w[f"{p}.norm.weight"], eps)
    h = (x @ w[f"{p}.output_proj.weight"].T + w[f"{p}.output_proj.bias"]).T

    erf = np.vectorize(math.erf)
    for n, ratio in enumerate(dc["upsampling_ratios"]):
        u = f"decoder.upsample.{n}"
        h = _trans_conv(h, w[f"{u}.0.conv.weight"], w[f"{u}.0.conv.bias"], ratio)
        y = _causal_conv(h, w[f"{u}.1.dwconv.conv.weight"], w[f"{u}.1.dwconv.conv.bias"], 1, True).T
        y = (y - y.mean(-1, keepdims=True)) / np.sqrt(y.var(-1, keepdims=True) + 1e-6)
        y = y * w[f"{u}.1.norm.weight"] + w[f"{u}.1.norm.bias"]
        y = y @ w[f"{u}.1.pwconv1.weight"].T + w[f"{u}.1.pwconv1.bias"]
        y = 0.5 * y * (1 + erf(y / math.sqrt(2)))
        y = y @ w[f"{u}.1.pwconv2.weight"].T + w[f"{u}.1.pwconv2.bias"]
        h = h + (w[f"{u}.1.gamma"] * y).T

    d = "decoder.decoder"
    h = _causal_conv(h, w[f"{d}.0.conv.weight"], w[f"{d}.0.conv.bias"])
    n_blocks = len(dc["upsample_rates"])
    for n, rate in enumerate(dc["upsample_rates"]):
        block = f"{d}.{n + 1}.block"
        h = _snake(h, w[f"{block}.0.alpha"], w[f"{block}.0.beta"])
        h = _trans_conv(h, w[f"{block}.1.conv.weight"], w[f"{block}.1.conv.bias"], rate)
        for unit, dilation in ((2, 1), (3, 3), (4, 9)):
            r = f"{block}.{unit}"
            y = _snake(h, w[f"{r}.act1.alpha"], w[f"{r}.act1.beta"])
            y = _causal_conv(y, w[f"{r}.conv1.conv.weight"], w[f"{r}.conv1.conv.bias"], dilation)
            y = _snake(y, w[f"{r}.act2.alpha"], w[f"{r}.act2.beta"])
            h = h + _causal_conv(y, w[f"{r}.conv2.conv.weight"], w[f"{r}.conv2.conv.bias"])
    h = _snake(h, w[f"{d}.{n_blocks + 1}.alpha"], w[f"{d}.{n_blocks + 1}.beta"])
    h = _causal_conv(h, w[f"{d}.{n_blocks + 2}.conv.weight"], w[f"{d}.{n_blocks + 2}.conv.bias"])
    return np.clip(h[0], -1.0, 1.0)


def _decoder_weights(path: Path) -> dict[str, np.ndarray]:
    return {k: v.astype(np.float64) for k, v in load_f32(path).items() if k.startswith("decoder.")}


def test_numpy_decoder_matches_the_official_reference() -> None:
    root = reference_root()
    if root is None:
        pytest.skip("tiny reference checkpoints not found (set KAZEIA_REFERENCE_DIR)")
    model = root / "tiny-0.6b" / "model" / "speech_tokenizer"
    dc = json.loads((model / "config.json").read_text())["decoder_config"]
    codes = np.load(root / "tiny-0.6b" / "ref" / "dec_codes.npy")[:, :20]
    want = np.load(root / "tiny-0.6b" / "ref" / "dec_wav_full.npy")[: 20 * 1920]
    got = decode_numpy(_decoder_weights(model / "model.safetensors"), dc, codes)
    assert np.abs(got - want).max() < 1e-4


@pytest.mark.parametrize("key", [("tiny", "custom_voice", 7), ("tiny-1.7b", "custom_voice", 7)])
def test_random_codes_decode_to_plausible_audio(
    checkpoints: dict[tuple[str, str, int], Path], key: tuple[str, str, int]
) -> None:
    ckpt = checkpoints[key]
    dc = json.loads((ckpt / "speech_tokenizer" / "config.json").read_text())["decoder_config"]
    codes = np.random.default_rng(5).integers(0, 2048, (16, 16))
    wav = decode_numpy(_decoder_weights(ckpt / rc.SPEECH_TOKENIZER_FILE), dc, codes)
    assert wav.shape == (16 * 1920,)
    rms = float(np.sqrt(np.mean(wav**2)))
    assert 0.03 < rms < 0.5, rms
    assert np.mean(np.abs(wav) >= 1.0) < 0.01  # not permanently clipped
    assert np.abs(np.diff(wav)).mean() > 1e-3  # not a constant


# ---------------------------------------------------------------------------------------------
# command line
# ---------------------------------------------------------------------------------------------


def test_cli_writes_a_checkpoint(tmp_path: Path) -> None:
    """script/random-checkpoint is the stable command (kazeia_dev lives outside the package)."""
    out = tmp_path / "cli"
    result = subprocess.run(
        [
            str(REPO / "script" / "random-checkpoint"),
            str(out),
            "--size",
            "tiny-1.7b",
            "--variant",
            "base",
            "--seed",
            "11",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "ready" in result.stderr and result.stdout == ""
    config = json.loads((out / "config.json").read_text())
    assert (config["tts_model_type"], config["tts_model_size"]) == ("base", "1b7")
    header = read_header(out / rc.MODEL_FILE)
    assert "speaker_encoder.fc.weight" in header
    assert header["speaker_encoder.fc.weight"]["shape"] == [32, 192, 1]
    assert "talker.code_predictor.small_to_mtp_projection.weight" in header


def test_cli_rejects_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        rc.main([str(tmp_path), "--size", "3b"])
    with pytest.raises(SystemExit):
        rc.main([str(tmp_path), "--size", "tiny", "--seed", "-1"])
