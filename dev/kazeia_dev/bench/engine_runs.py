"""The engine bench's measured rows, each in a fresh measuring child (``engine_child.py``).

The unloaded rows (one-shot, streaming with each chunk, the subprocess decoder), the row placed
on ``--*-backend`` devices, one long synthesis, the cloned voices on the Base model, and the
unloaded rows again beside a competing load (``competing_load.py``), and the ideal program beside
the same load (``ideal_program.py``).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from wyoming_kazeia.settings import PARTS

from .common import (
    CHILD_BOOT,
    BenchError,
    BenchTimeout,
    ensure_checkpoint,
    ensure_decoder,
    ensure_talker,
    logger,
    max_abs_diff,
    run_json_child,
)
from .competing_load import competing_load, load_bound_s
from .engine_figures import ALONE_KEYS
from .ideal_program import IDEAL_ALONE_S, ideal_figures, ideal_run, ideal_units

# The tokenizer files and config.json the engine reads from its model folder (beside the GGUFs).
ENGINE_TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "config.json")
ENGINE_FILES = ("talker.gguf", "decoder.gguf", *ENGINE_TOKENIZER_FILES)
# The streaming chunk of the rows measured at one chunk only: the subprocess decoder, the placed,
# long and cloned-voice rows.
VOICE_CHUNK = 4
PLACED = "placed"  # the row with parts on --talker-, --predictor-, --decoder-backend devices
# The placed row's ratios to the CPU's; generator_s: talker, code predictor and whole frames
PLACED_KEYS = ("total_s", "ttfa_s", "decoder_s", "generator_s")
GENERATOR_KEYS = ("talker_s", "predictor_s", "frame_graph_s")

RowConfig = tuple[str, int, bool]  # row name, stream_chunk, decoder subprocess
Clone = tuple[str, Path | None]  # --clone mode, a model folder loaded beside


def ensure_engine_dir(cache_dir: Path, size: str = "0.6b", talker_type: str = "q8_0") -> Path:
    """``cache_dir / f"e-{size}-{talker_type}"``: a model folder for ``Engine`` made of relative
    symbolic links to the cached talker (``t-SIZE-TYPE``), the decoder the converter writes for
    that type (``d-SIZE-TYPE``) and the tokenizer files of the checkpoint (``ck-SIZE``), which
    are built first when missing. Made under a ``.tmp`` name and renamed; reused while every link
    resolves and points at those files."""
    folder = cache_dir / f"e-{size}-{talker_type}"
    decoder = ensure_decoder(cache_dir, size, talker_type)
    talker = ensure_talker(cache_dir, size, talker_type)  # (made again when outdated)
    if (folder / "decoder.gguf").resolve() != decoder.resolve():
        shutil.rmtree(folder, ignore_errors=True)  # built by an older bench: another decoder
    if all((folder / name).is_file() for name in ENGINE_FILES):
        logger.info("reusing %s", folder)
        return folder
    sources = {"talker.gguf": talker, "decoder.gguf": decoder}
    ckpt = ensure_checkpoint(cache_dir, size)
    sources.update({name: ckpt / name for name in ENGINE_TOKENIZER_FILES})
    missing = [str(src) for src in sources.values() if not src.is_file()]
    if missing:
        raise BenchError(f"cannot build {folder}: missing {', '.join(missing)}")
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for name, src in sources.items():
        (tmp / name).symlink_to(os.path.relpath(src, folder))
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    logger.info("%s ready (links)", folder)
    return folder


def engine_row_cmd(
    args: argparse.Namespace,
    model_dir: Path,
    chunk: int,
    subproc: bool,
    repeats: int,
    out: Path,
    clone: Clone | None = None,
    placement: tuple[str, ...] | None = None,
) -> list[str]:
    cmd = [
        sys.executable,
        "-c",
        CHILD_BOOT,
        "engine",
        str(model_dir),
        "--warmup-frames",
        str(min(args.frames, 40)),
        "--threads",
        str(args.threads),
        "--decoder-threads",
        str(args.decoder_threads),
        "--decoder-precision",
        args.decoder_precision,
        "--kv-cache-type",
        args.kv_cache_type,
        "--chunk",
        str(chunk),
        "--repeats",
        str(repeats),
        "--frames",
        str(args.frames),
        "--seed",
        str(args.seed),
        "--text",
        args.text,
        "--speaker",
        args.speaker,
        "--language",
        args.language,
        "--out",
        str(out),
    ]
    if subproc:
        cmd.append("--subprocess")
    if placement is not None:
        for part, device in zip(PARTS, placement, strict=True):
            cmd += [f"--{part}-backend", device]
    if clone is not None:
        cmd += ["--clone", clone[0], "--ref-seconds", str(args.ref_seconds)]
        if clone[1] is not None:
            cmd += ["--also-load", str(clone[1])]
    return cmd


def row_label(name: str) -> str:
    """A row's name in the logs and reports."""
    if name == "oneshot":
        return "one-shot (chunk 0)"
    if name == "subprocess":
        return f"subprocess decoder (k={VOICE_CHUNK})"
    if name == "clone_xvec":
        return f"cloned voice, x-vector (k={VOICE_CHUNK})"
    if name == "clone_icl":
        return f"cloned voice, in context (k={VOICE_CHUNK})"
    if name == "clone_icl_both":
        return "cloned voice, in context, CustomVoice loaded too"
    if name == PLACED:
        return f"stream k={VOICE_CHUNK}, placed on the devices below"
    return f"stream k={name.removeprefix('stream_k')}"


