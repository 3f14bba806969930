"""Convert a Hugging Face Qwen3-TTS 12 Hz checkpoint into the GGUF files of the native engine.

    python -m wyoming_kazeia.convert CHECKPOINT_DIR OUT_DIR [--type f32|f16|q8_0|q4_k]

writes OUT_DIR/decoder.gguf (the speech decoder), OUT_DIR/talker.gguf (talker, text path and
code predictor) and copies the tokenizer files. Every hyper-parameter comes from the
checkpoint's config.json through the metadata key table of the native loader, and every
tensor through its tensor table (`wyoming_kazeia._native.decoder_arch` and
`decoder_tensor_specs`), so the files always match what the loader expects.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from . import _native

_LOGGER = logging.getLogger(__name__)

OUT_TYPES = ("f32", "f16", "q8_0", "q4_k")
# Below this many bytes of output a conversion does not log per-tensor progress.
_PROGRESS_MIN_BYTES = 64 << 20


class ConversionError(Exception):
    """The checkpoint cannot be converted; the message says which file or tensor and why."""


# --------------------------------------------------------------------------- safetensors


@dataclass(frozen=True)
class _TensorEntry:
    path: Path
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


_ST_DTYPES: dict[str, Any] = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}


class SafetensorsCheckpoint:
    """Lazy reader of one safetensors file or a sharded set (`*.safetensors.index.json`).

    Reads raw bytes through a memory map, so bf16 (which numpy lacks) is supported and
    memory stays bounded by the tensor being converted.
    """

    def __init__(self, directory: Path, stem: str = "model") -> None:
        single = directory / f"{stem}.safetensors"
        index = directory / f"{stem}.safetensors.index.json"
        if single.is_file():
            files = [single]
        elif index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted({directory / f for f in weight_map.values()})
        else:
            raise ConversionError(f"no {single.name} or {index.name} in {directory}")
        self.entries: dict[str, _TensorEntry] = {}
        for f in files:
            self._read_header(f)

    def _read_header(self, path: Path) -> None:
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                n = int.from_bytes(fh.read(8), "little")
                if n <= 0 or 8 + n > size:
                    raise ConversionError(f"{path} is not a safetensors file (bad header size)")
                header = json.loads(fh.read(n))
        except (OSError, ValueError) as err:
            raise ConversionError(f"cannot read {path}: {err}") from err
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            begin, end = info["data_offsets"]
            if info["dtype"] not in _ST_DTYPES:
                raise ConversionError(f"{path}: tensor '{name}' has unsupported {info['dtype']}")
            if base + end > size:
                raise ConversionError(f"{path} is truncated: tensor '{name}' is cut off")
            self.entries[name] = _TensorEntry(
                path, info["dtype"], tuple(info["shape"]), base + begin, base + end
            )

    def names(self) -> list[str]:
        return sorted(self.entries)

    def get(self, name: str) -> np.ndarray:
        """The tensor as float32."""
        e = self.entries.get(name)
        if e is None:
            raise ConversionError(f"checkpoint tensor '{name}' is missing")
        count = int(np.prod(e.shape)) if e.shape else 1
        raw = np.memmap(e.path, dtype=_ST_DTYPES[e.dtype], mode="r", offset=e.begin, shape=(count,))
        if e.dtype == "BF16":
            data = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            data = raw.astype(np.float32)
        return data.reshape(e.shape)


# --------------------------------------------------------------------------- transforms


def _trans_conv(w: np.ndarray, stride: int) -> np.ndarray:
    """torch ConvTranspose1d [in, out, m*r] -> [r*out, m*in]: tap i of m reads x[t-(m-1)+i]."""
    c_in, c_out, k = w.shape
    if k % stride:
        raise ConversionError(f"transposed conv kernel {k} is not a multiple of stride {stride}")
    m = k // stride
    by_tap = w.transpose(2, 1, 0)  # [k, out, in]
    res = np.empty((stride, c_out, m, c_in), dtype=np.float32)
    for i in range(m):
        q = m - 1 - i
        res[:, :, i, :] = by_tap[q * stride : (q + 1) * stride]
    return res.reshape(stride * c_out, m * c_in)


_TRANSFORMS: dict[str, Callable[[list[np.ndarray], int], np.ndarray]] = {
    "copy": lambda a, _s: a[0],
    "linear": lambda a, _s: a[0],
    "conv": lambda a, _s: a[0].transpose(0, 2, 1).reshape(a[0].shape[0], -1),
    "trans_conv": lambda a, s: _trans_conv(a[0], s),
    "depthwise": lambda a, _s: a[0][:, 0, :].T,
    "codebook": lambda a, _s: a[0] / np.maximum(a[1], np.float32(1e-5))[:, None],
    "exp": lambda a, _s: np.exp(a[0]),
    "inv_exp": lambda a, _s: np.float32(1.0) / (np.exp(a[0]) + np.float32(1e-9)),
}


def _apply(spec: dict[str, Any], ckpt: SafetensorsCheckpoint) -> np.ndarray:
    name = spec["name"]
    try:
        data = _TRANSFORMS[spec["transform"]](
            [ckpt.get(s) for s in spec["sources"]], spec["stride"]
        )
    except ValueError as err:  # reshapes/broadcasts of mis-shaped checkpoint tensors
        raise ConversionError(
            f"tensor '{spec['sources'][0]}' has an unexpected shape: {err}"
        ) from err
    data = np.ascontiguousarray(data, dtype=np.float32)
    expected = tuple(reversed(spec["ne"]))
    if data.shape != expected:
        shapes = ", ".join(f"'{s}' {ckpt.entries[s].shape}" for s in spec["sources"])
        raise ConversionError(
            f"tensor {shapes} does not fit '{name}': got {data.shape}, expected {expected} "
            "from config.json"
        )
    return data


# --------------------------------------------------------------------------- metadata


def _config_value(config: dict[str, Any], path: str, source: Path) -> Any:
    value: Any = config
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ConversionError(f"{source} lacks '{path}'")
        value = value[part]
    return value


def _typed(value: Any, kind: str, key: str) -> Any:
    try:
        if kind == "u32":
            if int(value) != value or value < 0:
                raise ValueError(value)
            return int(value)
        if kind == "f32":
            return float(value)
        return [int(v) for v in value]
    except (TypeError, ValueError) as err:
        raise ConversionError(f"metadata '{key}' has an invalid value {value!r}") from err


def decoder_hparams(config: dict[str, Any], source: Path) -> dict[str, Any]:
    """The decoder GGUF metadata, read from speech_tokenizer/config.json via the key table."""
    out: dict[str, Any] = {}
    for k in _native.decoder_arch()["meta_keys"]:
        raw = (
            k["constant"]
            if k["config_path"] is None
            else _config_value(config, k["config_path"], source)
        )
        out[k["key"]] = _typed(raw, k["type"], k["key"])
    return out


# --------------------------------------------------------------------------- GGUF writing


@dataclass(frozen=True)
class _OutTensor:
    """A tensor as written: name, numpy-order shape, storage type (f32, f16, q8_0, q4_k)."""

    name: str
    shape: tuple[int, ...]
    qtype: str

    def nbytes(self) -> int:
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        row = self.shape[-1]
        return rows * _row_bytes(self.qtype, row)


_QTYPES = {
    "f32": gguf.GGMLQuantizationType.F32,
    "f16": gguf.GGMLQuantizationType.F16,
    "q8_0": gguf.GGMLQuantizationType.Q8_0,
    "q4_k": gguf.GGMLQuantizationType.Q4_K,
}


def _row_bytes(qtype: str, n: int) -> int:
    block, size = gguf.GGML_QUANT_SIZES[_QTYPES[qtype]]
    return n // block * size


def fitting_type(wanted: str, row: int) -> str:
    """The storage type for a matrix of rows of `row` values: `wanted` when its block size
    divides the row, else the next type that fits (q4_k -> q8_0 -> f16)."""
    chain = {"q4_k": ["q4_k", "q8_0", "f16"], "q8_0": ["q8_0", "f16"]}.get(wanted, [wanted])
    for qtype in chain:
        if row % gguf.GGML_QUANT_SIZES[_QTYPES[qtype]][0] == 0:
            return qtype
    return "f32"


def _encode(data: np.ndarray, qtype: str) -> np.ndarray:
    if qtype == "f32":
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == "f16":
        return data.astype(np.float16)
    raw = _native.quantize(data, qtype)
    rows = int(np.prod(data.shape[:-1])) if data.ndim > 1 else 1
    return np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)


def _write_gguf(
    path: Path,
    arch: str,
    metadata: Sequence[tuple[str, Any, str]],
    tensors: Sequence[_OutTensor],
    produce: Callable[[int], np.ndarray],
) -> int:
    """Writes a GGUF file tensor by tensor (bounded memory: `produce(i)` makes the f32 data of
    tensor i just before it is written), atomically via a temp file. Returns the data size."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    total = sum(t.nbytes() for t in tensors)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        for key, value, kind in metadata:
            if kind == "u32":
                writer.add_uint32(key, value)
            elif kind == "f32":
                writer.add_float32(key, value)
            elif kind == "u32_array":
                writer.add_key_value(
                    key, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.UINT32
                )
            elif kind == "str_array":
                writer.add_key_value(
                    key, value, gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING
                )
            else:
                writer.add_string(key, value)
        for t in tensors:
            if t.qtype in ("f32", "f16"):
                dtype = np.float32 if t.qtype == "f32" else np.float16
                writer.add_tensor_info(t.name, t.shape, np.dtype(dtype), t.nbytes())
            else:
                byte_shape = (*t.shape[:-1], _row_bytes(t.qtype, t.shape[-1]))
                writer.add_tensor_info(
                    t.name, byte_shape, np.dtype(np.uint8), t.nbytes(), raw_dtype=_QTYPES[t.qtype]
                )
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        done, last_log, start = 0, 0.0, time.monotonic()
        for i, t in enumerate(tensors):
            data = _encode(produce(i), t.qtype)
            if data.nbytes != t.nbytes():
                raise ConversionError(f"internal: '{t.name}' encodes to {data.nbytes} bytes")
            writer.write_tensor_data(data)
            done += data.nbytes
            now = time.monotonic()
            if total >= _PROGRESS_MIN_BYTES and (now - last_log > 2.0 or done == total):
                _LOGGER.info(
                    "%s: %3.0f%% (%d/%d MB, %.0f s)",
                    path.name,
                    100.0 * done / total,
                    done >> 20,
                    total >> 20,
                    now - start,
                )
                last_log = now
        writer.close()
        # mkstemp creates the file private (0600); give it the usual umask-based mode.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return total


