"""Your own voices: add, list and remove the voices of the library (see voices/library.py).

    python -m wyoming_kazeia.voices add NAME --audio FILE [--text "what it says"]
    python -m wyoming_kazeia.voices add NAME --describe "a warm, low voice ..."
    python -m wyoming_kazeia.voices add NAME --speaker ryan --instruct "speak cheerfully"
        [--language fr] [--model MODEL]       (every add)
    python -m wyoming_kazeia.voices list
    python -m wyoming_kazeia.voices remove NAME
        [--data-dir DIR]                      (every command; KZTTS_DATA_DIR)

A recording (WAV, FLAC or OGG, any rate and channel count, 1-20 s of one person speaking) with
its transcript is cloned in context (closest to the recording); without one, from its voice
print alone (x-vector). Cloning needs a Base model, a described voice a VoiceDesign model, an
instructed speaker a CustomVoice 1.7B model. --model computes the voice's prompt now (else the
server computes it once when it first loads that model). The running server picks up added
and removed voices by itself. Clone only voices whose owners agreed to it.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from .. import cpu_floor  # noqa: F401 - first: it checks the CPU before numpy loads

# isort: split
from ..errors import KazeiaError, VoiceError
from ..models import add_data_dir_argument
from . import model_language, recording
from .library import StoredVoice, VoiceLibrary


def _add(library: VoiceLibrary, args: argparse.Namespace) -> StoredVoice:
    kinds = [bool(args.audio), bool(args.describe), bool(args.instruct or args.speaker)]
    if sum(kinds) != 1 or (args.instruct is None) != (args.speaker is None):
        raise VoiceError(
            "give one of: --audio FILE [--text ...], --describe TEXT, --speaker S --instruct TEXT"
        )
    if args.text is not None and not args.audio:
        raise VoiceError("--text is the transcript of --audio")
    language = model_language(args.language)
    if args.audio:
        rec = recording.load(args.audio)
        if args.text is not None and rec.seconds > recording.PROMPT_SECONDS:
            print(
                f"note: {args.audio} is {rec.seconds:.1f} s long: an in-context voice reads its "
                "whole recording before each answer's first audio (~0.35 s at 10 s, ~0.8 s at "
                f"20 s on a 2-core box); {recording.PROMPT_SECONDS:.0f} s or less answers sooner",
                file=sys.stderr,
            )
        return library.add_clone(args.name, rec, args.text, language)
    if args.describe:
        return library.add_design(args.name, args.describe, language)
    return library.add_instruct(args.name, args.speaker, args.instruct, language)


def _prepare(library: VoiceLibrary, voice: StoredVoice, args: argparse.Namespace) -> None:
    """Computes and stores the voice's prompt for --model (which must speak it)."""
    from ..engine import Engine
    from ..models import resolve_model
    from ..settings import EngineSettings

    settings = EngineSettings.from_env()
    engine = Engine(resolve_model(args.model, settings.quant, args.data_dir), settings)
    if engine.kind != voice.model_kind:
        raise VoiceError(
            f"{args.model} is a {engine.kind!r} model; a {voice.kind} voice needs a "
            f"{voice.model_kind!r} model"
        )
    if voice.speaker and voice.speaker not in engine.speakers:
        raise VoiceError(
            f"unknown speaker {voice.speaker!r}; valid speakers: {', '.join(engine.speakers)}"
        )
    library.prompt(voice, engine)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m wyoming_kazeia.voices",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_data_dir_argument(parser, "the server's data directory (voices live in its voices/ folder)")
    parser.add_argument("--debug", action="store_true")
    commands = parser.add_subparsers(dest="command", required=True)
    add = commands.add_parser("add", help="add a voice")
    add.add_argument("name", help="lowercase letters, digits, '_' (e.g. grandma)")
    add.add_argument("--audio", type=Path, help="a recording of the voice (1-20 s)")
    add.add_argument("--text", help="the recording's transcript (in-context cloning)")
    add.add_argument("--describe", help="a VoiceDesign description of the voice")
    add.add_argument("--speaker", help="a built-in speaker (with --instruct)")
    add.add_argument("--instruct", help="how the speaker speaks (CustomVoice 1.7B)")
    add.add_argument("--language", help="the voice's default language (e.g. fr); auto if unset")
    add.add_argument("--model", help="compute the voice's prompt for this model now")
    commands.add_parser("list", help="list the voices")
    remove = commands.add_parser("remove", help="remove a voice")
    remove.add_argument("name")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    library = VoiceLibrary(args.data_dir)
    try:
        if args.command == "add":
            voice = _add(library, args)
            if args.model:
                try:
                    _prepare(library, voice, args)
                except BaseException:
                    library.remove(voice.name)  # nothing half added
                    raise
            print(f"added {voice.name}: {voice.summary}")
        elif args.command == "remove":
            library.remove(args.name)
            print(f"removed {args.name}")
        else:
            voices, problems = library.scan()
            for problem in problems:
                print(f"warning: {problem}", file=sys.stderr)
            for v in voices:
                print(f"{v.name}\t{v.kind}\t{v.language or 'auto'}\t{v.summary}")
    except KazeiaError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
