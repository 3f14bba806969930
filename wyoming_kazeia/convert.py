"""Convert a Hugging Face Qwen3-TTS 12 Hz checkpoint into the GGUF files of the native engine.

    python -m wyoming_kazeia.convert CHECKPOINT_DIR OUT_DIR [--type TYPE]

(TYPE: f32, the default, or f16, q8_0, q6_k, q5_k, q4_k, q4_k_mix: see OUT_TYPES)

writes one GGUF file per model part (OUT_DIR/decoder.gguf: the speech decoder; OUT_DIR/talker.gguf:
talker, text path and code predictor) and copies the tokenizer files. The parts and their format
tables come from the native loader (`native.formats`): every hyper-parameter is read from the
checkpoint's JSON files through a part's metadata key table, every tensor is made through its
tensor table (sources, transform, storage rule), so the files always match what the loader
expects. One loop serves every part.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
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

from .errors import ConversionError, KazeiaError
from .native import formats
from .settings import QUANT_TYPES

_LOGGER = logging.getLogger(__name__)

OUT_TYPES = QUANT_TYPES
# q4_k_mix: 4-bit (q4_k) matrices of the talker's attention and MLP, q8_0 everywhere else (code
# predictor, embeddings, heads, text projection): the mixed scheme vox ships as "q4".
_MIX_4BIT = re.compile(r"tlk\.blk\.\d+\.(attn_[qkvo]|ffn_(gate|up|down))\.weight")
# Below this many bytes of output a conversion does not log per-tensor progress.
_PROGRESS_MIN_BYTES = 64 << 20


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
    "conv": lambda a, _s: a[0].transpose(0, 2, 1).reshape(a[0].shape[0], -1),
    "trans_conv": lambda a, s: _trans_conv(a[0], s),
    "depthwise": lambda a, _s: a[0][:, 0, :].T,
    "codebook": lambda a, _s: a[0] / np.maximum(a[1], np.float32(1e-5))[:, None],
    "exp": lambda a, _s: np.exp(a[0]),
    "inv_exp": lambda a, _s: np.float32(1.0) / (np.exp(a[0]) + np.float32(1e-9)),
    "stack": lambda a, _s: np.stack(a),
    "concat": lambda a, _s: np.concatenate(a),
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
    """A metadata value as its GGUF kind (u32, f32, u32_array, str)."""
    try:
        if kind == "str":
            if not isinstance(value, str) or not value:
                raise ValueError(value)
            return value
        if kind == "u32":
            if int(value) != value or not 0 <= value <= 0xFFFFFFFF:
                raise ValueError(value)
            return int(value)
        if kind == "f32":
            return float(value)
        return [int(v) for v in value]
    except (TypeError, ValueError) as err:
        raise ConversionError(f"metadata '{key}' has an invalid value {value!r}") from err


# --------------------------------------------------------------------------- GGUF writing


@dataclass(frozen=True)
class _OutTensor:
    """A tensor as written: name, numpy-order shape, storage type (f32, f16, q8_0, q4_k, ...)."""

    name: str
    shape: tuple[int, ...]
    qtype: str

    def nbytes(self) -> int:
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        row = self.shape[-1]
        return rows * _row_bytes(self.qtype, row)


def _gguf_type(qtype: str) -> gguf.GGMLQuantizationType:
    """gguf's type of a storage type: the same name in lower case (f32, q8_0, q6_k, ...)."""
    return gguf.GGMLQuantizationType[qtype.upper()]


# What a matrix whose rows do not fit a type's block (256 values for the k-quants, 32 for q8_0)
# is stored as instead: the next type down that fits.
_FALLBACKS = {
    "q8_0": ["q8_0", "f16"],
    "q6_k": ["q6_k", "q8_0", "f16"],
    "q5_k": ["q5_k", "q8_0", "f16"],
    "q4_k": ["q4_k", "q8_0", "f16"],
}


def _row_bytes(qtype: str, n: int) -> int:
    block, size = gguf.GGML_QUANT_SIZES[_gguf_type(qtype)]
    return n // block * size


def fitting_type(wanted: str, row: int) -> str:
    """The storage type for a matrix of rows of `row` values: `wanted` when its block size
    divides the row, else the next type that fits (q6_k, q5_k, q4_k -> q8_0 -> f16)."""
    for qtype in _FALLBACKS.get(wanted, [wanted]):
        if row % gguf.GGML_QUANT_SIZES[_gguf_type(qtype)][0] == 0:
            return qtype
    return "f32"


def storage_type(spec: dict[str, Any], out_type: str) -> str:
    """How the tensor of `spec` is stored for --type `out_type`, by its storage rule."""
    if spec["storage"] == "f32" or out_type == "f32":
        return "f32"
    if spec["storage"] == "f16_when_quantized":
        return "f16"
    if out_type == "q4_k_mix":
        out_type = "q4_k" if _MIX_4BIT.fullmatch(spec["name"]) else "q8_0"
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


def _encode(data: np.ndarray, qtype: str) -> np.ndarray:
    if qtype == "f32":
        return np.ascontiguousarray(data, dtype=np.float32)
    if qtype == "f16":
        return data.astype(np.float16)
    raw = formats.quantize(data, qtype)
    rows = int(np.prod(data.shape[:-1])) if data.ndim > 1 else 1
    return np.frombuffer(raw, dtype=np.uint8).reshape(rows, -1)