# Checkpoint tensors that only encoding (audio -> codes) uses: TTS never runs them.
_ENCODER_ONLY_PREFIX = "encoder."
_ENCODER_ONLY = {
    "decoder.quantizer.rvq_first.input_proj.weight",
    "decoder.quantizer.rvq_rest.input_proj.weight",
}


def _check_names(ckpt: SafetensorsCheckpoint, used: set[str], source: Path) -> None:
    for name in ckpt.names():
        if name.startswith(_ENCODER_ONLY_PREFIX) or name in _ENCODER_ONLY:
            continue
        if name not in used:
            raise ConversionError(f"{source}: unknown tensor '{name}' (not in the decoder table)")


def convert_decoder(checkpoint_dir: Path, out_path: Path, out_type: str = "f32") -> Path:
    """speech_tokenizer/ of a checkpoint -> decoder.gguf."""
    tok_dir = checkpoint_dir / "speech_tokenizer"
    config_path = tok_dir / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as err:
        raise ConversionError(f"cannot read {config_path}: {err}") from err
    hparams = decoder_hparams(config, config_path)
    specs = _native.decoder_tensor_specs(hparams)
    ckpt = SafetensorsCheckpoint(tok_dir)
    used = {s for spec in specs for s in spec["sources"]}
    missing = sorted(s for s in used if s not in ckpt.entries)
    if missing:
        raise ConversionError(f"{tok_dir}: checkpoint tensor '{missing[0]}' is missing")
    _check_names(ckpt, used, tok_dir)

    arch = _native.decoder_arch()
    metadata: list[tuple[str, Any, str]] = [
        (arch["format_version_key"], arch["format_version"], "u32")
    ]
    kinds = {k["key"]: k["type"] for k in arch["meta_keys"]}
    metadata += [(key, value, kinds[key]) for key, value in hparams.items()]

    # The decoder is compute-bound (~62 GFLOP per second of audio): quantizing it to 8 or 4
    # bits would cost quality for no speed. Any --type but f32 stores its GEMM matrices as f16:
    # half the memory, and half the bytes a streamed frame reads (each push reads every
    # weight); the GEMM widens them to f32, so activations stay f32. Other tensors stay f32.
    panel = arch["conv_panel"]

    def qtype(spec: dict[str, Any]) -> str:
        gemm = spec["transform"] in ("linear", "conv", "trans_conv") and spec["ne"][1] % panel == 0
        return "f16" if out_type != "f32" and gemm else "f32"

    tensors = [_OutTensor(s["name"], tuple(reversed(s["ne"])), qtype(s)) for s in specs]
    total = _write_gguf(out_path, arch["arch"], metadata, tensors, lambda i: _apply(specs[i], ckpt))
    _LOGGER.info("wrote %s (%d tensors, %d MB)", out_path, len(specs), total >> 20)
    return out_path


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConversionError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return data


