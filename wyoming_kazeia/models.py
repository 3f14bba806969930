"""Model management: turn what the user names with --model into a converted model directory.

--model may be
- a converted model directory (talker.gguf + decoder.gguf): used as it is;
- a Hugging Face checkpoint directory (config.json + model.safetensors): converted once into
  DATA_DIR/converted/ and reused while the checkpoint and the weight type stay the same;
- a Hugging Face repo id such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice: downloaded once with
  huggingface_hub into DATA_DIR/hf/OWNER--NAME (progress on stderr), then converted as above.
  Offline, a clear message says what to download and where to put it.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from .convert import convert
from .errors import ConversionError, ModelNotFoundError

_LOGGER = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The files a conversion reads (the speech tokenizer lives in a subfolder).
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.txt", "speech_tokenizer/*"]


def is_converted(path: Path) -> bool:
    return (path / "talker.gguf").is_file() and (path / "decoder.gguf").is_file()


def is_checkpoint(path: Path) -> bool:
    has_weights = (path / "model.safetensors").is_file() or (
        path / "model.safetensors.index.json"
    ).is_file()
    return (path / "config.json").is_file() and has_weights


def converted_model(checkpoint: Path, quant: str, cache_dir: Path) -> Path:
    """The conversion of `checkpoint` at `quant` in cache_dir, made on first use."""
    try:
        stat = (checkpoint / "config.json").stat()
        key = hashlib.sha256(f"{checkpoint.resolve()}:{stat.st_mtime_ns}:{quant}".encode())
        out = cache_dir / f"{checkpoint.resolve().name}-{quant}-{key.hexdigest()[:12]}"
        if not is_converted(out):
            _LOGGER.info("converting %s into %s (%s, once)", checkpoint, out, quant)
            convert(checkpoint, out, quant)
    except OSError as err:  # an unreadable checkpoint, an unwritable data dir, a full disk
        raise ConversionError(f"cannot convert {checkpoint} into {cache_dir}: {err}") from err
    return out


def resolve_model(spec: str | Path, quant: str, data_dir: Path) -> Path:
    """A converted model directory for `spec` (see the module docstring)."""
    path = Path(spec).expanduser()
    if path.exists():
        if is_converted(path):
            return path
        if is_checkpoint(path):
            return converted_model(path, quant, data_dir / "converted")
        raise ModelNotFoundError(
            f"{path} is neither a converted model (talker.gguf + decoder.gguf) nor a Hugging "
            "Face checkpoint (config.json + model.safetensors)"
        )
    repo_id = str(spec)
    if not _REPO_ID.match(repo_id):
        raise ModelNotFoundError(
            f"model {repo_id!r} not found: give a model directory, a checkpoint directory or a "
            f"Hugging Face repo id such as {DEFAULT_MODEL}"
        )
    local = data_dir / "hf" / repo_id.replace("/", "--")
    if not is_checkpoint(local):
        download(repo_id, local)
    return converted_model(local, quant, data_dir / "converted")


def download(repo_id: str, local: Path) -> None:
    """Downloads a checkpoint with huggingface_hub (resumable, progress bars on stderr)."""
    _LOGGER.info("downloading %s into %s", repo_id, local)
    try:
        from huggingface_hub import snapshot_download

        snapshot_download(repo_id, local_dir=local, allow_patterns=_DOWNLOAD_PATTERNS)
    except Exception as err:  # offline, unknown repo, disk full: all end the same way
        raise ModelNotFoundError(
            f"cannot download {repo_id} ({type(err).__name__}: {err}). On a machine with "
            f"internet run `hf download {repo_id} --local-dir {repo_id.replace('/', '--')}` and "
            f"copy that folder to {local}, or start with --model /path/to/checkpoint"
        ) from err
    if not is_checkpoint(local):
        raise ModelNotFoundError(
            f"{repo_id} downloaded into {local} but it is not a Qwen3-TTS checkpoint "
            "(config.json + model.safetensors missing)"
        )
