"""Text -> token ids for the Qwen3-TTS prompt, the ids the official qwen-tts pipeline gives.

The talker slices the prompt's ids itself, so every id must be the official tokenizer's; this
module rebuilds that tokenizer from the checkpoint's vocab.json, merges.txt and
tokenizer_config.json with the ``tokenizers`` library alone (no transformers or torch at run time).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from packaging.version import InvalidVersion, Version
from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

from .errors import TokenizerError
from .files import check_regular

logger = logging.getLogger(__name__)

__all__ = [
    "FIXED_MISTRAL_PATTERN",
    "PreTokenizer",
    "QWEN2_PATTERN",
    "TextTokenizer",
    "TokenizerError",
    "official_pre_tokenizer",
]

VOCAB_FILE = "vocab.json"
MERGES_FILE = "merges.txt"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
MODEL_CONFIG_FILE = "config.json"

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

PreTokenizer = Literal["auto", "qwen2", "fixed_mistral"]
_PRE_TOKENIZERS: tuple[str, ...] = ("auto", "qwen2", "fixed_mistral")

# transformers 4.57.3, convert_slow_tokenizer.py, Qwen2Converter (== Qwen2Tokenizer's regex).
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# transformers 4.57.3, tokenization_utils_base.py, _patch_mistral_regex (fix_mistral_regex=True).
FIXED_MISTRAL_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The pre-tokenizer regex ("Mistral regex" fix). qwen-tts 0.1.1 loads its processor with
# ``AutoProcessor.from_pretrained(path, fix_mistral_regex=True)`` (qwen_tts/inference/
# qwen3_tts_model.py, ``Qwen3TTSModel.from_pretrained``); transformers 4.57.3
# (``_patch_mistral_regex`` in tokenization_utils_base.py) then REPLACES the Qwen2 split regex by
# FIXED_MISTRAL_PATTERN (it splits camel case, "HomeAssistant" -> "Home" "Assistant", and has no
# contraction rule, "it'sthe" -> "it" "'sthe") when all hold:
#   1. vocab.json (without added tokens) has more than _FIX_MIN_VOCAB entries;
#   2. the checkpoint folder has a config.json;
#   3. its transformers_version is missing or empty, or in (_FIX_LAST_UNAFFECTED,
#      _FIX_FIRST_FIXED), or <= _FIX_LAST_UNAFFECTED while its model_type is missing or one of
#      _MISTRAL_MODEL_TYPES.
# Real Qwen3-TTS checkpoints say "transformers_version": "4.57.3", so the official pipeline
# tokenizes them with the replaced regex, and so does official_pre_tokenizer.
_FIX_MIN_VOCAB = 100000
_FIX_LAST_UNAFFECTED = Version("4.57.2")
_FIX_FIRST_FIXED = Version("5.0.0")
_MISTRAL_MODEL_TYPES = frozenset({"mistral", "mistral3", "voxtral", "ministral", "pixtral"})

# Qwen2TokenizerFast's defaults for special tokens the config does not mention.
_QWEN2_SPECIAL_DEFAULTS: dict[str, str | None] = {
    "bos_token": None,
    "eos_token": "<|endoftext|>",
    "unk_token": "<|endoftext|>",
    "pad_token": "<|endoftext|>",
}
# transformers' SPECIAL_TOKENS_ATTRIBUTES order (all_special_tokens_extended).
_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
_ADDED_TOKEN_FLAGS = ("single_word", "lstrip", "rstrip", "normalized", "special")


def _read_json(path: Path) -> Any:
    try:
        with check_regular(path).open(encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise TokenizerError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read JSON: {exc}") from exc


def _load_vocab(path: Path) -> dict[str, int]:
    vocab = _read_json(path)
    if not isinstance(vocab, dict) or not vocab:
        raise TokenizerError(f"{path}: expected a non-empty JSON object token -> id")
    for token, idx in vocab.items():
        if type(idx) is not int or idx < 0:
            raise TokenizerError(f"{path}: token {token!r} has id {idx!r}, not an integer >= 0")
    return vocab


def _load_merges(path: Path) -> list[tuple[str, str]]:
    """Parse merges.txt the way transformers' ``Qwen2Tokenizer.__init__`` does.

    Lines are stripped, a first line starting with ``#version:`` and blank lines are skipped,
    and each remaining line splits on whitespace into exactly one pair.
    """
    try:
        with check_regular(path).open(encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        raise TokenizerError(f"{path}: file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TokenizerError(f"{path}: cannot read: {exc}") from exc
    merges: list[tuple[str, str]] = []
    for i, raw in enumerate(lines):
        line = raw.strip()
        if (i == 0 and line.startswith("#version:")) or not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise TokenizerError(f"{path}: line {i + 1} is not a merge pair: {raw!r}")
        merges.append((parts[0], parts[1]))
    if not merges:
        raise TokenizerError(f"{path}: no merges")
    return merges


def _token_content(value: Any, path: Path, key: str) -> str | None:
    """A special-token entry of tokenizer_config.json: a string, an AddedToken dict or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    raise TokenizerError(f"{path}: {key} must be a string, a token object or null, not {value!r}")