def talker_metadata(checkpoint_dir: Path) -> list[tuple[str, Any, str]]:
    """The talker GGUF metadata from config.json and generation_config.json via the key table.

    Maps (speakers, languages, dialects) become a sorted name list and a value list; the
    dialect list shares the speaker order ("" for no dialect)."""
    files = {
        name: _read_json(checkpoint_dir / name)
        for name in ("config.json", "generation_config.json")
    }
    out: list[tuple[str, Any, str]] = []
    for k in _native.talker_arch()["meta_keys"]:
        fname, _, path = k["config_path"].partition(":")
        value = _config_value(files[fname], path, checkpoint_dir / fname)
        if k["type"] in ("u32", "f32"):
            out.append((k["key"], _typed(value, k["type"], k["key"]), k["type"]))
            continue
        if not isinstance(value, dict):
            raise ConversionError(f"{checkpoint_dir / fname}: '{path}' is not a mapping")
        if not value and k["type"] == "str_u32_map":
            # The Base models have no built-in speakers: they clone a voice from reference
            # audio, which the engine does not do (yet).
            raise ConversionError(
                f"{checkpoint_dir / fname}: '{path}' is empty: a Base (voice-cloning) "
                "checkpoint? Kazeia speaks with the built-in speakers of the CustomVoice "
                "models, e.g. Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
            )
        names = sorted(str(n).lower() for n in value)
        lowered = {str(n).lower(): v for n, v in value.items()}
        if k["type"] == "str_u32_map":
            values: list[Any] = [_typed(lowered[n], "u32", f"{path}.{n}") for n in names]
            out.append((k["key"] + ".values", values, "u32_array"))
        else:
            values = [v if isinstance(v, str) else "" for v in (lowered[n] for n in names)]
            out.append((k["key"] + ".values", values, "str_array"))
        out.append((k["key"] + ".names", names, "str_array"))
    return out