def row_configs(chunks: list[int]) -> list[RowConfig]:
    """The unloaded rows, measured again beside the load: one-shot, a streaming row a chunk,
    the subprocess decoder."""
    return (
        [("oneshot", 0, False)]
        + [(f"stream_k{k}", k, False) for k in chunks]
        + [("subprocess", VOICE_CHUNK, True)]
    )


def clone_configs(model_dir: Path) -> dict[str, Clone]:
    """The cloned-voice rows on the Base model (its audio is another voice's: not compared)."""
    return {
        "clone_xvec": ("xvec", None),
        "clone_icl": ("icl", None),
        "clone_icl_both": ("icl", model_dir),
    }


@dataclass(frozen=True)
class RowRunner:
    """What the rows of one run share: the options, the model folder, the folder the children
    leave their audio in, and the children's environment."""

    args: argparse.Namespace
    model_dir: Path
    tmp: Path
    env: dict[str, str]

    def run(
        self,
        out_name: str,
        what: str,
        chunk: int = VOICE_CHUNK,
        subproc: bool = False,
        repeats: int | None = None,
        *,
        args: argparse.Namespace | None = None,
        model_dir: Path | None = None,
        clone: Clone | None = None,
        placement: tuple[str, ...] | None = None,
        timeout: float | None = None,
    ) -> tuple[dict[str, Any], Path]:
        """One row in a fresh child (``args`` and ``model_dir`` in place of the runner's; the
        rest as for engine_row_cmd and run_json_child): its figures and the npy file of its
        last run's audio."""
        out = self.tmp / f"{out_name}.npy"
        cmd = engine_row_cmd(
            args or self.args,
            model_dir or self.model_dir,
            chunk,
            subproc,
            self.args.repeats if repeats is None else repeats,
            out,
            clone,
            placement,
        )
        return run_json_child(cmd, what, self.env, timeout=timeout), out


