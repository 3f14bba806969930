"""Convert a Hugging Face Qwen3-TTS 12 Hz checkpoint into the GGUF files of the native engine.

    python -m wyoming_kazeia.convert CHECKPOINT_DIR OUT_DIR [--type f32|f16|q8_0|q4_k]

writes OUT_DIR/decoder.gguf (the speech decoder). Every hyper-parameter comes from the
checkpoint's config.json through the metadata key table of the native loader, and every
tensor through its tensor table (`wyoming_kazeia._native.decoder_arch` and
`decoder_tensor_specs`), so the files always match what the loader expects.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
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


def _stored(data: np.ndarray, spec: dict[str, Any], out_type: str) -> np.ndarray:
    """The array as stored: matrices as f16 for --type f16, everything else f32.

    The decoder is compute-bound (~62 GFLOP per second of audio): a quantized matrix
    saves memory but no time, and costs quality, so q8_0/q4_k keep it at f32.
    """
    if out_type == "f16" and spec["transform"] in ("linear", "conv", "trans_conv"):
        return data.astype(np.float16)
    return data


def _write_gguf(
    path: Path,
    arch: str,
    metadata: Sequence[tuple[str, Any, str]],
    tensors: Sequence[tuple[str, tuple[int, ...], np.dtype[Any]]],
    produce: Callable[[], Iterator[np.ndarray]],
) -> None:
    """Writes a GGUF file tensor by tensor (bounded memory), atomically via a temp file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
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
            else:
                writer.add_string(key, value)
        for name, shape, dtype in tensors:
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            writer.add_tensor_info(name, shape, dtype, nbytes)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for data in produce():
            writer.write_tensor_data(data)
        writer.close()
        # mkstemp creates the file private (0600); give it the usual umask-based mode.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


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

    # Shapes and dtypes first (the header precedes the data); the data is produced lazily.
    def stored_dtype(spec: dict[str, Any]) -> np.dtype[Any]:
        probe = np.zeros(1, dtype=np.float32)
        return _stored(probe, spec, out_type).dtype

    tensors = [(s["name"], tuple(reversed(s["ne"])), stored_dtype(s)) for s in specs]
    total = sum(int(np.prod(shape)) * dt.itemsize for _n, shape, dt in tensors)

    def produce() -> Iterator[np.ndarray]:
        done, last_log, start = 0, 0.0, time.monotonic()
        for spec in specs:
            data = _stored(_apply(spec, ckpt), spec, out_type)
            done += data.nbytes
            now = time.monotonic()
            if total >= _PROGRESS_MIN_BYTES and (now - last_log > 2.0 or done == total):
                _LOGGER.info(
                    "%s: %3.0f%% (%d/%d MB, %.0f s)",
                    out_path.name,
                    100.0 * done / total,
                    done >> 20,
                    total >> 20,
                    now - start,
                )
                last_log = now
            yield data

    _write_gguf(out_path, arch["arch"], metadata, tensors, produce)
    _LOGGER.info("wrote %s (%d tensors, %d MB)", out_path, len(specs), total >> 20)
    return out_path


def convert(checkpoint_dir: Path, out_dir: Path, out_type: str = "f32") -> list[Path]:
    """Converts every part the engine has today. Returns the written files."""
    if out_type not in OUT_TYPES:
        raise ConversionError(f"--type must be one of {', '.join(OUT_TYPES)}, got {out_type!r}")
    if not checkpoint_dir.is_dir():
        raise ConversionError(f"{checkpoint_dir} is not a directory")
    return [convert_decoder(checkpoint_dir, out_dir / "decoder.gguf", out_type)]


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