def convert_talker(checkpoint_dir: Path, out_path: Path, out_type: str = "f32") -> Path:
    """model.safetensors of a checkpoint -> talker.gguf (talker, text path, code predictor)."""
    metadata = talker_metadata(checkpoint_dir)
    hparams = {key: value for key, value, kind in metadata if kind in ("u32", "f32")}
    specs = _native.talker_tensor_specs(hparams)
    ckpt = SafetensorsCheckpoint(checkpoint_dir)
    used = {s for spec in specs for s in spec["sources"]}
    for name in sorted(used):
        if name not in ckpt.entries:
            raise ConversionError(f"{checkpoint_dir}: checkpoint tensor '{name}' is missing")
    for name in ckpt.names():
        # The Base model's speaker encoder serves voice cloning, which the engine lacks yet.
        if name not in used and not name.startswith("speaker_encoder."):
            raise ConversionError(
                f"{checkpoint_dir}: unknown tensor '{name}' (not in the talker table)"
            )

    def qtype(spec: dict[str, Any]) -> str:
        if spec["kind"] in ("norm", "bias") or out_type == "f32":
            return "f32"
        chosen = fitting_type(out_type, spec["ne"][0])
        if chosen != out_type:
            _LOGGER.info(
                "%s: rows of %d do not fit %s, stored as %s",
                spec["name"],
                spec["ne"][0],
                out_type,
                chosen,
            )
        return chosen

    def load(i: int) -> np.ndarray:
        spec = specs[i]
        parts = [ckpt.get(s) for s in spec["sources"]]
        data = (
            parts[0]
            if len(parts) == 1
            else (np.stack(parts) if spec["kind"] == "matrix" else np.concatenate(parts))
        )
        expected = tuple(reversed(spec["ne"]))
        if data.shape != expected:
            raise ConversionError(
                f"tensor '{spec['sources'][0]}' has shape {ckpt.entries[spec['sources'][0]].shape}"
                f", which does not fit '{spec['name']}' {expected} from config.json"
            )
        return data

    tensors = [_OutTensor(s["name"], tuple(reversed(s["ne"])), qtype(s)) for s in specs]
    arch = _native.talker_arch()
    metadata = [(arch["format_version_key"], arch["format_version"], "u32"), *metadata]
    total = _write_gguf(out_path, arch["arch"], metadata, tensors, load)
    _LOGGER.info("wrote %s (%d tensors, %d MB)", out_path, len(specs), total >> 20)
    return out_path


