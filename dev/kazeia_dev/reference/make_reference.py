"""Regenerate reference outputs with the official Qwen3-TTS implementation.

Runs the official PyPI package ``qwen-tts`` (fp32, CPU) on a checkpoint in the Hugging Face
layout and writes the arrays the parity tests compare against (the same set, names, shapes and
dtypes as ``tests/.data/reference/*/ref``; ``manifest.json`` describes each one)::

    script/make-reference CHECKPOINT_DIR OUT_DIR \
        [--inputs DIR] [--parts decoder,talker,instruct,clone,design] [--compare REF_DIR]

Parts (default: by the checkpoint's ``tts_model_type``: CustomVoice decoder,talker (+instruct for
1.7B), Base clone, VoiceDesign design):
  decoder   the speech decoder (single forward, prefix, naive chunks, long, official decode)
  talker    CustomVoice generation in three prompt modes (stream, nonstream, auto_dialect)
  instruct  CustomVoice with a style instruction (``generate`` with ``instruct_ids``)
  clone     Base: mel features, x-vector and speech-tokenizer codes of a reference recording
            (24 kHz, and a 16 kHz copy that goes through librosa's resampler), then
            ``generate_voice_clone`` in-context and x-vector-only, streaming and not, with the
            trimmed audio of the official wrapper
  design    VoiceDesign ``generate_voice_design`` (non-streaming, its default, and streaming)

Inputs (``input_ids``, ``instruct_ids``, ``dec_codes``, ``dec_codes_long``,
``fixed_talker_inputs_embeds``, ``ref_audio``, ``ref_audio_16k``) are read from ``--inputs DIR``
when given (normally an existing ``ref/`` folder, so that the outputs are comparable), otherwise
made here (``--seed``). They are written to OUT_DIR too. The clone and design parts tokenize
fixed texts (VOICE_TEXTS) with the checkpoint's own tokenizer through the official wrapper
(``Qwen3TTSModel``) and record the ids.

Needs the optional extra ``reference`` (qwen-tts 0.1.1, transformers 4.57.3, torch); torch and
qwen_tts are imported only inside functions so that the project never needs them at run time.
``import qwen_tts`` pulls torchaudio: where its binary does not load beside the installed torch,
install torchaudio with ``--no-deps`` and move its ``lib/*.so`` aside (it falls back to Python).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HOP = 1920  # samples per 12.5 Hz frame at 24 kHz
MAX_NEW_TOKENS = 24  # -> 24 talker calls and 23 frames (the last sampled c0 is dropped)
CP_LOGIT_FRAMES = 6
PREFIX_FRAMES = 40
NAIVE_CHUNK = 10
DEC_FRAMES = 120
DEC_FRAMES_LONG = 310
FIXED_TALKER_LEN = 12

# The inputs of each part (read from --inputs, or made here).
PART_INPUTS: dict[str, tuple[str, ...]] = {
    "decoder": ("dec_codes", "dec_codes_long"),
    "talker": ("input_ids", "fixed_talker_inputs_embeds"),
    "instruct": ("input_ids", "instruct_ids"),
    "clone": ("ref_audio", "ref_audio_16k", "ref_audio_odd"),
    "design": (),
}
PARTS_BY_KIND = {"custom_voice": "decoder,talker", "base": "clone", "voice_design": "design"}
INPUT_NAMES = tuple(dict.fromkeys(n for names in PART_INPUTS.values() for n in names))

# The texts of the voice parts, tokenized by the checkpoint's tokenizer (clone, design).
VOICE_TEXTS = {
    "text": "Hello world, this is a test of my voice.",
    "ref_text": "Hello world, I am here.",
    "design": "A warm, low voice, speaking slowly.",
}
# `<|im_start|>user\n{instruct}<|im_end|>\n` for the instruct part (real Qwen2 ids of the role
# tokens; the instruction's own ids are arbitrary: the tiny CustomVoice checkpoints carry no
# tokenizer).
DEFAULT_INSTRUCT_IDS = [151644, 872, 198, 8206, 279, 1273, 13, 151645, 198]
# The 24 kHz recording is short (15 frames: its in-context prompt is shorter than the text, so
# text trails it), the 16 kHz one long (33 frames: the text is padded under the prompt).
REF_AUDIO_SECONDS = 1.2
REF_AUDIO_16K_SECONDS = 2.6
REF_AUDIO_RATE_16K = 16000
# A length that no stride divides (the encoders' padding rules for partial windows).
REF_AUDIO_ODD_SAMPLES = 32881

# The assistant prompt of an English sentence, tokenized with the Qwen2 BPE tokenizer (used when
# no --inputs folder is given; the checkpoints carry no tokenizer files).
DEFAULT_INPUT_IDS = [
    151644, 77091, 198, 9707, 11, 1879, 0, 1096, 374, 264, 1273, 315, 279, 1207, 16948, 18,
    350, 9951, 4712, 13, 151645, 198, 151644, 77091, 198,
]  # fmt: skip

# name -> (language, speaker, non_streaming_mode)
MODES: dict[str, tuple[str, str, bool]] = {
    "stream": ("english", "vivian", False),
    "nonstream": ("english", "vivian", True),
    "auto_dialect": ("auto", "dylan", False),
}

GENERATE_KWARGS = dict(
    do_sample=False,
    subtalker_dosample=False,
    repetition_penalty=1.0,
    max_new_tokens=MAX_NEW_TOKENS,
)
GENERATE_NOTE = (
    "do_sample=False, subtalker_dosample=False, repetition_penalty=1.0, max_new_tokens=24 "
    "(min_new_tokens=2 and suppress_tokens=[2048..3071] minus EOS 2150 are always applied by "
    "the official generate)"
)


def _describe(name: str) -> str:
    """The manifest description of array ``name``."""
    fixed = {
        "input_ids": "text token ids of the assistant prompt (first 3 = role, last 5 = im_end \\n "
        "im_start assistant \\n)",
        "fixed_talker_inputs_embeds": "random inputs_embeds for a single no-cache talker forward "
        f"(positions 0..{FIXED_TALKER_LEN - 1})",
        "fixed_talker_logits": "codec_head logits for fixed_talker_inputs_embeds, all positions",
        "fixed_talker_hidden": "final-norm hidden at last position",
        "text_proj_of_input_ids": "text_projection(text_embedding(input_ids))",
        "dec_codes": f"random codes [16, T={DEC_FRAMES}] for decoder references",
        "dec_wav_full": "decoder(codes) in ONE forward (== official tokenizer decode() since "
        "T<=300)",
        "dec_wav_naive_chunks_K10": f"each {NAIVE_CHUNK}-frame chunk decoded independently with "
        "NO left context, concatenated (shows the error of naive chunking)",
        "dec_wav_prefix40": f"decode of the {PREFIX_FRAMES}-frame prefix alone (equals "
        f"dec_wav_full[:{PREFIX_FRAMES}*{HOP}] up to fp32 rounding: decoder is strictly causal)",
        "dec_codes_long": f"random codes [16, {DEC_FRAMES_LONG}]",
        "dec_wav_long_full": f"single-forward decode of the {DEC_FRAMES_LONG} frames",
        "dec_wav_long_official": "official Qwen3TTSTokenizerV2Model.decode(): chunked_decode("
        "chunk 300, left ctx 25) -> frames 300..309 differ from single forward",
        "stream_cp_logits_first6": f"raw code-predictor logits of the first {CP_LOGIT_FRAMES} "
        "frames, [frame, group-1, 2048]",
    }
    if name in fixed:
        return fixed[name]
    if name in _VOICE_DESCRIPTIONS:
        return _VOICE_DESCRIPTIONS[name]
    for mode, (language, speaker, non_streaming) in {**MODES, **_VOICE_MODES}.items():
        if not name.startswith(mode + "_"):
            continue
        what = name[len(mode) + 1 :]
        if what == "prefill_embeds":
            return (
                f"talker inputs_embeds of the prefill ({mode}: non_streaming={non_streaming}, "
                f"language={language}, speaker={speaker})"
            )
        if what == "step_embeds":
            return (
                "talker input embedding of every decode step (sum of 16 codec embeds + "
                "text/pad embed)"
            )
        if what == "talker_logits":
            return "raw codec_head logits at the last position of every talker call (prefill first)"
        if what == "codes":
            return "greedy codes [frames, 16] returned by the official generate() (trimmed at EOS)"
        if what == "talker_hidden":
            return (
                "talker final-norm hidden state at last position of every call (input to code "
                "predictor)"
            )
    return ""


# --------------------------------------------------------------------------- loading


def load_official(model_dir: Path, threads: int | None) -> Any:
    """Load the official model (talker + code predictor eager, speech tokenizer default) in fp32."""
    import torch
    from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
    from transformers import AutoConfig, AutoModel

    if threads:
        torch.set_num_threads(threads)
    AutoConfig.register("qwen3_tts", Qwen3TTSConfig, exist_ok=True)
    AutoModel.register(Qwen3TTSConfig, Qwen3TTSForConditionalGeneration, exist_ok=True)
    model = Qwen3TTSForConditionalGeneration.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    model.speech_tokenizer.model.eval()
    return model


def reference_audio(seconds: float, rate: int, seed: int) -> np.ndarray:
    """A voice-like test recording (float32 in [-1, 1]): a glottal-ish harmonic series with a
    gliding pitch, syllable-rate loudness and a little breath noise. Not speech, but it has what
    the feature extractors look at (pitch, formant-like spectral slope, pauses)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(round(seconds * rate))) / rate
    f0 = 120.0 + 25.0 * np.sin(2 * np.pi * 0.8 * t) + 10.0 * np.sin(2 * np.pi * 2.3 * t)
    phase = 2 * np.pi * np.cumsum(f0) / rate
    wav = sum(np.sin(k * phase) / k**1.2 for k in range(1, 30) if k * 160 < rate / 2)
    envelope = np.clip(np.sin(2 * np.pi * 3.1 * t) * 1.4, 0.0, 1.0) ** 0.7
    wav = 0.25 * wav * envelope + 0.01 * rng.standard_normal(t.size)
    return np.clip(wav, -1.0, 1.0).astype(np.float32)


