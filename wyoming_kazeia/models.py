"""Model management: turn what the user names with --model into a converted model directory.

--model may be
- a converted model directory (talker.gguf + decoder.gguf): used as it is;
- a Hugging Face checkpoint directory (config.json + model.safetensors): converted once into
  DATA_DIR/converted/ and reused while the checkpoint and the weight type stay the same;
- a Hugging Face repo id such as Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice: converted once into
  DATA_DIR/converted/OWNER--NAME-QUANT, which records where it came from (source.json: repo
  id, revision, weight type), so later starts use it without the network and the checkpoint
  may be deleted. The checkpoint comes from the standard Hugging Face cache (HF_HOME,
  ~/.cache/huggingface: a model already there is not fetched again; HF_HUB_OFFLINE=1 is
  honoured), downloaded when missing with its size and an ETA in the log; a repo whose
  config.json names a kind Kazeia cannot serve is refused before its weights are fetched.
  A checkpoint folder at DATA_DIR/hf/OWNER--NAME is used too. Offline, a clear message says
  what to download and where to put it.

Long steps report their progress through a callback (the server shows it in `describe`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import __version__
from .convert import PARTS, convert
from .errors import ConversionError, ModelNotFoundError
from .settings import add_env_argument

_LOGGER = logging.getLogger(__name__)

DEFAULT_MODEL = "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice"
# Where downloaded-and-converted models live unless --data-dir says otherwise.
DEFAULT_DATA_DIR = (
    Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "wyoming-kazeia"
)
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
# The files a conversion reads (the speech tokenizer lives in a subfolder).
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.txt", "speech_tokenizer/*"]
# The checkpoint kinds the engine serves (config.json's tts_model_type).
SERVED_KINDS = ("custom_voice", "base", "voice_design")
SOURCE_FILE = "source.json"  # in a converted folder: where it came from
# The format version of every part this build reads: a conversion recorded with other versions
# is made again (from its checkpoint) instead of failing to load.
FORMATS = {str(part["name"]): int(part["format_version"]) for part in PARTS}

Progress = Callable[[str], None]


def add_data_dir_argument(parser: argparse._ActionsContainer, what: str) -> None:
    """--data-dir (KZTTS_DATA_DIR), as every command has it; `what` says what it holds."""
    add_env_argument(parser, "--data-dir", "KZTTS_DATA_DIR", what, str(DEFAULT_DATA_DIR), type=Path)


def _quiet(_: str) -> None:
    pass


def is_converted(path: Path) -> bool:
    return (path / "talker.gguf").is_file() and (path / "decoder.gguf").is_file()


def is_checkpoint(path: Path) -> bool:
    has_weights = (path / "model.safetensors").is_file() or (
        path / "model.safetensors.index.json"
    ).is_file()
    return (path / "config.json").is_file() and has_weights


def check_servable(config: dict[str, Any], where: str) -> None:
    """ConversionError unless a checkpoint's config.json names a kind the engine serves."""
    kind = config.get("tts_model_type")
    if kind is not None and kind not in SERVED_KINDS:
        raise ConversionError(
            f"{where} is a {kind!r} checkpoint: Kazeia serves the Qwen3-TTS 12 Hz kinds "
            f"{', '.join(SERVED_KINDS)}"
        )