def _load_added_tokens(path: Path) -> tuple[list[tuple[int, AddedToken]], list[str], bool]:
    """The added tokens (sorted by id), the extra special-token strings and split_special_tokens.

    The extra strings are the special tokens the config names (or Qwen2TokenizerFast's defaults)
    in transformers' order; those already among the added tokens are dropped by the caller.
    """
    config = _read_json(path)
    if not isinstance(config, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    decoder = config.get("added_tokens_decoder", {})
    if not isinstance(decoder, dict):
        raise TokenizerError(f"{path}: added_tokens_decoder must be an object id -> token")
    added: list[tuple[int, AddedToken]] = []
    for key, entry in decoder.items():
        try:
            idx = int(key)
        except ValueError:
            raise TokenizerError(f"{path}: added_tokens_decoder key {key!r} is not an id") from None
        if idx < 0:
            raise TokenizerError(f"{path}: added_tokens_decoder id {idx} is negative")
        if not isinstance(entry, dict) or not isinstance(entry.get("content"), str):
            raise TokenizerError(f"{path}: added_tokens_decoder[{key!r}] has no string 'content'")
        flags = {k: entry[k] for k in _ADDED_TOKEN_FLAGS if k in entry}
        for name, flag in flags.items():
            if not isinstance(flag, bool):
                raise TokenizerError(f"{path}: added_tokens_decoder[{key!r}].{name} is not a bool")
        # Same defaults as transformers' AddedToken(**entry): normalized defaults to not special.
        added.append((idx, AddedToken(entry["content"], **flags)))
    added.sort(key=lambda item: item[0])

    specials: list[str] = []
    for key in _SPECIAL_TOKEN_KEYS:
        value = config[key] if key in config else _QWEN2_SPECIAL_DEFAULTS.get(key)
        content = _token_content(value, path, key)
        if content is not None:
            specials.append(content)
    extra = config.get("additional_special_tokens") or []
    if not isinstance(extra, list):
        raise TokenizerError(f"{path}: additional_special_tokens must be a list")
    for i, value in enumerate(extra):
        content = _token_content(value, path, f"additional_special_tokens[{i}]")
        if content is not None:
            specials.append(content)

    split = config.get("split_special_tokens", False)
    if not isinstance(split, bool):
        raise TokenizerError(f"{path}: split_special_tokens must be a bool")
    return added, specials, split


def official_pre_tokenizer(
    model_dir: Path | str, vocab_size: int
) -> Literal["qwen2", "fixed_mistral"]:
    """The regex the official pipeline (qwen-tts 0.1.1 on transformers 4.57.3) uses for a folder.

    Mirrors transformers' ``_patch_mistral_regex`` called with ``fix_mistral_regex=True`` on a
    local folder (the rule is spelled out above _FIX_MIN_VOCAB). ``vocab_size`` is the size of
    vocab.json without the added tokens. The rule reads the folder's config.json: a folder holding
    only the tokenizer files falls back to the Qwen2 regex (with a warning), as transformers would.
    """
    if vocab_size <= _FIX_MIN_VOCAB:
        return "qwen2"
    path = Path(model_dir) / MODEL_CONFIG_FILE
    if not path.is_file():
        logger.warning(
            "%s has no %s: using the Qwen2 regex, as the official loader would for this folder; "
            "tokenizer files copied from a checkpoint whose config.json says transformers_version "
            "4.57.3 need pre_tokenizer='fixed_mistral' to match the official ids",
            model_dir,
            MODEL_CONFIG_FILE,
        )
        return "qwen2"
    config = _read_json(path)
    if not isinstance(config, dict):
        raise TokenizerError(f"{path}: expected a JSON object")
    raw_version = config.get("transformers_version")
    model_type = config.get("model_type")
    if raw_version:
        if not isinstance(raw_version, str):
            raise TokenizerError(f"{path}: transformers_version {raw_version!r} is not a string")
        try:
            version = Version(raw_version)
        except InvalidVersion:
            raise TokenizerError(
                f"{path}: transformers_version {raw_version!r} is not a valid version"
            ) from None
        if version <= _FIX_LAST_UNAFFECTED:
            if model_type is not None and model_type not in _MISTRAL_MODEL_TYPES:
                return "qwen2"
        elif version >= _FIX_FIRST_FIXED:
            return "qwen2"
    return "fixed_mistral"


def _pattern(kind: str) -> str:
    return FIXED_MISTRAL_PATTERN if kind == "fixed_mistral" else QWEN2_PATTERN


class TextTokenizer:
    """The Qwen2 byte-level BPE tokenizer of a Qwen3-TTS checkpoint, as the official code runs it.

    Build it with :meth:`from_dir`. Encoding is thread-safe and needs no transformers.
    Special-token strings typed inside the text (a literal ``"<|im_end|>"``) become their special
    ids, as in the official pipeline, unless the config sets ``split_special_tokens``
    (Qwen3-TTS: false); stripping or escaping them is a policy of the caller.
    """

    def __init__(
        self,
        vocab: Mapping[str, int],
        merges: Sequence[tuple[str, str]],
        added_tokens: Iterable[tuple[int, AddedToken]],
        *,
        pre_tokenizer: Literal["qwen2", "fixed_mistral"],
        special_tokens: Iterable[str] = (),
        split_special_tokens: bool = False,
        source: str = "tokenizer",
    ) -> None:
        """Assemble the tokenizer; ``source`` names where the data came from, for error messages.

        ``added_tokens`` are (expected id, token) pairs; they must be contiguous from the end of
        the vocabulary (or already in it), as in real checkpoints, because that is how the
        official loader numbers them: any other layout would silently give wrong ids, so it is
        refused. ``special_tokens`` not among them are appended as transformers appends them.
        """
        if pre_tokenizer not in ("qwen2", "fixed_mistral"):
            raise ValueError(f"unknown pre_tokenizer {pre_tokenizer!r}")
        self.pre_tokenizer: Literal["qwen2", "fixed_mistral"] = pre_tokenizer
        # NFC, then byte-level BPE without dropout, unk or byte fallback: what transformers'
        # Qwen2Converter builds Qwen2TokenizerFast from these files with.
        try:
            model = BPE(
                vocab=dict(vocab),
                merges=list(merges),
                dropout=None,
                unk_token=None,
                continuing_subword_prefix="",
                end_of_word_suffix="",
                fuse_unk=False,
                byte_fallback=False,
            )
        except Exception as exc:  # tokenizers raises a bare Exception for unknown merge tokens
            raise TokenizerError(f"{source}: vocabulary and merges do not match: {exc}") from exc
        tok = Tokenizer(model)
        self._normalizer = normalizers.NFC()
        self._split = pre_tokenizers.Split(Regex(_pattern(pre_tokenizer)), behavior="isolated")
        tok.normalizer = self._normalizer
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [self._split, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        tok.decoder = decoders.ByteLevel()

        # The added tokens at their ids with their flags, then the special tokens the config names
        # that are not among them, as transformers adds them.
        added = list(added_tokens)
        for expected, token in added:
            tok.add_tokens([token])
            got = tok.token_to_id(token.content)
            if got != expected:
                raise TokenizerError(
                    f"{source}: added token {token.content!r} is declared with id {expected} but "
                    f"the official loader would give it id {got} (added tokens must follow the "
                    "vocabulary without gaps)"
                )
        known = {token.content for _, token in added}
        for content in special_tokens:
            if content not in known:
                known.add(content)
                logger.info(
                    "%s: special token %r is not an added token: adding it", source, content
                )
                tok.add_tokens([AddedToken(content, special=True, normalized=False)])
        tok.encode_special_tokens = split_special_tokens

        for content in (IM_START, IM_END):
            if tok.token_to_id(content) is None or content not in known:
                raise TokenizerError(f"{source}: no added token {content!r} for the TTS prompt")
        self._tokenizer = tok
        self.vocab_size = tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_dir(cls, model_dir: Path | str, pre_tokenizer: PreTokenizer = "auto") -> TextTokenizer:
        """Load the tokenizer files of a checkpoint folder (or of a converted model folder).

        ``pre_tokenizer="auto"`` picks the regex the official pipeline picks for this folder
        (:func:`official_pre_tokenizer`, from its ``config.json``); ``"qwen2"`` and
        ``"fixed_mistral"`` force one. Raises :class:`TokenizerError` naming the bad file.
        """
        if pre_tokenizer not in _PRE_TOKENIZERS:
            expected = ", ".join(_PRE_TOKENIZERS)
            raise ValueError(f"unknown pre_tokenizer {pre_tokenizer!r}; expected one of {expected}")
        model_dir = Path(model_dir)
        if not model_dir.is_dir():
            raise TokenizerError(f"{model_dir}: not a directory")
        vocab = _load_vocab(model_dir / VOCAB_FILE)
        merges = _load_merges(model_dir / MERGES_FILE)
        config_path = model_dir / TOKENIZER_CONFIG_FILE
        added, specials, split = _load_added_tokens(config_path)
        if (model_dir / "tokenizer.json").exists():
            logger.warning(
                "%s: tokenizer.json is ignored; using %s and %s",
                model_dir,
                VOCAB_FILE,
                MERGES_FILE,
            )
        kind: Literal["qwen2", "fixed_mistral"]
        if pre_tokenizer == "auto":
            kind = official_pre_tokenizer(model_dir, len(vocab))
        else:
            kind = pre_tokenizer
        logger.debug("%s: pre-tokenizer regex %s", model_dir, kind)
        return cls(
            vocab,
            merges,
            added,
            pre_tokenizer=kind,
            special_tokens=specials,
            split_special_tokens=split,
            source=f"{model_dir} ({VOCAB_FILE}, {MERGES_FILE}, {TOKENIZER_CONFIG_FILE})",
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special-token strings in it map to their ids (see the class)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def prompt_ids(self, text: str) -> list[int]:
        """Token ids of the official assistant prompt around ``text``.

        The prompt is ``Qwen3TTSModel._build_assistant_text``'s (qwen-tts 0.1.1); the talker takes
        the role tokens as ``[:3]`` and the text as ``[3:-5]``. The whole prompt string is
        tokenized, as the official code does, rather than ``text`` alone between fixed ids: the
        line break after ``assistant`` pre-tokenizes together with
        leading whitespace of ``text`` that contains a line break (``"\\n\\nHi"``), which then
        changes the third id. Otherwise ``prompt_ids(t)[3:-5] == encode(t)``.
        """
        return self.encode(f"{IM_START}assistant\n{text}{IM_END}\n{IM_START}assistant\n")

    def reference_ids(self, text: str) -> list[int]:
        """Token ids of the transcript turn of an in-context clone, as the official code
        tokenizes a reference text: ``<|im_start|>assistant\n{text}<|im_end|>\n``."""
        return self.encode(f"{IM_START}assistant\n{text}{IM_END}\n")

    def instruction_ids(self, text: str) -> list[int]:
        """Token ids of an instruction turn (a CustomVoice style, a VoiceDesign description):
        ``<|im_start|>user\n{text}<|im_end|>\n``."""
        return self.encode(f"{IM_START}user\n{text}{IM_END}\n")

    def pre_tokenize(self, text: str) -> list[str]:
        """The pieces the split regex cuts ``text`` into (after NFC), for diagnostics and tests."""
        normalized = self._normalizer.normalize_str(text)
        return [piece for piece, _ in self._split.pre_tokenize_str(normalized)]

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``, special tokens included (for logging and debugging)."""
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_to_id(self, token: str) -> int | None:
        """The id of a vocabulary or added token, or None."""
        result = self._tokenizer.token_to_id(token)
        return None if result is None else int(result)