def load_official_wrapper(model_dir: Path, threads: int | None) -> Any:
    """The official wrapper (``Qwen3TTSModel``: model + the checkpoint's text processor), fp32,
    talker and code predictor eager as in load_official."""
    import torch
    from qwen_tts import Qwen3TTSModel

    if threads:
        torch.set_num_threads(threads)
    wrapper = Qwen3TTSModel.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    wrapper.model.eval()
    wrapper.model.speech_tokenizer.model.eval()
    return wrapper


def make_inputs(
    inputs_dir: Path | None, seed: int, talker_hidden: int, parts: set[str]
) -> dict[str, np.ndarray]:
    """The input arrays of ``parts``: read from ``inputs_dir`` or made here."""
    names = [n for n in INPUT_NAMES if any(n in PART_INPUTS[p] for p in parts)]
    if inputs_dir is not None:
        out = {}
        for name in names:
            path = inputs_dir / f"{name}.npy"
            if not path.is_file():
                raise SystemExit(f"make_reference: missing input {path}")
            out[name] = np.load(path)
        embeds = out.get("fixed_talker_inputs_embeds")
        if embeds is not None and embeds.shape[-1] != talker_hidden:
            raise SystemExit(
                "make_reference: fixed_talker_inputs_embeds width "
                f"{embeds.shape[-1]} != talker hidden {talker_hidden}"
            )
        return out
    rng = np.random.default_rng(seed)
    made: dict[str, np.ndarray] = {
        "input_ids": np.asarray(DEFAULT_INPUT_IDS, dtype=np.int64),
        "instruct_ids": np.asarray(DEFAULT_INSTRUCT_IDS, dtype=np.int64),
        "dec_codes": rng.integers(0, 2048, size=(16, DEC_FRAMES), dtype=np.int64),
        "dec_codes_long": rng.integers(0, 2048, size=(16, DEC_FRAMES_LONG), dtype=np.int64),
        "fixed_talker_inputs_embeds": rng.standard_normal((FIXED_TALKER_LEN, talker_hidden)).astype(
            np.float32
        ),
        "ref_audio": reference_audio(REF_AUDIO_SECONDS, 24000, seed),
        "ref_audio_16k": reference_audio(REF_AUDIO_16K_SECONDS, REF_AUDIO_RATE_16K, seed + 1),
        "ref_audio_odd": reference_audio(REF_AUDIO_ODD_SAMPLES / 24000, 24000, seed + 2),
    }
    return {name: made[name] for name in names}