def run_rows(
    runner: RowRunner, configs: list[RowConfig]
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """The unloaded rows, and the audio of each by row name."""
    rows: dict[str, dict[str, Any]] = {}
    audio: dict[str, np.ndarray] = {}
    for name, chunk, subproc in configs:
        start = time.monotonic()
        row, out = runner.run(name, f"engine {row_label(name)}", chunk, subproc)
        row["row_wall_s"] = time.monotonic() - start
        audio[name] = np.load(out)
        rows[name] = row
        logger.info(
            "%s: total %.2f s, RTF %.2f, first audio %.0f ms",
            row_label(name),
            row["total_s"],
            row["rtf"],
            1e3 * row["ttfa_s"],
        )
    return rows, audio


def run_placed_row(
    runner: RowRunner, rows: dict[str, dict[str, Any]], chunks: list[int]
) -> dict[str, Any] | None:
    """The row placed on the ``--*-backend`` devices (None when every part is on the CPU), with
    its ratios to the CPU's stream row of the same chunk."""
    args = runner.args
    placement = tuple(getattr(args, f"{part}_backend") or "cpu" for part in PARTS)
    if all(device == "cpu" for device in placement):
        return None
    placed, _ = runner.run(PLACED, f"engine {row_label(PLACED)}", placement=placement)
    cpu_row = rows[f"stream_k{VOICE_CHUNK}"] if VOICE_CHUNK in chunks else None
    for row in (placed, cpu_row or {}):
        row["generator_s"] = sum(row.get(k, 0.0) for k in GENERATOR_KEYS)
    if cpu_row is not None:
        placed["vs_cpu"] = {
            key: placed[key] / cpu_row[key] for key in PLACED_KEYS if cpu_row[key] > 0
        }
    logger.info(
        "%s (%s): total %.2f s, RTF %.2f, first audio %.0f ms",
        row_label(PLACED),
        placed["devices"],
        placed["total_s"],
        placed["rtf"],
        1e3 * placed["ttfa_s"],
    )
    return placed


def run_long_row(runner: RowRunner) -> dict[str, Any] | None:
    """One synthesis of ``--long-frames`` frames (None without)."""
    args = runner.args
    if args.long_frames <= 0:
        return None
    long_args = argparse.Namespace(**{**vars(args), "frames": args.long_frames})
    what = f"engine {args.long_frames} frames"
    long_row, out = runner.run("long", what, repeats=1, args=long_args)
    long_row["audio_samples"] = int(np.load(out).size)
    logger.info(
        "%d frames: total %.1f s, RTF %.2f, peak RSS %.0f MB",
        args.long_frames,
        long_row["total_s"],
        long_row["rtf"],
        long_row["peak_rss_mb"],
    )
    return long_row


def run_voice_rows(
    runner: RowRunner, base_dir: Path | None, clones: dict[str, Clone]
) -> dict[str, dict[str, Any]]:
    """The cloned-voice rows on the Base model in ``base_dir``."""
    voice_rows: dict[str, dict[str, Any]] = {}
    for name, clone in clones.items():
        assert base_dir is not None
        what = f"engine {row_label(name)}"
        row, out = runner.run(name, what, model_dir=base_dir, clone=clone)
        row["audio_samples"] = int(np.load(out).size)
        voice_rows[name] = row
        logger.info(
            "%s: prompt %.2f s, RTF %.2f, first audio %.0f ms, peak RSS %.0f MB",
            row_label(name),
            row["prompt_s"],
            row["rtf"],
            1e3 * row["ttfa_s"],
            row["peak_rss_mb"],
        )
    return voice_rows


def run_loaded_rows(
    runner: RowRunner,
    configs: list[RowConfig],
    rows: dict[str, dict[str, Any]],
    audio: dict[str, np.ndarray],
) -> dict[str, dict[str, Any]]:
    """The unloaded rows again beside the competing load, each bounded in time and each
    between two runs of the same row alone with as many syntheses (``alone_runs``: what its
    slowdown is taken against, their mean, so that a drift of the box's own speed cancels). A
    row whose run alone before it or whose loaded run fails says so (``failed``, with
    ``failed_stage``: ``alone`` or ``loaded``, and ``timed_out``); where only the run alone
    after it fails, the row keeps its figures against the run before (``alone_after_failed``).
    The other rows still run. Their audio joins ``audio`` as ``NAME-loaded``."""
    args = runner.args
    loaded: dict[str, dict[str, Any]] = {}
    for name, chunk, subproc in configs:
        bound = load_bound_s(rows[name]["row_wall_s"])
        what = f"engine {row_label(name)} beside {args.load_procs} {args.load_kind} processes"
        stage = "alone"
        try:
            before = _alone_run(runner, name, chunk, subproc, bound, "before")
            stage = "loaded"
            with competing_load(args.load_procs, args.load_kind, bound) as info:
                row, out = runner.run(
                    f"{name}-loaded", what, chunk, subproc, args.load_repeats, timeout=bound
                )
        except BenchError as err:
            logger.error("%s", err)
            loaded[name] = {
                "failed": str(err),
                "failed_stage": stage,
                "timed_out": isinstance(err, BenchTimeout),
                "bound_s": bound,
            }
            continue
        runs = [before]
        try:
            runs.append(_alone_run(runner, name, chunk, subproc, bound, "after"))
        except BenchError as err:
            logger.error("%s", err)
            row["alone_after_failed"] = str(err)
        row["load"] = info
        row["alone_runs"] = [{k: r[k] for k in (*ALONE_KEYS, "n_frames")} for r in runs]
        audio[f"{name}-loaded"] = np.load(out)
        loaded[name] = row
        logger.info(
            "%s under load: total %.2f s (%s s alone around it), first audio %.0f ms",
            row_label(name),
            row["total_s"],
            " and ".join(f"{r['total_s']:.2f}" for r in runs),
            1e3 * row["ttfa_s"],
        )
    return loaded


def run_ideal_row(args: argparse.Namespace) -> dict[str, Any]:
    """The ideal program (``ideal_program.py``) alone, beside the same competing load as the
    loaded rows, and alone again: its figures, or ``failed``."""
    try:
        units = ideal_units()
        bound = load_bound_s(IDEAL_ALONE_S)
        before = ideal_run(units, bound)
        with competing_load(args.load_procs, args.load_kind, bound) as info:
            loaded = ideal_run(units, bound)
        after = ideal_run(units, bound)
    except BenchError as err:
        logger.error("%s", err)
        return {"failed": str(err)}
    runs = {"before": before, "loaded": loaded, "after": after}
    return {**ideal_figures(runs), "units": units, "runs": runs, "load": info}


def _alone_run(
    runner: RowRunner, name: str, chunk: int, subproc: bool, bound: float, when: str
) -> dict[str, Any]:
    """The row alone, with as many syntheses as its loaded run, just `when` (before/after) it."""
    row, _ = runner.run(
        f"{name}-alone-{when}",
        f"engine {row_label(name)} alone, {when} its loaded row",
        chunk,
        subproc,
        runner.args.load_repeats,
        timeout=bound,
    )
    return row


def compare_audio(
    rows: dict[str, dict[str, Any]],
    loaded: dict[str, dict[str, Any]],
    audio: dict[str, np.ndarray],
) -> None:
    """Each measured row's audio length and its largest difference from the one-shot row's."""
    ref = audio["oneshot"]
    for table, suffix in ((rows, ""), (loaded, "-loaded")):
        for name, row in table.items():
            if "failed" in row:
                continue
            diff = max_abs_diff(audio[name + suffix], ref)
            row["audio_max_abs_diff_vs_oneshot"] = None if diff is None else int(diff)
            row["audio_samples"] = int(audio[name + suffix].size)