def source_of(model_dir: Path) -> dict[str, Any]:
    """What a converted folder records of its origin ({} when it records nothing)."""
    try:
        data = json.loads((model_dir / SOURCE_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _convert_once(
    checkpoint: Path, out: Path, quant: str, source: dict[str, Any], progress: Progress
) -> Path:
    """`checkpoint` converted into `out` (built beside it, renamed when complete), with its
    source and format versions recorded; reused when already there in this build's formats."""
    if is_converted(out) and source_of(out).get("formats") == FORMATS:
        return out
    try:
        check_servable(json.loads((checkpoint / "config.json").read_text()), str(checkpoint))
        _LOGGER.info("converting %s into %s (%s, once)", checkpoint, out, quant)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        convert(checkpoint, tmp, quant, progress=progress)
        record = {
            **source,
            "quant": quant,
            "formats": FORMATS,
            "converted_by": f"wyoming-kazeia {__version__}",
        }
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    except (OSError, ValueError) as err:  # unreadable checkpoint, unwritable data dir, full disk
        if isinstance(err, ConversionError):
            raise
        raise ConversionError(f"cannot convert {checkpoint} into {out}: {err}") from err
    return out


def converted_model(
    checkpoint: Path, quant: str, cache_dir: Path, progress: Progress = _quiet
) -> Path:
    """The conversion of checkpoint folder `checkpoint` at `quant` in cache_dir, made on first
    use (a new conversion when the checkpoint changes)."""
    try:
        stat = (checkpoint / "config.json").stat()
    except OSError as err:
        raise ConversionError(f"cannot read {checkpoint}: {err}") from err
    key = hashlib.sha256(f"{checkpoint.resolve()}:{stat.st_mtime_ns}:{quant}".encode())
    out = cache_dir / f"{checkpoint.resolve().name}-{quant}-{key.hexdigest()[:12]}"
    return _convert_once(
        checkpoint, out, quant, {"checkpoint": str(checkpoint.resolve())}, progress
    )


def resolve_model(
    spec: str | Path, quant: str, data_dir: Path, progress: Progress = _quiet
) -> Path:
    """A converted model directory for `spec` (see the module docstring)."""
    path = Path(spec).expanduser()
    if path.exists():
        if is_converted(path):
            return path
        if is_checkpoint(path):
            return converted_model(path, quant, data_dir / "converted", progress)
        missing = "vocab.json" if not (path / "vocab.json").is_file() else "model.safetensors"
        raise ModelNotFoundError(
            f"{path} is neither a converted model (talker.gguf + decoder.gguf) nor a Hugging "
            f"Face checkpoint (config.json + model.safetensors); it lacks {missing}"
        )
    repo_id = str(spec)
    if not _REPO_ID.match(repo_id):
        raise ModelNotFoundError(
            f"model {repo_id!r} not found: give a model directory, a checkpoint directory or a "
            f"Hugging Face repo id such as {DEFAULT_MODEL}"
        )
    out = data_dir / "converted" / f"{repo_id.replace('/', '--')}-{quant}"
    recorded = source_of(out)
    if (
        is_converted(out)
        and recorded.get("repo_id") == repo_id
        and recorded.get("formats") == FORMATS
    ):
        return out  # converted before: no network, the checkpoint may be gone
    legacy = data_dir / "hf" / repo_id.replace("/", "--")
    if is_checkpoint(legacy):
        checkpoint, revision = legacy, None
    else:
        checkpoint, revision = download(repo_id, legacy, progress)
    source = {"repo_id": repo_id, "revision": revision, "checkpoint": str(checkpoint)}
    return _convert_once(checkpoint, out, quant, source, progress)


def download(repo_id: str, legacy: Path, progress: Progress = _quiet) -> tuple[Path, str | None]:
    """The checkpoint of `repo_id` in the Hugging Face cache, fetched when missing: its
    folder and revision. Its config.json comes first and must name a kind the engine serves."""
    try:
        from huggingface_hub import hf_hub_download, snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError

        config = Path(hf_hub_download(repo_id, "config.json"))
        check_servable(json.loads(config.read_text()), repo_id)
        try:  # already complete in the cache: no network at all
            folder = snapshot_download(
                repo_id, allow_patterns=_DOWNLOAD_PATTERNS, local_files_only=True
            )
            # The cache's snapshot folder exists as soon as one file is there (config.json,
            # just above): only the files a checkpoint needs make it complete.
            if not _is_complete_download(Path(folder)):
                raise LocalEntryNotFoundError(f"{folder} lacks files of the checkpoint")
        except LocalEntryNotFoundError:
            _LOGGER.info("downloading %s into the Hugging Face cache", repo_id)
            with _DownloadProgress(repo_id, config.parents[2], progress):
                folder = snapshot_download(repo_id, allow_patterns=_DOWNLOAD_PATTERNS)
    except ConversionError:
        raise
    except Exception as err:  # offline, unknown repo, disk full: all end the same way
        raise ModelNotFoundError(
            f"cannot download {repo_id} ({type(err).__name__}: {err}). On a machine with "
            f"internet run `hf download {repo_id}` and copy its Hugging Face cache "
            f"(~/.cache/huggingface) here, or copy the checkpoint folder to {legacy}, or "
            "start with --model /path/to/checkpoint"
        ) from err
    path = Path(folder)
    if not is_checkpoint(path):
        raise ModelNotFoundError(
            f"{repo_id} downloaded into {path} but it is not a Qwen3-TTS checkpoint "
            "(config.json + model.safetensors missing)"
        )
    return path, path.name  # the snapshot folder is named by its revision


def _is_complete_download(path: Path) -> bool:
    needed = ("vocab.json", "merges.txt", "speech_tokenizer/config.json",
              "speech_tokenizer/model.safetensors")  # fmt: skip
    return is_checkpoint(path) and all((path / name).is_file() for name in needed)


class _DownloadProgress:
    """Logs (and reports) a download's size, progress and ETA every few seconds, by watching
    the bytes that arrive in the repo's cache folder."""

    INTERVAL_S = 5.0

    def __init__(self, repo_id: str, cache_repo: Path, progress: Progress) -> None:
        self.repo_id, self.folder, self.progress = repo_id, cache_repo / "blobs", progress
        self.total = self._expected_bytes(repo_id)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kazeia-download", daemon=True)

    @staticmethod
    def _expected_bytes(repo_id: str) -> int:
        try:
            from fnmatch import fnmatch

            from huggingface_hub import HfApi

            info = HfApi().model_info(repo_id, files_metadata=True)
            return sum(
                s.size or 0
                for s in info.siblings or []
                if any(fnmatch(s.rfilename, p) for p in _DOWNLOAD_PATTERNS)
            )
        except Exception:  # noqa: BLE001 - the size is a nicety: progress without it
            return 0

    def _arrived(self) -> int:
        try:
            return sum(p.stat().st_size for p in self.folder.iterdir() if p.is_file())
        except OSError:
            return 0

    def _watch(self) -> None:
        start, first = time.monotonic(), self._arrived()
        while not self._stop.wait(self.INTERVAL_S):
            done = self._arrived()
            rate = (done - first) / max(time.monotonic() - start, 1e-3)
            if self.total:
                eta = (self.total - done) / rate if rate > 0 else float("inf")
                text = (
                    f"downloading {self.repo_id}: {100 * done / self.total:.0f}% "
                    f"({done / 1e9:.2f} of {self.total / 1e9:.2f} GB, "
                    f"ETA {eta / 60:.0f} min)"
                )
            else:
                text = f"downloading {self.repo_id}: {done / 1e9:.2f} GB"
            _LOGGER.info("%s", text)
            self.progress(text)

    def __enter__(self) -> _DownloadProgress:
        size = f"{self.total / 1e9:.2f} GB" if self.total else "size unknown"
        self.progress(f"downloading {self.repo_id} ({size})")
        _LOGGER.info("downloading %s: %s", self.repo_id, size)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True)
class ModelSummary:
    """What a start banner and `describe` say about the model served."""

    name: str  # e.g. "Qwen3-TTS 0.6B CustomVoice, q8_0"
    origin: str  # the repo id, or the folder it came from


def summarize(model_dir: Path, talker_hidden: int, has_speakers: bool) -> ModelSummary:
    """The model's size (from the talker's width), kind and weight type (from source.json, or
    the talker file's tensor types), and origin."""
    size = {1024: "0.6B", 2048: "1.7B"}.get(talker_hidden, f"hidden {talker_hidden}")
    kind = "CustomVoice" if has_speakers else "Base"
    source = source_of(model_dir)
    quant = source.get("quant") or _talker_weight_type(model_dir / "talker.gguf")
    origin = source.get("repo_id") or source.get("checkpoint") or str(model_dir)
    return ModelSummary(f"Qwen3-TTS {size} {kind}, {quant}", str(origin))


def _talker_weight_type(path: Path) -> str:
    """The weight type of a talker file: that of its largest matrices (f32, f16, q8_0, ...)."""
    try:
        import gguf

        reader = gguf.GGUFReader(path)
        counts: dict[str, int] = {}
        for t in reader.tensors:
            if len(t.shape) >= 2:
                name = t.tensor_type.name.lower()
                counts[name] = counts.get(name, 0) + int(t.n_elements)
        return max(counts, key=lambda k: counts[k]) if counts else "unknown"
    except Exception:  # noqa: BLE001 - the engine has loaded it; the label is a nicety
        return "unknown"