def _write_gguf(
    path: Path,
    arch: str,
    metadata: Sequence[tuple[str, Any, str]],
    tensors: Sequence[_OutTensor],
    produce: Callable[[int], np.ndarray],
    progress: Callable[[str], None] | None = None,
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
                    t.name,
                    byte_shape,
                    np.dtype(np.uint8),
                    t.nbytes(),
                    raw_dtype=_gguf_type(t.qtype),
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
                text = (
                    f"converting {path.name}: {100.0 * done / total:3.0f}% "
                    f"({done >> 20}/{total >> 20} MB, {now - start:.0f} s)"
                )
                _LOGGER.info("%s", text)
                if progress is not None:
                    progress(text)
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


# --------------------------------------------------------------------------- parts

PARTS: list[dict[str, Any]] = formats.parts()


def _part(name: str) -> dict[str, Any]:
    for part in PARTS:
        if part["name"] == name:
            return part
    names = ", ".join(p["name"] for p in PARTS)
    raise ConversionError(f"unknown model part {name!r}; parts: {names}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConversionError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return data


def part_metadata(name: str, checkpoint_dir: Path) -> list[tuple[str, Any, str]]:
    """The GGUF metadata of part `name`: (key, value, kind) for each key of its table, read
    from the checkpoint's JSON files ("FILE:dotted.path") or a constant of the official code.

    Maps (speakers, languages, dialects) become a sorted name list and a value list; the
    dialect list shares the speaker order ("" for no dialect)."""
    files: dict[str, dict[str, Any]] = {}
    out: list[tuple[str, Any, str]] = []
    for k in _part(name)["meta_keys"]:
        if k["source"] is None:
            out.append((k["key"], _typed(k["constant"], k["type"], k["key"]), k["type"]))
            continue
        fname, _, path = k["source"].partition(":")
        if fname not in files:
            files[fname] = _read_json(checkpoint_dir / fname)
        try:
            value = _config_value(files[fname], path, checkpoint_dir / fname)
        except ConversionError:
            if k["fallback"] is None:
                raise
            # A default of the official config class, left out of published config.json files.
            value = k["fallback"][0] if k["type"] in ("u32", "f32") else k["fallback"]
        if k["type"] in ("u32", "f32", "u32_array", "str"):
            out.append((k["key"], _typed(value, k["type"], k["key"]), k["type"]))
            continue
        if not isinstance(value, dict):
            raise ConversionError(f"{checkpoint_dir / fname}: '{path}' is not a mapping")
        if not value:
            continue  # no keys (GGUF has no empty arrays): the Base and VoiceDesign speakers
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


def part_tensor_specs(name: str, metadata: Sequence[tuple[str, Any, str]]) -> list[dict[str, Any]]:
    """Every tensor of part `name` for the hyper-parameters in `metadata`, in file order."""
    hparams = {key: value for key, value, kind in metadata if kind in ("u32", "f32", "u32_array")}
    specs: list[dict[str, Any]] = formats.tensor_specs(name, hparams)
    return specs


def convert_part(
    name: str,
    checkpoint_dir: Path,
    out_path: Path,
    out_type: str = "f32",
    progress: Callable[[str], None] | None = None,
) -> Path:
    """One model part of a checkpoint -> its GGUF file (e.g. "decoder" -> decoder.gguf).
    `progress` is told how far the writing is (for long conversions)."""
    part = _part(name)
    metadata = part_metadata(name, checkpoint_dir)
    specs = part_tensor_specs(name, metadata)
    weights_dir = checkpoint_dir / part["weights_dir"]
    ckpt = SafetensorsCheckpoint(weights_dir)
    used = {s for spec in specs for s in spec["sources"]}
    missing = sorted(s for s in used if s not in ckpt.entries)
    if missing:
        raise ConversionError(f"{weights_dir}: checkpoint tensor '{missing[0]}' is missing")
    unused = tuple(part["unused_sources"])
    for source in ckpt.names():
        if source not in used and not source.startswith(unused):
            raise ConversionError(
                f"{weights_dir}: unknown tensor '{source}' (not in the {name} table)"
            )
    tensors = [
        _OutTensor(s["name"], tuple(reversed(s["ne"])), storage_type(s, out_type)) for s in specs
    ]
    version = (part["format_version_key"], part["format_version"], "u32")
    total = _write_gguf(
        out_path,
        part["arch"],
        [version, *metadata],
        tensors,
        lambda i: _apply(specs[i], ckpt),
        progress,
    )
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


def checkpoint_parts(checkpoint_dir: Path) -> list[dict[str, Any]]:
    """The parts a checkpoint has: every kind has the talker and the decoder, the Base models
    (voice cloning) also the speaker encoder and the speech encoder."""
    config = _read_json(checkpoint_dir / "config.json")
    kind = config.get("tts_model_type")
    return [p for p in PARTS if p["model_type"] in ("", kind)]


def convert(
    checkpoint_dir: Path,
    out_dir: Path,
    out_type: str = "f32",
    progress: Callable[[str], None] | None = None,
) -> list[Path]:
    """Converts every part of a checkpoint and copies its tokenizer files. Returns the files."""
    if out_type not in OUT_TYPES:
        raise ConversionError(f"--type must be one of {', '.join(OUT_TYPES)}, got {out_type!r}")
    if not checkpoint_dir.is_dir():
        raise ConversionError(f"{checkpoint_dir} is not a directory")
    parts = checkpoint_parts(checkpoint_dir)
    for part in parts:  # an unsupported checkpoint fails before anything is written
        part_metadata(part["name"], checkpoint_dir)
    written = [
        convert_part(part["name"], checkpoint_dir, out_dir / part["file"], out_type, progress)
        for part in parts
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
    except KazeiaError as err:  # the whole family: the native format tables raise theirs too
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