# Copied beside the GGUF files: the tokenizer, and config.json, whose transformers_version
# decides which pre-tokenizer regex the official loader applies (see tokenizer.py).
TOKENIZER_FILES = (
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "tokenizer.json",
    "config.json",
)


def convert(checkpoint_dir: Path, out_dir: Path, out_type: str = "f32") -> list[Path]:
    """Converts every part of a checkpoint and copies its tokenizer files. Returns the files."""
    if out_type not in OUT_TYPES:
        raise ConversionError(f"--type must be one of {', '.join(OUT_TYPES)}, got {out_type!r}")
    if not checkpoint_dir.is_dir():
        raise ConversionError(f"{checkpoint_dir} is not a directory")
    talker_metadata(checkpoint_dir)  # an unsupported checkpoint fails before anything is written
    written = [
        convert_decoder(checkpoint_dir, out_dir / "decoder.gguf", out_type),
        convert_talker(checkpoint_dir, out_dir / "talker.gguf", out_type),
    ]
    for name in TOKENIZER_FILES:
        if (checkpoint_dir / name).is_file():
            shutil.copyfile(checkpoint_dir / name, out_dir / name)
            written.append(out_dir / name)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia.convert",
        description="Convert a Qwen3-TTS 12 Hz Hugging Face checkpoint into GGUF files.",
    )
    parser.add_argument("checkpoint", type=Path, help="checkpoint directory (config.json, ...)")
    parser.add_argument("out_dir", type=Path, help="output directory")
    parser.add_argument("--type", default="f32", choices=OUT_TYPES, help="weight type")
    parser.add_argument("--debug", action="store_true", help="verbose logging")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.INFO, format="%(levelname)s %(message)s"
    )
    try:
        convert(args.checkpoint, args.out_dir, args.type)
    except ConversionError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
