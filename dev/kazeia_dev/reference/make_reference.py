"""Regenerate reference outputs with the official Qwen3-TTS implementation.

Runs the official PyPI package ``qwen-tts`` (fp32, CPU) on a checkpoint in the Hugging Face
layout and writes the arrays the parity tests compare against (the same set, names, shapes and
dtypes as ``tests/data/reference/*/ref``; ``manifest.json`` describes each one)::

    script/make-reference CHECKPOINT_DIR OUT_DIR \
        [--inputs DIR] [--parts decoder,talker] [--compare REF_DIR]

Inputs (``input_ids``, ``dec_codes``, ``dec_codes_long``, ``fixed_talker_inputs_embeds``) are
read from ``--inputs DIR`` when given (normally an existing ``ref/`` folder, so that the outputs
are comparable), otherwise drawn at random with ``--seed``. They are written to OUT_DIR too.

Needs the optional extra ``reference`` (qwen-tts 0.1.1, transformers 4.57.3, torch); torch and
qwen_tts are imported only inside functions so that the project never needs them at run time.
``import qwen_tts`` pulls torchaudio: where its binary does not load beside the installed torch,
install torchaudio with ``--no-deps`` and move its ``lib/*.so`` aside (it falls back to Python).
"""

from __future__ import annotations

import argparse
import json
import sys
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

INPUT_NAMES = ("input_ids", "dec_codes", "dec_codes_long", "fixed_talker_inputs_embeds")

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
    for mode, (language, speaker, non_streaming) in MODES.items():
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


def make_inputs(inputs_dir: Path | None, seed: int, talker_hidden: int) -> dict[str, np.ndarray]:
    """Read the input arrays from ``inputs_dir`` or draw them at random."""
    if inputs_dir is not None:
        out = {}
        for name in INPUT_NAMES:
            path = inputs_dir / f"{name}.npy"
            if not path.is_file():
                raise SystemExit(f"make_reference: missing input {path}")
            out[name] = np.load(path)
        if out["fixed_talker_inputs_embeds"].shape[-1] != talker_hidden:
            raise SystemExit(
                "make_reference: fixed_talker_inputs_embeds width "
                f"{out['fixed_talker_inputs_embeds'].shape[-1]} != talker hidden {talker_hidden}"
            )
        return out
    rng = np.random.default_rng(seed)
    return {
        "input_ids": np.asarray(DEFAULT_INPUT_IDS, dtype=np.int64),
        "dec_codes": rng.integers(0, 2048, size=(16, DEC_FRAMES), dtype=np.int64),
        "dec_codes_long": rng.integers(0, 2048, size=(16, DEC_FRAMES_LONG), dtype=np.int64),
        "fixed_talker_inputs_embeds": rng.standard_normal((FIXED_TALKER_LEN, talker_hidden)).astype(
            np.float32
        ),
    }


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


def generate_mode(
    model: Any, input_ids: np.ndarray, mode: str
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run the official generate() greedily for one mode and record its internals."""
    import torch

    language, speaker, non_streaming = MODES[mode]
    tcfg = model.config.talker_config
    rec = _Recorder(model)
    try:
        with torch.inference_mode():
            codes_list, _ = model.generate(
                input_ids=[torch.from_numpy(input_ids.astype(np.int64))[None]],
                languages=[language],
                speakers=[speaker],
                non_streaming_mode=non_streaming,
                **GENERATE_KWARGS,
            )
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

    codes = codes_list[0].cpu().numpy().astype(np.int64)
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
        default="decoder,talker",
        help="comma-separated subset of: decoder, talker (default: both)",
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

    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    if not parts or parts - {"decoder", "talker"}:
        parser.error("--parts takes a comma-separated subset of: decoder, talker")
    if not (args.checkpoint / "config.json").is_file():
        parser.error(f"{args.checkpoint} has no config.json")

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
    model = load_official(args.checkpoint, args.threads)
    hidden = int(model.config.talker_config.hidden_size)
    inputs = make_inputs(args.inputs, args.seed, hidden)

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

    notes = {
        "variant": str(model.config.tts_model_size),
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
