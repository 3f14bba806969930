"""The converter and the native loader agree by construction, and bad checkpoints fail clearly."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from conftest import REFERENCE, ref_codes, snr_db
from safetensors.numpy import load_file, save_file

from wyoming_kazeia.convert import (
    PARTS,
    ConversionError,
    convert,
    convert_part,
    part_metadata,
    part_tensor_specs,
)
from wyoming_kazeia.native import SpeechDecoder, formats

TINY = REFERENCE / "tiny-0.6b" / "model"


def test_gguf_matches_native_tables(decoder_gguf: dict[str, Path]) -> None:
    """Every key and tensor the C++ table names is in the file with its shape, nothing else."""
    part = next(p for p in formats.parts() if p["name"] == "decoder")
    for model, path in decoder_gguf.items():
        reader = gguf.GGUFReader(path)
        assert reader.fields["general.architecture"].contents() == part["arch"]
        assert reader.fields[part["format_version_key"]].contents() == part["format_version"]
        metadata = part_metadata("decoder", REFERENCE / model / "model")
        hparams = {key: value for key, value, _ in metadata}
        loaded = SpeechDecoder(str(path), threads=1).hparams
        assert sorted(loaded) == sorted(hparams)
        for key, value in hparams.items():
            # Written, and read back by the native loader, as the config says (f32 rounding).
            assert np.allclose(reader.fields[key].contents(), value, rtol=1e-7), key
            assert np.allclose(loaded[key], value, rtol=1e-7), key
        specs = part_tensor_specs("decoder", metadata)
        assert [t.name for t in reader.tensors] == [s["name"] for s in specs]
        for t, s in zip(reader.tensors, specs, strict=True):
            assert list(t.shape) == s["ne"], s["name"]


def test_hparams_come_from_config(tmp_path: Path) -> None:
    config_path = tmp_path / "speech_tokenizer" / "config.json"
    config_path.parent.mkdir()
    config = json.loads((TINY / "speech_tokenizer" / "config.json").read_text())

    def hparams() -> dict[str, Any]:
        config_path.write_text(json.dumps(config))
        return {key: value for key, value, _ in part_metadata("decoder", tmp_path)}

    hp = hparams()
    assert hp["kazeia.decoder.sliding_window"] == config["decoder_config"]["sliding_window"]
    assert hp["kazeia.decoder.upsample_rates"] == config["decoder_config"]["upsample_rates"]
    assert hp["kazeia.decoder.hop_length"] == config["decode_upsample_rate"]
    assert hp["kazeia.decoder.num_semantic_quantizers"] == 1  # a constant of the official code
    config["decoder_config"]["sliding_window"] = 33
    assert hparams()["kazeia.decoder.sliding_window"] == 33
    del config["decoder_config"]["num_hidden_layers"]
    with pytest.raises(ConversionError, match="lacks 'decoder_config.num_hidden_layers'"):
        hparams()


def test_parts_are_converted_in_one_loop() -> None:
    """The converter serves every part the native tables name, each in its own file."""
    assert [p["name"] for p in PARTS] == ["decoder", "talker", "speaker_encoder", "speech_encoder"]
    assert [p["model_type"] for p in PARTS] == ["", "", "base", "base"]
    assert len({p["file"] for p in PARTS}) == len({p["arch"] for p in PARTS}) == len(PARTS)
    for part in PARTS:
        for key in part["meta_keys"]:
            assert (key["source"] is None) or ":" in key["source"], key


def test_storage_rule_is_a_column_of_the_table() -> None:
    """f16 only for the decoder's GEMM matrices, quantization only for the talker's matrices
    and tables; every norm, bias and vector stays f32."""
    for part in PARTS:
        metadata = part_metadata(part["name"], TINY)
        for spec in part_tensor_specs(part["name"], metadata):
            if len(spec["ne"]) == 1 or "norm" in spec["name"] or "codebook" in spec["name"]:
                assert spec["storage"] == "f32", spec["name"]
            elif part["name"] == "talker":
                assert spec["storage"] == "quantizable", spec["name"]
    decoder = part_tensor_specs("decoder", part_metadata("decoder", TINY))
    storage = {s["name"]: s["storage"] for s in decoder}
    assert storage["dec.voc.blk.0.res.0.conv1.weight"] == "f16_when_quantized"
    assert storage["dec.up.0.dwconv.weight"] == "f32"  # depthwise: not a GEMM


def test_codebooks_are_stored_ready_to_use(decoder_gguf: dict[str, Path]) -> None:
    st = load_file(str(TINY / "speech_tokenizer" / "model.safetensors"))
    prefix = "decoder.quantizer.rvq_rest.vq.layers.3._codebook."
    expected = (
        st[prefix + "embedding_sum"] / np.maximum(st[prefix + "cluster_usage"], 1e-5)[:, None]
    )
    reader = gguf.GGUFReader(decoder_gguf["tiny-0.6b"])
    stored = next(t for t in reader.tensors if t.name == "dec.rvq.codebook.4")
    assert np.array_equal(np.asarray(stored.data).reshape(expected.shape), expected)


def test_deterministic(tmp_path: Path, decoder_gguf: dict[str, Path]) -> None:
    again = convert_part("decoder", TINY, tmp_path / "decoder.gguf")
    assert again.read_bytes() == decoder_gguf["tiny-0.6b"].read_bytes()


def _copy_checkpoint(tmp_path: Path) -> Path:
    dst = tmp_path / "ckpt"
    shutil.copytree(TINY, dst)
    for p in dst.rglob("*"):
        p.chmod(0o644 if p.is_file() else 0o755)
    return dst


def _edit_tokenizer_weights(ckpt: Path, edit: Callable[[dict[str, np.ndarray]], object]) -> None:
    path = ckpt / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_sharded_bf16_and_f16_checkpoints(tmp_path: Path) -> None:
    """Sharded safetensors with bf16/f16 tensors convert to what the values say."""
    ckpt = _copy_checkpoint(tmp_path)
    st_dir = ckpt / "speech_tokenizer"
    tensors = load_file(str(st_dir / "model.safetensors"))
    names = sorted(tensors)
    half = len(names) // 2
    # bf16 bytes by truncation (exactly representable values after rounding below)
    bf16_name = "decoder.pre_conv.conv.weight"
    w = tensors[bf16_name]
    w_bf16 = (w.view(np.uint32) >> 16).astype(np.uint16)
    tensors[bf16_name] = (w_bf16.astype(np.uint32) << 16).view(np.float32)  # expected values
    f16_name = "decoder.upsample.0.1.pwconv1.weight"
    tensors[f16_name] = tensors[f16_name].astype(np.float16).astype(np.float32)
    expected_dir = tmp_path / "expected"
    shutil.copytree(ckpt, expected_dir)
    save_file(tensors, str(expected_dir / "speech_tokenizer" / "model.safetensors"))

    (st_dir / "model.safetensors").unlink()
    shards = {
        "model-00001-of-00002.safetensors": names[:half],
        "model-00002-of-00002.safetensors": names[half:],
    }
    for fname, part in shards.items():
        save_file({n: tensors[n] for n in part}, str(st_dir / fname))
    # rewrite the two special tensors with their real dtypes via a raw safetensors header
    for fname, part in shards.items():
        if bf16_name in part or f16_name in part:
            _write_raw(st_dir / fname, {n: tensors[n] for n in part}, bf16_name, f16_name)
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (st_dir / "model.safetensors.index.json").write_text(json.dumps(index))

    out = convert_part("decoder", ckpt, tmp_path / "sharded.gguf")
    ref = convert_part("decoder", expected_dir, tmp_path / "expected.gguf")
    assert out.read_bytes() == ref.read_bytes()


def _write_raw(path: Path, tensors: dict[str, np.ndarray], bf16: str, f16: str) -> None:
    header: dict[str, object] = {}
    blobs, offset = [], 0
    for name, arr in tensors.items():
        if name == bf16:
            data, dtype = (arr.view(np.uint32) >> 16).astype("<u2").tobytes(), "BF16"
        elif name == f16:
            data, dtype = arr.astype("<f2").tobytes(), "F16"
        else:
            data, dtype = arr.astype("<f4").tobytes(), "F32"
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        blobs.append(data)
        offset += len(data)
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + b"".join(blobs))


def test_unknown_tensor(tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tmp_path)
    _edit_tokenizer_weights(
        ckpt, lambda t: t.update({"decoder.extra.weight": np.zeros(3, np.float32)})
    )
    with pytest.raises(ConversionError, match="unknown tensor 'decoder.extra.weight'"):
        convert(ckpt, tmp_path / "out")


def test_missing_tensor(tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tmp_path)
    _edit_tokenizer_weights(ckpt, lambda t: t.pop("decoder.decoder.2.block.3.conv1.conv.bias"))
    with pytest.raises(
        ConversionError, match="'decoder.decoder.2.block.3.conv1.conv.bias' is missing"
    ):
        convert(ckpt, tmp_path / "out")
    assert not (tmp_path / "out" / "decoder.gguf").exists()


def test_misshaped_tensor(tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tmp_path)
    name = "decoder.pre_transformer.layers.2.mlp.up_proj.weight"
    _edit_tokenizer_weights(ckpt, lambda t: t.update({name: np.zeros((65, 32), np.float32)}))
    with pytest.raises(ConversionError, match=name):
        convert(ckpt, tmp_path / "out")


def test_truncated_safetensors(tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tmp_path)
    path = ckpt / "speech_tokenizer" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(ConversionError, match="truncated"):
        convert(ckpt, tmp_path / "out")


@pytest.mark.parametrize("out_type", ["f16", "q8_0", "q4_k"])
def test_decoder_gemm_matrices_are_f16_below_f32(tmp_path: Path, out_type: str) -> None:
    """Any type but f32 stores the decoder matrices its GEMM runs as f16, and nothing else."""
    out = convert_part("decoder", TINY, tmp_path / "decoder.gguf", out_type)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    F16, F32 = gguf.GGMLQuantizationType.F16, gguf.GGMLQuantizationType.F32
    assert types["dec.voc.blk.0.res.0.conv1.weight"] == F16
    assert types["dec.rvq_first.out.weight"] == F16
    assert types["dec.voc.blk.0.res.0.conv1.bias"] == F32
    assert types["dec.rvq.codebook.0"] == F32
    # Output width 8 (tiny): not a multiple of the GEMM panel, so ggml runs it: kept f32.
    assert types["dec.voc.blk.2.res.0.conv1.weight"] == F32
    assert sum(t == F16 for t in types.values()) > 20


def test_f16_decoder_streams_exactly_and_stays_close_to_f32(tmp_path: Path) -> None:
    out = convert_part("decoder", TINY, tmp_path / "decoder.gguf", "f16")
    codes = ref_codes("tiny-0.6b", "dec_codes_long")
    f32 = SpeechDecoder(
        str(convert_part("decoder", TINY, tmp_path / "f32.gguf")), threads=1
    ).decode(codes)
    decoder = SpeechDecoder(str(out), threads=2)
    f16 = decoder.decode(codes)
    # f16 weights, f32 math: streaming is as exact as with f32 weights (activations stay f32).
    stream = decoder.stream()
    pushed = np.concatenate([stream.push(codes[i : i + 3]) for i in range(0, len(codes), 3)])
    assert np.abs(pushed - f16).max() < 1e-4
    # Weight rounding only (2^-11 relative). Random tiny weights amplify it more than trained
    # ones (full-size random 0.6b: 46 dB): bound the error energy at 30 dB below the signal.
    snr = snr_db(f32, f16)
    assert 30 < snr < 120, snr


@pytest.mark.parametrize("precision", ["f32", "bf16"])
def test_f16_weights_decode_as_the_f32_values_they_hold(tmp_path: Path, precision: str) -> None:
    """An f16 decoder multiplies exactly the values its file holds, whether it keeps a weight in
    f16 or widens it to f32 (the convs past the first vocoder block's upsampling), or rounds it
    to bf16: the same samples, bit for bit, as an f32 file of the same values, decoded whole or
    streamed."""
    ckpt = _copy_checkpoint(tmp_path)
    _edit_tokenizer_weights(
        ckpt,
        lambda t: t.update(
            {
                n: w.astype(np.float16).astype(np.float32)
                for n, w in t.items()
                if w.dtype == np.float32
            }
        ),
    )
    files = {t: convert_part("decoder", ckpt, tmp_path / f"{t}.gguf", t) for t in ("f16", "f32")}
    decoders = {
        t: SpeechDecoder(str(path), threads=2, precision=precision) for t, path in files.items()
    }
    # Both a weight the loader widens and one it keeps f16 are in the f16 file.
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(files["f16"]).tensors}
    assert types["dec.voc.blk.1.up.weight"] == "F16"
    assert types["dec.voc.blk.0.up.weight"] == "F16"
    codes = ref_codes("tiny-0.6b", "dec_codes_long")
    whole = {t: d.decode(codes) for t, d in decoders.items()}
    assert np.array_equal(whole["f16"], whole["f32"])
    pushed = {}
    for t, d in decoders.items():
        stream = d.stream()
        pushed[t] = np.concatenate([stream.push(codes[i : i + 4]) for i in range(0, len(codes), 4)])
    assert np.array_equal(pushed["f16"], pushed["f32"])


@pytest.mark.parametrize(
    ("model", "kind", "speakers"),
    [
        ("tiny-1.7b", "custom_voice", 9),
        ("tiny-base-0.6b", "base", 0),
        ("tiny-design-1.7b", "voice_design", 0),
    ],
)
def test_every_kind_converts_and_the_talker_knows_its_kind(
    talker_gguf: dict[str, Path], model: str, kind: str, speakers: int
) -> None:
    from wyoming_kazeia.native import Generator

    gen = Generator(str(talker_gguf[model]), threads=1)
    size = "0b6" if "0.6b" in model else "1b7"
    assert gen.hparams["kazeia.talker.model_type"] == kind
    assert gen.hparams["kazeia.talker.model_size"] == size
    assert len(gen.speakers) == speakers
    # The plain languages of every kind; the dialects come with CustomVoice's dialect speakers.
    assert len(gen.languages) == (12 if kind == "custom_voice" else 10)


def test_a_base_checkpoint_converts_with_its_speaker_encoder(tmp_path: Path) -> None:
    written = convert(REFERENCE / "tiny-base-0.6b" / "model", tmp_path / "base")
    assert (tmp_path / "base" / "speaker_encoder.gguf") in written
    assert (tmp_path / "base" / "speech_encoder.gguf") in written
    convert(TINY, tmp_path / "custom")
    assert not (tmp_path / "custom" / "speaker_encoder.gguf").exists()
    assert not (tmp_path / "custom" / "speech_encoder.gguf").exists()
    # The published config.json gives only enc_dim and sample_rate: the rest are the official
    # config class's defaults.
    metadata = dict((k, v) for k, v, _ in part_metadata("speaker_encoder", TINY))
    assert metadata["kazeia.speaker_encoder.channels"] == [512, 512, 512, 512, 1536]
    assert metadata["kazeia.speaker_encoder.enc_dim"] == 1024


def test_a_checkpoint_without_a_kind_is_refused_clearly(tmp_path: Path) -> None:
    ckpt = tmp_path / "nokind"
    shutil.copytree(TINY, ckpt)
    config = json.loads((ckpt / "config.json").read_text())
    del config["tts_model_type"]
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match="lacks 'tts_model_type'"):
        convert(ckpt, tmp_path / "out")
    assert not (tmp_path / "out" / "talker.gguf").exists()


def test_a_hyper_parameter_too_large_for_the_file_is_one_line_of_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A value a GGUF u32 cannot hold is named by the converter, not left to the native format
    table (which could not cast it: a traceback)."""
    from wyoming_kazeia.convert import main

    ckpt = _copy_checkpoint(tmp_path)
    path = ckpt / "speech_tokenizer" / "config.json"
    config = json.loads(path.read_text())
    config["decoder_config"]["codebook_size"] = 1 << 32
    path.write_text(json.dumps(config))
    assert main([str(ckpt), str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        "error: metadata 'kazeia.decoder.codebook_size' has an invalid value 4294967296\n"
    )


def test_cli_main(tmp_path: Path) -> None:
    from wyoming_kazeia.convert import main

    assert main([str(TINY), str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "decoder.gguf").is_file()
    assert main([str(tmp_path / "nowhere"), str(tmp_path / "o2")]) == 1


# --------------------------------------------------------------------------- talker


def test_talker_gguf_matches_native_tables(talker_gguf: dict[str, Path]) -> None:
    from wyoming_kazeia.native import Generator

    part = next(p for p in formats.parts() if p["name"] == "talker")
    for model, path in talker_gguf.items():
        reader = gguf.GGUFReader(path)
        assert reader.fields["general.architecture"].contents() == part["arch"]
        metadata = part_metadata("talker", REFERENCE / model / "model")
        for key, value, kind in metadata:
            stored = reader.fields[key].contents()
            if kind == "f32":
                assert stored == pytest.approx(value, rel=1e-7), key
            else:
                assert stored == value, key
        specs = part_tensor_specs("talker", metadata)
        assert [t.name for t in reader.tensors] == [s["name"] for s in specs]
        for t, s in zip(reader.tensors, specs, strict=True):
            assert list(t.shape) == s["ne"], s["name"]
        # The loader reads back the config's values, tables included.
        config = json.loads((REFERENCE / model / "model" / "config.json").read_text())
        loaded = Generator(str(path), threads=1).hparams
        assert loaded["kazeia.talker.hidden_size"] == config["talker_config"]["hidden_size"]
        assert loaded["kazeia.speakers"] == config["talker_config"]["spk_id"]
        assert loaded["kazeia.languages"] == config["talker_config"]["codec_language_id"]
        dialects = {k: v or "" for k, v in config["talker_config"]["spk_is_dialect"].items()}
        assert loaded["kazeia.speaker_dialects"] == dialects
        assert loaded["kazeia.gen.top_k"] == 50
        assert ("cp.in_proj.weight" in {t.name for t in reader.tensors}) == model.endswith("1.7b")


@pytest.mark.parametrize("out_type", ["q6_k", "q5_k", "q4_k"])
def test_k_quant_rows_that_do_not_fit_fall_back_to_q8_0_then_f16(
    tmp_path: Path, out_type: str
) -> None:
    """The k-quants' blocks are 256 values: tiny rows of 64 go to q8_0, of 16 to f16."""
    out = convert_part("talker", TINY, tmp_path / "talker.gguf", out_type)
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    assert types["tlk.blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.Q8_0  # rows of 64
    assert types["tlk.blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16  # rows of 16


def test_talker_quant_fallback_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rows of 16 values (tiny widths) fit no quant block: f16, said in the log."""
    import logging

    caplog.set_level(logging.INFO)
    out = convert_part("talker", TINY, tmp_path / "talker.gguf", "q8_0")
    types = {t.name: t.tensor_type for t in gguf.GGUFReader(out).tensors}
    assert types["tlk.blk.0.attn_q.weight"] == gguf.GGMLQuantizationType.F16
    assert types["tlk.blk.0.ffn_down.weight"] == gguf.GGMLQuantizationType.Q8_0  # rows of 64
    assert types["tlk.blk.0.attn_norm.weight"] == gguf.GGMLQuantizationType.F32
    assert any("do not fit q8_0, stored as f16" in r.getMessage() for r in caplog.records)


def test_convert_writes_all_parts(tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tmp_path)
    for name in ("vocab.json", "merges.txt"):
        (ckpt / name).write_text("{}" if name.endswith("json") else "#version: 0.2\n")
    written = {p.name for p in convert(ckpt, tmp_path / "out")}
    assert written == {"decoder.gguf", "talker.gguf", "vocab.json", "merges.txt", "config.json"}


def test_talker_unknown_and_missing_tensors(tmp_path: Path) -> None:
    ckpt = _copy_checkpoint(tmp_path)
    path = ckpt / "model.safetensors"
    tensors = load_file(str(path))
    tensors["talker.extra.weight"] = np.zeros(2, np.float32)
    save_file(tensors, str(path))
    with pytest.raises(ConversionError, match="unknown tensor 'talker.extra.weight'"):
        convert(ckpt, tmp_path / "out")
    del tensors["talker.extra.weight"]
    del tensors["talker.code_predictor.lm_head.7.weight"]
    save_file(tensors, str(path))
    with pytest.raises(
        ConversionError, match="'talker.code_predictor.lm_head.7.weight' is missing"
    ):
        convert(ckpt, tmp_path / "out")
