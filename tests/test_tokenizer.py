"""TextTokenizer gives the ids of the official pipeline (qwen-tts 0.1.1 on transformers 4.57.3).

The reference is transformers' tokenizer loaded the way qwen-tts loads it:
``AutoProcessor.from_pretrained(path, fix_mistral_regex=True)`` builds a ``Qwen3TTSProcessor``
whose tokenizer is ``Qwen2TokenizerFast.from_pretrained(path, fix_mistral_regex=True)`` (the
processor forwards its kwargs), called on the prompt with ``padding=True, padding_side="left"``.
qwen_tts itself needs torch, so the tokenizer is loaded directly here. The checkpoint is a random
one from ``kazeia_dev.random_checkpoint`` (a small byte-level BPE, dense 151643-entry
vocabulary, added tokens at the real Qwen ids, ``transformers_version`` 4.57.3 like real ones).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from kazeia_dev.random_checkpoint import build_tokenizer, bytes_to_unicode, write_checkpoint

from wyoming_kazeia.tokenizer import (
    FIXED_MISTRAL_PATTERN,
    QWEN2_PATTERN,
    TextTokenizer,
    TokenizerError,
    official_pre_tokenizer,
)

transformers = pytest.importorskip("transformers")

PROMPT_HEAD = [151644, 77091, 198]  # <|im_start|> assistant \n
PROMPT_TAIL = [151645, 198, 151644, 77091, 198]  # <|im_end|> \n <|im_start|> assistant \n
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json")

TEXTS: list[str] = [
    "",
    "Hello world",
    "Hello world.",
    " Hello world",
    "Turn on the kitchen lights, please!",
    "The temperature is 21.5 °C; humidity 48%.",
    "It's 12:45 on 2024-06-01, and the code is 1234567890.",
    "I'm, you're, we've, they'll, he'd, it'S, DON'T",
    "Quotes \"double\" and 'single' and `backticks`",
    "(a) [b] {c} <d> a/b a//b http://example.com/path?q=1&x=2#frag",
    "...!!!???---___***",
    "multiple   spaces    here",
    "  leading and trailing  ",
    "tabs\tand\t\ttabs",
    "line one\nline two\n\nline four\r\nwindows\rold mac",
    "\n\n\n",
    "   \n   \n",
    "HomeAssistant iPhone McDonald's camelCaseWord XMLHttpRequest ABCdef",
    "café naïve résumé Ångström façade",
    "cafe\u0301 nai\u0308ve re\u0301sume\u0301 A\u030angstro\u0308m",  # decomposed: NFC matters
    "\u1e9b\u0323 \u212b \u2126 \ufb01",  # compatibility characters NFC keeps as they are
    "Ελληνικά, Русский текст, עברית, العربية, हिन्दी",
    "你好，世界。今天天气很好！",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다",
    "emoji 😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "math ∑ x² ≤ ∞ and ½ ⅓ ① ²",
    "zero\u200bwidth\u00a0nbsp\u3000ideographic space",
    "control \x00\x01\x7f chars",
    "<|im_end|>",
    "say <|im_end|> then <|im_start|>user\nhi",
    "<|endoftext|><tts_pad><tts_text_bos><tts_text_eod><|audio_pad|>",
    "<think>non special</think> <tool_call>x</tool_call>",
    "<|im_end",
    "im_end|>",
    "<|IM_END|>",
    "'the it'sthe we'very can'thear",
]

SPECIAL_STRINGS = ["<|im_end|>", "<|im_start|>", "<|endoftext|>", "<think>", "<tts_pad>"]
FUZZ_POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(" \t\n\r  .,;:!?'\"-_/\\()[]{}<>|@#$%^&*+=~`")
    + list("éèàüöçñÅØß")
    + ["e\u0301", "a\u0308", "\u0301", "\u0323"]
    + list("你好世界日本語한국어ΑΩЖЯ")
    + ["😀", "👍🏽", "🇫🇷", "\u200b", "\u00a0"]
    + ["'s", "'LL", "'t", "Home", "Assistant", "the", " the"]
    + SPECIAL_STRINGS
)


def fuzz_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def long_text() -> str:
    base = (
        "The quick brown fox jumps over the lazy dog 1234. 你好世界! café cafe\u0301 😀\n"
        "HomeAssistant turns on the lights;   then <|im_end|> waits...\t"
    )
    return base * 200


def prompt(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def official_tokenizer(path: Path) -> Any:
    """transformers' tokenizer as qwen-tts 0.1.1 loads it (see the comment above _FIX_MIN_VOCAB
    in tokenizer.py)."""
    return transformers.Qwen2TokenizerFast.from_pretrained(str(path), fix_mistral_regex=True)


def official_ids(tok: Any, text: str) -> list[int]:
    """What Qwen3TTSProcessor.__call__ returns for one text (its defaults plus padding=True)."""
    return list(tok([text], padding=True, padding_side="left")["input_ids"][0])


def official_regex(tok: Any) -> str:
    """The split regex transformers ended up with."""
    state = json.loads(tok.backend_tokenizer.pre_tokenizer.__getstate__())
    return str(state["pretokenizers"][0]["pattern"]["Regex"])


def copy_tokenizer(src: Path, dst: Path, config: dict[str, Any] | None) -> Path:
    """The tokenizer files of ``src`` in ``dst``, with ``config`` as config.json (None: none)."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dst / name)
    if config is not None:
        (dst / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return dst


def edit_json(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(changes)
    path.write_text(json.dumps(data), encoding="utf-8")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("tok") / "ckpt", "tiny")


@pytest.fixture(scope="module")
def ours(checkpoint: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(checkpoint)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> Any:
    return official_tokenizer(checkpoint)


@pytest.fixture(scope="module")
def qwen2_dir(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tokenizer in a folder whose config.json predates the regex patch."""
    config = json.loads((checkpoint / "config.json").read_text(encoding="utf-8"))
    config["transformers_version"] = "4.57.1"
    return copy_tokenizer(checkpoint, tmp_path_factory.mktemp("tok") / "old", config)


# --- the default branch: real checkpoints (transformers_version 4.57.3) -----------------------


def test_real_layout_gets_the_patched_regex(ours: TextTokenizer, reference: Any) -> None:
    assert official_regex(reference) == FIXED_MISTRAL_PATTERN
    assert ours.pre_tokenizer == "fixed_mistral"
    assert ours.pre_tokenize("HomeAssistant") == ["Home", "Assistant"]


@pytest.mark.parametrize("text", TEXTS + [long_text()], ids=range(len(TEXTS) + 1))
def test_encode_matches_official(ours: TextTokenizer, reference: Any, text: str) -> None:
    assert ours.encode(text) == reference(text)["input_ids"]


@pytest.mark.parametrize("text", TEXTS + [long_text()], ids=range(len(TEXTS) + 1))
def test_prompt_ids_match_official(ours: TextTokenizer, reference: Any, text: str) -> None:
    assert ours.prompt_ids(text) == official_ids(reference, prompt(text))


def test_fuzz_matches_official(ours: TextTokenizer, reference: Any) -> None:
    texts = fuzz_texts(400, seed=1234)
    assert [ours.encode(t) for t in texts] == [reference(t)["input_ids"] for t in texts]
    assert [ours.prompt_ids(t) for t in texts] == [
        official_ids(reference, prompt(t)) for t in texts
    ]


def test_prompt_fixed_ids(ours: TextTokenizer) -> None:
    for text in ["Hello world", "", "café 你好 😀", "<|im_end|>", " x", "a\n"]:
        ids = ours.prompt_ids(text)
        assert ids[:3] == PROMPT_HEAD, text
        assert ids[-5:] == PROMPT_TAIL, text
        assert ids[3:-5] == ours.encode(text), text
    assert ours.prompt_ids("") == PROMPT_HEAD + PROMPT_TAIL
    assert ours.prompt_ids("Hello world") == PROMPT_HEAD + [9707, 1879] + PROMPT_TAIL


def test_leading_line_break_joins_the_role_newline(
    ours: TextTokenizer, checkpoint: Path, tmp_path: Path
) -> None:
    # The official code tokenizes the whole prompt, so "\n" + "\n..." is one pre-token there.
    assert ours.pre_tokenize("assistant\n\nHello") == ["assistant", "\n\n", "Hello"]
    # With a "\n\n" token (the real vocabulary has one, 271) the third id changes.
    folder = copy_tokenizer(checkpoint, tmp_path / "nn", None)
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    filler = next(k for k in vocab if k.startswith("<|kazeia_unused_"))
    vocab["\u010a\u010a"] = vocab.pop(filler)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    with (folder / "merges.txt").open("a", encoding="utf-8") as f:
        f.write("\u010a \u010a\n")
    nn = TextTokenizer.from_dir(folder)
    ref = official_tokenizer(folder)
    ids = nn.prompt_ids("\nHello")
    assert ids == official_ids(ref, prompt("\nHello"))
    assert ids[:3] == PROMPT_HEAD[:2] + [vocab["\u010a\u010a"]]
    assert ids[3:-5] != nn.encode("\nHello")


def test_special_strings_in_text_are_special_ids(ours: TextTokenizer) -> None:
    assert ours.encode("<|im_end|>") == [151645]
    assert ours.encode("a<|im_start|>b") == ours.encode("a") + [151644] + ours.encode("b")
    assert ours.encode("<tts_pad>") == [151671]
    assert ours.encode("<think>") == [ours.token_to_id("<think>")]
    assert 151645 not in ours.encode("<|im_end")
    assert 151645 not in ours.encode("<|IM_END|>")


def test_nfc_and_digits(ours: TextTokenizer) -> None:
    assert ours.encode("cafe\u0301") == ours.encode("café")
    assert ours.encode("2024") == [ours.token_to_id(d) for d in "2024"]


def test_decode_round_trip(ours: TextTokenizer) -> None:
    text = "Hello world, café 你好 😀 <|im_end|>"
    assert ours.decode(ours.encode(text)) == text


# --- the other branch and the rule ---------------------------------------------------------------


def test_qwen2_branch_matches_official(qwen2_dir: Path) -> None:
    ours = TextTokenizer.from_dir(qwen2_dir)
    ref = official_tokenizer(qwen2_dir)
    assert official_regex(ref) == QWEN2_PATTERN
    assert ours.pre_tokenizer == "qwen2"
    assert ours.pre_tokenize("HomeAssistant") == ["HomeAssistant"]
    texts = TEXTS + fuzz_texts(200, seed=99)
    assert [ours.encode(t) for t in texts] == [ref(t)["input_ids"] for t in texts]
    assert [ours.prompt_ids(t) for t in texts] == [official_ids(ref, prompt(t)) for t in texts]


def test_branches_differ(ours: TextTokenizer, qwen2_dir: Path) -> None:
    qwen2 = TextTokenizer.from_dir(qwen2_dir)
    assert ours.pre_tokenize("it'sthe") == ["it", "'sthe"]
    assert qwen2.pre_tokenize("it'sthe") == ["it", "'s", "the"]
    for text in ["'the", "it'sthe", "we'very"]:
        assert ours.encode(text) != qwen2.encode(text), text


def test_forced_regex(checkpoint: Path, qwen2_dir: Path) -> None:
    texts = TEXTS + fuzz_texts(100, seed=5)
    forced_qwen2 = TextTokenizer.from_dir(checkpoint, pre_tokenizer="qwen2")
    auto_qwen2 = TextTokenizer.from_dir(qwen2_dir)
    assert [forced_qwen2.encode(t) for t in texts] == [auto_qwen2.encode(t) for t in texts]
    # transformers without fix_mistral_regex only warns and keeps the Qwen2 regex.
    plain = transformers.Qwen2TokenizerFast.from_pretrained(str(checkpoint))
    assert official_regex(plain) == QWEN2_PATTERN
    assert [forced_qwen2.encode(t) for t in texts] == [plain(t)["input_ids"] for t in texts]
    forced_fixed = TextTokenizer.from_dir(qwen2_dir, pre_tokenizer="fixed_mistral")
    auto_fixed = TextTokenizer.from_dir(checkpoint)
    assert [forced_fixed.encode(t) for t in texts] == [auto_fixed.encode(t) for t in texts]
    with pytest.raises(ValueError, match="pre_tokenizer"):
        TextTokenizer.from_dir(checkpoint, pre_tokenizer="gpt2")  # type: ignore[arg-type]


RULE_CASES: list[tuple[str, dict[str, Any] | None, str]] = [
    ("no-config", None, "qwen2"),
    ("4.57.3", {"model_type": "qwen3_tts", "transformers_version": "4.57.3"}, "fixed_mistral"),
    (
        "4.58.dev",
        {"model_type": "qwen3_tts", "transformers_version": "4.58.0.dev0"},
        "fixed_mistral",
    ),
    ("4.57.2", {"model_type": "qwen3_tts", "transformers_version": "4.57.2"}, "qwen2"),
    ("4.40-no-type", {"transformers_version": "4.40.0"}, "fixed_mistral"),
    ("4.40-mistral", {"model_type": "mistral", "transformers_version": "4.40.0"}, "fixed_mistral"),
    ("no-version", {"model_type": "qwen3_tts"}, "fixed_mistral"),
    ("empty-version", {"model_type": "qwen3_tts", "transformers_version": ""}, "fixed_mistral"),
    ("5.0.0", {"model_type": "qwen3_tts", "transformers_version": "5.0.0"}, "qwen2"),
    ("5.0.0rc1", {"model_type": "qwen3_tts", "transformers_version": "5.0.0rc1"}, "fixed_mistral"),
]


@pytest.mark.parametrize(
    ("config", "expected"), [c[1:] for c in RULE_CASES], ids=[c[0] for c in RULE_CASES]
)
def test_rule_follows_transformers(
    checkpoint: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    config: dict[str, Any] | None,
    expected: str,
) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "tok", config)
    ref = official_tokenizer(folder)
    regex = {"qwen2": QWEN2_PATTERN, "fixed_mistral": FIXED_MISTRAL_PATTERN}[expected]
    assert official_regex(ref) == regex
    assert official_pre_tokenizer(folder, 151643) == expected
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="wyoming_kazeia.tokenizer"):
        ours = TextTokenizer.from_dir(folder)
    # A folder without config.json (e.g. tokenizer files copied on their own) is flagged.
    assert ("has no config.json" in caplog.text) == (config is None)
    assert ours.pre_tokenizer == expected
    for text in ["'the it'sthe", "HomeAssistant", "x <|im_end|> y"]:
        assert ours.prompt_ids(text) == official_ids(ref, prompt(text))


def small_vocab_dir(folder: Path) -> Path:
    """A dense vocabulary of only the byte tokens and the merges (well under 100000 entries)."""
    _, merges, tok_config = build_tokenizer()
    vocab: dict[str, int] = {}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    added = sorted(tok_config["added_tokens_decoder"].items(), key=lambda kv: int(kv[0]))
    tok_config["added_tokens_decoder"] = {
        str(len(vocab) + i): entry for i, (_, entry) in enumerate(added)
    }
    folder.mkdir(parents=True)
    (folder / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    (folder / "merges.txt").write_text(
        "#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_config), encoding="utf-8")
    (folder / "config.json").write_text(
        json.dumps({"model_type": "qwen3_tts", "transformers_version": "4.57.3"}), encoding="utf-8"
    )
    return folder


def test_small_vocabulary_is_never_patched(tmp_path: Path) -> None:
    folder = small_vocab_dir(tmp_path / "small")
    ref = official_tokenizer(folder)
    assert official_regex(ref) == QWEN2_PATTERN
    ours = TextTokenizer.from_dir(folder)
    assert ours.pre_tokenizer == "qwen2"
    texts = TEXTS + fuzz_texts(100, seed=7)
    assert [ours.prompt_ids(t) for t in texts] == [official_ids(ref, prompt(t)) for t in texts]


# --- tokenizer_config.json options ---------------------------------------------------------------


def test_split_special_tokens_is_honoured(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "split", None)
    edit_json(folder / "tokenizer_config.json", split_special_tokens=True)
    ours = TextTokenizer.from_dir(folder)
    ref = official_tokenizer(folder)
    texts = ["say <|im_end|> now", "<tts_pad><think>x</think>", "<|endoftext|>"]
    assert [ours.encode(t) for t in texts] == [ref(t)["input_ids"] for t in texts]
    assert 151645 not in ours.encode("say <|im_end|> now")


def test_extra_special_token_is_added_like_transformers(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "extra", None)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    edit_json(
        folder / "tokenizer_config.json",
        additional_special_tokens=config["additional_special_tokens"] + ["<|kazeia_extra|>"],
    )
    ours = TextTokenizer.from_dir(folder)
    ref = official_tokenizer(folder)
    text = "a<|kazeia_extra|>b <|im_end|>"
    assert ours.encode(text) == ref(text)["input_ids"]
    assert ours.token_to_id("<|kazeia_extra|>") == ref.convert_tokens_to_ids("<|kazeia_extra|>")


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", TOKENIZER_FILES)
def test_missing_file_is_named(checkpoint: Path, tmp_path: Path, name: str) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "m", None)
    (folder / name).unlink()
    with pytest.raises(TokenizerError, match=name):
        TextTokenizer.from_dir(folder)


@pytest.mark.parametrize("name", ["vocab.json", "tokenizer_config.json"])
def test_corrupt_json_is_named(checkpoint: Path, tmp_path: Path, name: str) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "c", None)
    text = (folder / name).read_text(encoding="utf-8")
    (folder / name).write_text(text[: len(text) // 2], encoding="utf-8")
    with pytest.raises(TokenizerError, match=name):
        TextTokenizer.from_dir(folder)


def test_bad_merges(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "b", None)
    merges = folder / "merges.txt"
    good = merges.read_text(encoding="utf-8")
    merges.write_text(good + "a b c\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"merges\.txt.*not a merge pair"):
        TextTokenizer.from_dir(folder)
    merges.write_text(good + "\u4e00 \u4e01\n", encoding="utf-8")  # tokens not in vocab.json
    with pytest.raises(TokenizerError, match=r"merges\.txt"):
        TextTokenizer.from_dir(folder)


def test_bad_added_tokens(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "a", None)
    path = folder / "tokenizer_config.json"
    original = json.loads(path.read_text(encoding="utf-8"))
    decoder = dict(original["added_tokens_decoder"])

    gap = {str(int(k) + 1 if int(k) >= 151644 else int(k)): v for k, v in decoder.items()}
    edit_json(path, added_tokens_decoder=gap)
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json.*151645"):
        TextTokenizer.from_dir(folder)

    no_im = {k: v for k, v in decoder.items() if v["content"] != "<|im_start|>"}
    no_im = {str(151643 + i): v for i, (_, v) in enumerate(sorted(no_im.items()))}
    extra = [t for t in original["additional_special_tokens"] if t != "<|im_start|>"]
    edit_json(path, added_tokens_decoder=no_im, additional_special_tokens=extra)
    with pytest.raises(TokenizerError, match="im_start"):
        TextTokenizer.from_dir(folder)

    edit_json(path, added_tokens_decoder={"x": {"content": "<|im_start|>"}})
    with pytest.raises(TokenizerError, match="tokenizer_config.json"):
        TextTokenizer.from_dir(folder)


def test_bad_config_version(checkpoint: Path, tmp_path: Path) -> None:
    folder = copy_tokenizer(checkpoint, tmp_path / "v", {"transformers_version": "not a version"})
    with pytest.raises(TokenizerError, match="config.json"):
        TextTokenizer.from_dir(folder)
    # A forced regex does not read config.json.
    assert TextTokenizer.from_dir(folder, pre_tokenizer="qwen2").pre_tokenizer == "qwen2"


def test_not_a_directory(tmp_path: Path) -> None:
    with pytest.raises(TokenizerError, match="not a directory"):
        TextTokenizer.from_dir(tmp_path / "missing")