# --------------------------------------------------------------------------- decoder


def decoder_arrays(model: Any, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Speech-decoder references: single forward, prefix, naive chunks, long, official decode."""
    import torch

    tok = model.speech_tokenizer  # official Qwen3TTSTokenizer wrapper
    dec = tok.model.decoder

    def forward(codes: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            wav = dec(torch.from_numpy(np.ascontiguousarray(codes, dtype=np.int64))[None])
        return wav[0, 0].float().numpy().astype(np.float32)

    codes = inputs["dec_codes"]
    codes_long = inputs["dec_codes_long"]
    out: dict[str, np.ndarray] = {}
    out["dec_wav_full"] = forward(codes)
    out["dec_wav_prefix40"] = forward(codes[:, :PREFIX_FRAMES])
    out["dec_wav_naive_chunks_K10"] = np.concatenate(
        [forward(codes[:, k : k + NAIVE_CHUNK]) for k in range(0, codes.shape[1], NAIVE_CHUNK)]
    )
    out["dec_wav_long_full"] = forward(codes_long)
    # The official public path: Qwen3TTSTokenizer.decode() takes codes time-major [T, 16].
    wavs, sample_rate = tok.decode([{"audio_codes": codes_long.T.copy()}])
    if sample_rate != 24000:
        raise SystemExit(f"make_reference: unexpected sample rate {sample_rate}")
    out["dec_wav_long_official"] = np.asarray(wavs[0], dtype=np.float32)

    full, long_full, long_off = (
        out["dec_wav_full"],
        out["dec_wav_long_full"],
        out["dec_wav_long_official"],
    )
    n40 = PREFIX_FRAMES * HOP
    summary = {
        "wav_len": int(full.size),
        "rms": float(np.sqrt(np.mean(full.astype(np.float64) ** 2))),
        "clipped_frac": float(np.mean(np.abs(full) >= 1.0)),
        "fp32_maxdiff_prefix40_vs_full": _maxdiff(out["dec_wav_prefix40"], full[:n40]),
        "fp32_maxdiff_naiveK10_vs_full": _maxdiff(out["dec_wav_naive_chunks_K10"], full),
        "fp32_maxdiff_naiveK10_first_chunk": _maxdiff(
            out["dec_wav_naive_chunks_K10"][: NAIVE_CHUNK * HOP], full[: NAIVE_CHUNK * HOP]
        ),
        "fp32_long_official_vs_full_first300": _maxdiff(
            long_off[: 300 * HOP], long_full[: 300 * HOP]
        ),
        "fp32_long_official_vs_full_last10": _maxdiff(
            long_off[300 * HOP :], long_full[300 * HOP :]
        ),
    }
    return out, summary


# --------------------------------------------------------------------------- talker


class _Recorder:
    """Forward hooks on the official talker that capture what the parity tests need."""

    def __init__(self, model: Any) -> None:
        self.talker_inputs: list[Any] = []  # inputs_embeds of every talker call
        self.talker_hidden: list[Any] = []  # final-norm hidden, last position, every call
        self.talker_logits: list[Any] = []  # raw codec_head logits, last position, every call
        self.cp_logits: list[tuple[int, Any]] = []  # (group-1, raw lm_head logits) in call order
        talker = model.talker
        self._handles = [
            talker.model.register_forward_pre_hook(self._on_talker_model, with_kwargs=True),
            talker.codec_head.register_forward_hook(self._on_codec_head),
        ]
        for g, head in enumerate(talker.code_predictor.lm_head):
            self._handles.append(head.register_forward_hook(self._cp_hook(g)))

    def _on_talker_model(self, _module: Any, args: Any, kwargs: dict) -> None:
        embeds = kwargs.get("inputs_embeds")
        if embeds is None:
            raise RuntimeError("talker.model called without inputs_embeds")
        self.talker_inputs.append(embeds[0].detach().clone())

    def _on_codec_head(self, _module: Any, args: Any, output: Any) -> None:
        self.talker_hidden.append(args[0][0, -1].detach().clone())
        self.talker_logits.append(output[0, -1].detach().clone())

    def _cp_hook(self, g: int) -> Any:
        def hook(_module: Any, _args: Any, output: Any) -> None:
            self.cp_logits.append((g, output[0, -1].detach().clone()))

        return hook

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def _stack(tensors: list[Any]) -> np.ndarray:
    return np.stack([t.float().numpy() for t in tensors]).astype(np.float32)


def _margin(logits: np.ndarray) -> float:
    """Gap between the best and second-best logit (what greedy decoding depends on)."""
    top2 = np.sort(logits.astype(np.float64))[-2:]
    return float(top2[1] - top2[0])


def record_generation(
    model: Any, mode: str, run: Any
) -> tuple[dict[str, np.ndarray], dict[str, Any], Any]:
    """Run ``run()`` (an official generation, greedy) with the talker hooked; the arrays of
    ``mode`` (prefill and step embeds, raw logits, hidden states, codes), its summary (margins)
    and what ``run`` returned. ``run`` returns (codes [T, 16], anything)."""
    tcfg = model.config.talker_config
    rec = _Recorder(model)
    try:
        codes_tensor, result = run()
    finally:
        rec.close()

    calls = len(rec.talker_inputs)
    if calls != len(rec.talker_logits) or calls < 2:
        raise RuntimeError(f"{mode}: inconsistent talker hooks ({calls} calls)")
    if rec.talker_inputs[0].shape[0] < 2 or any(x.shape[0] != 1 for x in rec.talker_inputs[1:]):
        raise RuntimeError(f"{mode}: unexpected talker call shapes")
    groups = int(tcfg.num_code_groups) - 1
    if len(rec.cp_logits) != (calls - 1) * groups or any(
        g != i % groups for i, (g, _) in enumerate(rec.cp_logits)
    ):
        raise RuntimeError(f"{mode}: unexpected code-predictor call order")

    codes = codes_tensor.cpu().numpy().astype(np.int64)
    logits = _stack(rec.talker_logits)
    out = {
        f"{mode}_prefill_embeds": rec.talker_inputs[0].float().numpy().astype(np.float32),
        f"{mode}_step_embeds": np.concatenate(
            [x.float().numpy() for x in rec.talker_inputs[1:]]
        ).astype(np.float32),
        f"{mode}_talker_logits": logits,
        f"{mode}_codes": codes,
        f"{mode}_talker_hidden": _stack(rec.talker_hidden),
    }
    cp = _stack([t for _, t in rec.cp_logits]).reshape(calls - 1, groups, -1)
    if mode == "stream":
        out["stream_cp_logits_first6"] = cp[:CP_LOGIT_FRAMES]

    # Margins of the logits greedy decoding actually ranks: the official generate suppresses
    # 2048..vocab-1 except EOS, and min_new_tokens=2 masks EOS on the first two calls.
    eos = int(tcfg.codec_eos_token_id)
    vocab = int(tcfg.vocab_size)
    allowed = np.ones(vocab, dtype=bool)
    allowed[vocab - 1024 :] = False
    allowed[eos] = True
    margins, eos_hit = [], False
    for i, row in enumerate(logits):
        ok = allowed.copy()
        if i < 2:
            ok[eos] = False
        margins.append(_margin(row[ok]))
        eos_hit = eos_hit or int(np.argmax(np.where(ok, row, -np.inf))) == eos
    summary = {
        "frames": int(codes.shape[0]),
        "steps": calls,
        "prefill_len": int(rec.talker_inputs[0].shape[0]),
        "min_talker_margin": float(min(margins)),
        "min_cp_margin": float(min(_margin(row) for row in cp.reshape(-1, cp.shape[-1]))),
        "eos_hit": bool(eos_hit),
    }
    return out, summary, result


def generate_mode(
    model: Any, input_ids: np.ndarray, mode: str
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the official generate() greedily for one CustomVoice mode and record its internals."""
    import torch

    language, speaker, non_streaming = MODES[mode]

    def run() -> tuple[Any, None]:
        with torch.inference_mode():
            codes_list, _ = model.generate(
                input_ids=[torch.from_numpy(input_ids.astype(np.int64))[None]],
                languages=[language],
                speakers=[speaker],
                non_streaming_mode=non_streaming,
                **GENERATE_KWARGS,
            )
        return codes_list[0], None

    out, summary, _ = record_generation(model, mode, run)
    return out, summary


def talker_arrays(model: Any, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Text projection, one fixed no-cache talker forward, and the three generation modes."""
    import torch

    talker = model.talker
    ids = torch.from_numpy(inputs["input_ids"].astype(np.int64))[None]
    embeds = torch.from_numpy(inputs["fixed_talker_inputs_embeds"].astype(np.float32))[None]
    out: dict[str, np.ndarray] = {}
    with torch.inference_mode():
        proj = talker.text_projection(talker.get_text_embeddings()(ids))
        fixed = talker(inputs_embeds=embeds, use_cache=False)
    out["text_proj_of_input_ids"] = proj[0].float().numpy().astype(np.float32)
    out["fixed_talker_logits"] = fixed.logits[0].float().numpy().astype(np.float32)
    out["fixed_talker_hidden"] = fixed.past_hidden[0].float().numpy().astype(np.float32)

    summary: dict[str, Any] = {}
    for mode in MODES:
        arrays, summary[mode] = generate_mode(model, inputs["input_ids"], mode)
        out.update(arrays)
    return out, summary


# --------------------------------------------------------------------------- voices

# mode -> (language, voice, non_streaming_mode), as MODES (for the manifest's descriptions).
_VOICE_MODES: dict[str, tuple[str, str, bool]] = {
    "instruct": ("english", "vivian with instruct_ids", True),
    "clone_icl": ("english", "in-context clone (ref_codes, ref_ids, ref_xvector)", False),
    "clone_icl_nonstream": ("english", "in-context clone", True),
    "clone_icl_auto": ("auto", "in-context clone", False),
    "clone_icl_long": (
        "english",
        "in-context clone of ref_audio_16k (ref16k_codes, ref16k_xvector)",
        False,
    ),
    "clone_xvec": ("english", "x-vector-only clone (ref_xvector)", False),
    "clone_xvec_nonstream": ("english", "x-vector-only clone", True),
    "design": ("english", "VoiceDesign (design_ids)", True),
    "design_stream": ("english", "VoiceDesign (design_ids)", False),
}
_VOICE_DESCRIPTIONS = {
    "instruct_ids": "ids of '<|im_start|>user\\n{instruct}<|im_end|>\\n' (the instruct part)",
    "ref_audio": f"reference recording, float32 mono at 24 kHz ({REF_AUDIO_SECONDS} s, made by "
    "reference_audio())",
    "ref_audio_16k": f"another reference recording, float32 mono at 16 kHz "
    f"({REF_AUDIO_16K_SECONDS} s, resampled by the official code)",
    "ref_ids": "ids of '<|im_start|>assistant\\n{ref_text}<|im_end|>\\n' (the clone's transcript)",
    "design_ids": "ids of '<|im_start|>user\\n{description}<|im_end|>\\n' (VoiceDesign)",
    "ref_mel": "speaker-encoder input: log-mel features of ref_audio [frames, 128]",
    "ref_xvector": "speaker embedding (x-vector) of ref_audio [enc_dim]",
    "ref_latent": "speech-tokenizer encoder output before the RVQ (downsampled, 12.5 Hz) "
    "[frames, hidden]",
    "ref_codes": "speech-tokenizer codes of ref_audio [frames, 16]",
    "ref16k_resampled": "ref_audio_16k resampled to 24 kHz by librosa.resample (soxr_hq)",
    "ref16k_mel": "log-mel features of ref16k_resampled",
    "ref16k_xvector": "x-vector of ref_audio_16k",
    "ref16k_codes": "speech-tokenizer codes of ref_audio_16k",
    "ref_audio_odd": f"a 24 kHz recording of {REF_AUDIO_ODD_SAMPLES} samples (no stride divides "
    "it)",
    "refodd_xvector": "x-vector of ref_audio_odd",
    "refodd_latent": "speech-tokenizer encoder output of ref_audio_odd before the RVQ",
    "refodd_codes": "speech-tokenizer codes of ref_audio_odd",
    "clone_icl_wav": "generate_voice_clone() audio, in-context, streaming text: ref_codes ++ "
    "codes decoded, the reference part cut",
    "clone_xvec_wav": "generate_voice_clone() audio, x-vector only, streaming text",
}


@contextlib.contextmanager
def _codes_of_generate(model: Any) -> Iterator[list[Any]]:
    """Catches the codes the official ``model.generate`` returns inside a wrapper call."""
    seen: list[Any] = []
    original = model.generate

    def generate(*args: Any, **kwargs: Any) -> Any:
        codes_list, hidden = original(*args, **kwargs)
        seen.append(codes_list[0])
        return codes_list, hidden

    model.generate = generate
    try:
        yield seen
    finally:
        del model.generate  # back to the class method


def _wrapper_run(wrapper: Any, call: Any) -> Any:
    """A ``record_generation`` run of a wrapper call: (codes, wavs)."""
    import torch

    def run() -> tuple[Any, Any]:
        with torch.inference_mode(), _codes_of_generate(wrapper.model) as seen:
            wavs, rate = call()
        if len(seen) != 1 or rate != 24000:
            raise RuntimeError(f"unexpected wrapper call: {len(seen)} generations, {rate} Hz")
        return seen[0], wavs

    return run


def _token_ids(wrapper: Any, text: str) -> np.ndarray:
    return wrapper._tokenize_texts([text])[0][0].cpu().numpy().astype(np.int64)


def instruct_arrays(model: Any, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """CustomVoice with a style instruction: the official ``generate(instruct_ids=...)``, which
    ``generate_custom_voice(..., instruct=...)`` calls (non-streaming text, its default)."""
    import torch

    ids = torch.from_numpy(inputs["input_ids"].astype(np.int64))[None]
    instruct = torch.from_numpy(inputs["instruct_ids"].astype(np.int64))[None]

    def run() -> tuple[Any, None]:
        with torch.inference_mode():
            codes_list, _ = model.generate(
                input_ids=[ids],
                instruct_ids=[instruct],
                languages=["english"],
                speakers=["vivian"],
                non_streaming_mode=True,
                **GENERATE_KWARGS,
            )
        return codes_list[0], None

    out, summary, _ = record_generation(model, "instruct", run)
    return out, {"instruct": summary}


def clone_arrays(wrapper: Any, inputs: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """Base: the voice-clone prompt of two recordings (features, x-vector, codes), the
    encoders on a third of an odd length, and
    ``generate_voice_clone`` in both modes, both text modes."""
    import librosa
    import torch

    model = wrapper.model
    captured: dict[str, list[Any]] = {"mel": [], "latent": []}
    hooks = [
        model.speaker_encoder.register_forward_pre_hook(
            lambda _m, args: captured["mel"].append(args[0][0].detach().clone())
        ),
        model.speech_tokenizer.model.encoder.downsample.register_forward_hook(
            lambda _m, _a, output: captured["latent"].append(output[0].detach().clone())
        ),
    ]
    ref_text = VOICE_TEXTS["ref_text"]
    try:
        with torch.inference_mode():
            icl = wrapper.create_voice_clone_prompt(
                ref_audio=(inputs["ref_audio"], 24000), ref_text=ref_text
            )
            xvec = wrapper.create_voice_clone_prompt(
                ref_audio=(inputs["ref_audio"], 24000), x_vector_only_mode=True
            )
            icl16 = wrapper.create_voice_clone_prompt(
                ref_audio=(inputs["ref_audio_16k"], REF_AUDIO_RATE_16K), ref_text=ref_text
            )
            odd_codes = model.speech_tokenizer.encode(inputs["ref_audio_odd"], sr=24000)
            odd_xvector = model.extract_speaker_embedding(inputs["ref_audio_odd"], 24000)
    finally:
        for h in hooks:
            h.remove()
    if len(captured["mel"]) != 4 or len(captured["latent"]) != 4:
        raise RuntimeError("clone: unexpected feature extraction calls")
    if not torch.equal(icl[0].ref_spk_embedding, xvec[0].ref_spk_embedding):
        raise RuntimeError("clone: the x-vector of one recording differs between calls")

    def arr(t: Any) -> np.ndarray:
        return t.detach().float().cpu().numpy().astype(np.float32)

    out: dict[str, np.ndarray] = {
        "ref_ids": _token_ids(wrapper, wrapper._build_ref_text(ref_text)),
        "input_ids": _token_ids(wrapper, wrapper._build_assistant_text(VOICE_TEXTS["text"])),
        "ref_mel": arr(captured["mel"][0]),
        "ref_xvector": arr(icl[0].ref_spk_embedding),
        "ref_latent": arr(captured["latent"][0].T),
        "ref_codes": icl[0].ref_code.cpu().numpy().astype(np.int64),
        "ref16k_resampled": librosa.resample(
            y=inputs["ref_audio_16k"].astype(np.float32),
            orig_sr=REF_AUDIO_RATE_16K,
            target_sr=24000,
        ).astype(np.float32),
        "ref16k_mel": arr(captured["mel"][2]),
        "ref16k_xvector": arr(icl16[0].ref_spk_embedding),
        "ref16k_codes": icl16[0].ref_code.cpu().numpy().astype(np.int64),
        "refodd_xvector": arr(odd_xvector),
        "refodd_latent": arr(captured["latent"][3].T),
        "refodd_codes": odd_codes.audio_codes[0].cpu().numpy().astype(np.int64),
    }
    summary: dict[str, Any] = {
        "clone_prompt": {
            "ref_frames": int(out["ref_codes"].shape[0]),
            "mel_frames": int(out["ref_mel"].shape[0]),
            "ref16k_frames": int(out["ref16k_codes"].shape[0]),
        }
    }
    modes = {
        "clone_icl": (icl, "english", False),
        "clone_icl_nonstream": (icl, "english", True),
        "clone_icl_auto": (icl, "auto", False),
        "clone_icl_long": (icl16, "english", False),
        "clone_xvec": (xvec, "english", False),
        "clone_xvec_nonstream": (xvec, "english", True),
    }
    for mode, (items, language, non_streaming) in modes.items():
        call = functools.partial(
            wrapper.generate_voice_clone,
            text=VOICE_TEXTS["text"],
            language=language,
            voice_clone_prompt=items,
            non_streaming_mode=non_streaming,
            **GENERATE_KWARGS,
        )
        arrays, summary[mode], wavs = record_generation(model, mode, _wrapper_run(wrapper, call))
        out.update(arrays)
        if mode in ("clone_icl", "clone_xvec"):
            out[f"{mode}_wav"] = np.asarray(wavs[0], dtype=np.float32)
    return out, summary


def design_arrays(wrapper: Any) -> tuple[dict, dict]:
    """VoiceDesign: ``generate_voice_design`` with a description, both text modes."""
    description = VOICE_TEXTS["design"]
    out: dict[str, np.ndarray] = {
        "input_ids": _token_ids(wrapper, wrapper._build_assistant_text(VOICE_TEXTS["text"])),
        "design_ids": _token_ids(wrapper, wrapper._build_instruct_text(description)),
    }
    summary: dict[str, Any] = {}
    for mode, non_streaming in (("design", True), ("design_stream", False)):
        call = functools.partial(
            wrapper.generate_voice_design,
            text=VOICE_TEXTS["text"],
            instruct=description,
            language="english",
            non_streaming_mode=non_streaming,
            **GENERATE_KWARGS,
        )
        arrays, summary[mode], _ = record_generation(
            wrapper.model, mode, _wrapper_run(wrapper, call)
        )
        out.update(arrays)
    return out, summary


# --------------------------------------------------------------------------- output


def _maxdiff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0


def write_outputs(
    out_dir: Path, arrays: dict[str, np.ndarray], summary: dict[str, Any], notes: dict[str, Any]
) -> None:
    """Write every array as .npy and merge manifest.json (keys not recomputed are kept)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    manifest: dict[str, Any] = {}
    if manifest_path.is_file():
        manifest = json.loads(manifest_path.read_text())
    for name, arr in arrays.items():
        tmp = out_dir / f".{name}.tmp.npy"
        np.save(tmp, arr)
        tmp.replace(out_dir / f"{name}.npy")
        manifest[name] = {
            "shape": list(arr.shape),
            "dtype": str(arr.dtype),
            "desc": _describe(name),
        }
    old_summary = manifest.pop("_summary", {})
    for key, value in summary.items():
        if isinstance(value, dict) and isinstance(old_summary.get(key), dict):
            old_summary[key].update(value)
        else:
            old_summary[key] = value
    old_notes = manifest.pop("_notes", {})
    old_notes.update(notes)
    manifest["_summary"] = old_summary
    manifest["_notes"] = old_notes
    tmp = out_dir / ".manifest.json.tmp"
    tmp.write_text(json.dumps(manifest, indent=1) + "\n")
    tmp.replace(manifest_path)


def compare(arrays: dict[str, np.ndarray], ref_dir: Path, atol: float) -> bool:
    """Print max |new - ref| per array; True when every array is within ``atol``."""
    ok = True
    print(f"{'array':32} {'shape':>16} {'max abs diff':>14}  result")
    for name in sorted(arrays):
        new = arrays[name]
        path = ref_dir / f"{name}.npy"
        if not path.is_file():
            print(f"{name:32} {str(new.shape):>16} {'-':>14}  (no reference)")
            continue
        ref = np.load(path)
        if ref.shape != new.shape:
            print(f"{name:32} {str(new.shape):>16} {'-':>14}  SHAPE != {ref.shape}")
            ok = False
            continue
        if np.issubdtype(new.dtype, np.integer):
            bad = int(np.count_nonzero(ref != new))
            print(f"{name:32} {str(new.shape):>16} {bad:>14d}  {'ok' if bad == 0 else 'DIFFER'}")
            ok = ok and bad == 0
            continue
        diff = _maxdiff(new, ref)
        good = diff <= atol
        print(f"{name:32} {str(new.shape):>16} {diff:>14.3e}  {'ok' if good else 'OVER ATOL'}")
        ok = ok and good
    return ok


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="script/make-reference",
        description="Regenerate reference arrays with the official qwen-tts implementation.",
    )
    parser.add_argument("checkpoint", type=Path, help="model dir (config.json, speech_tokenizer/)")
    parser.add_argument("out_dir", type=Path, help="where to write *.npy and manifest.json")
    parser.add_argument(
        "--inputs", type=Path, help="folder with input_ids/dec_codes/... .npy (default: random)"
    )
    parser.add_argument("--seed", type=int, default=1234, help="seed for random inputs")
    parser.add_argument(
        "--parts",
        help=f"comma-separated subset of: {', '.join(PART_INPUTS)} (default: by the "
        "checkpoint's kind, see the module docstring)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument(
        "--compare", type=Path, help="reference folder to compare against (prints a table)"
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="compute (and compare) but write nothing"
    )
    parser.add_argument(
        "--atol", type=float, default=1e-4, help="max abs difference allowed by --compare"
    )
    args = parser.parse_args(argv)

    if not (args.checkpoint / "config.json").is_file():
        parser.error(f"{args.checkpoint} has no config.json")
    config = json.loads((args.checkpoint / "config.json").read_text())
    kind = config.get("tts_model_type", "custom_voice")
    default_parts = PARTS_BY_KIND.get(kind, "")
    if kind == "custom_voice" and config.get("tts_model_size") != "0b6":
        default_parts += ",instruct"  # the 0.6B CustomVoice ignores instructions
    parts = {p.strip() for p in (args.parts or default_parts).split(",") if p.strip()}
    if not parts or parts - set(PART_INPUTS):
        parser.error(f"--parts takes a comma-separated subset of: {', '.join(PART_INPUTS)}")

    try:
        import qwen_tts  # noqa: F401
        import torch
        import transformers
    except ImportError as exc:
        print(
            f"make_reference: {exc}. Install the optional extra: pip install -e '.[reference]' "
            "(see the module docstring for the torchaudio workaround).",
            file=sys.stderr,
        )
        return 2

    print(
        f"loading {args.checkpoint} (torch {torch.__version__}, "
        f"transformers {transformers.__version__})",
        flush=True,
    )
    wrapper = None
    if parts & {"clone", "design"}:
        # The voice parts tokenize their texts: the wrapper with the checkpoint's processor.
        wrapper = load_official_wrapper(args.checkpoint, args.threads)
        model = wrapper.model
    else:
        model = load_official(args.checkpoint, args.threads)
    hidden = int(model.config.talker_config.hidden_size)
    inputs = make_inputs(args.inputs, args.seed, hidden, parts)

    arrays: dict[str, np.ndarray] = dict(inputs)
    summary: dict[str, Any] = {}
    if "decoder" in parts:
        print("decoder references ...", flush=True)
        dec_arrays, summary["decoder"] = decoder_arrays(model, inputs)
        arrays.update(dec_arrays)
    if "talker" in parts:
        print("talker / generation references ...", flush=True)
        talker_out, talker_summary = talker_arrays(model, inputs)
        arrays.update(talker_out)
        summary.update(talker_summary)
    for part in ("instruct", "clone", "design"):
        if part not in parts:
            continue
        print(f"{part} references ...", flush=True)
        if part == "instruct":
            part_out, part_summary = instruct_arrays(model, inputs)
        elif part == "clone":
            part_out, part_summary = clone_arrays(wrapper, inputs)
        else:
            part_out, part_summary = design_arrays(wrapper)
        arrays.update(part_out)
        summary.update(part_summary)

    notes = {
        "variant": str(model.config.tts_model_size),
        "kind": str(kind),
        "parts": ",".join(sorted(parts)),
        "voice_texts": VOICE_TEXTS if parts & {"clone", "design"} else None,
        "inputs": f"random, seed {args.seed}" if args.inputs is None else "from --inputs",
        "generate_kwargs": GENERATE_NOTE,
        "attn_implementation": "talker+CP eager, speech-tokenizer decoder sdpa (the default the "
        "official loader uses)",
        "dtype": "float32",
        "generator": "dev/kazeia_dev/reference/make_reference.py (qwen-tts "
        f"{_version('qwen-tts')}, transformers {transformers.__version__}, "
        f"torch {torch.__version__})",
    }
    for key, value in summary.items():
        print(f"  {key}: {json.dumps(value)}")

    ok = True
    if args.compare is not None:
        # Before writing, so that OUT_DIR may be the folder compared against.
        produced = {k: v for k, v in arrays.items() if k not in INPUT_NAMES}
        ok = compare(produced, args.compare, args.atol)
        if not ok:
            print(f"make_reference: outputs differ from {args.compare}", file=sys.stderr)
    if args.dry_run:
        print("dry run: nothing written")
    else:
        write_outputs(args.out_dir, arrays, summary, notes)
        print(f"wrote {len(arrays)} arrays to {args.out_dir}")
    if not ok:
        return 1
    return 0


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
