"""Model parts placed on a GPU through ggml's Vulkan or CUDA backend, against the official
outputs.

Runs on the first GPU device there is (CUDA first, as "auto" picks) where ggml was built with
a GPU backend (script/setup --backend vulkan|cuda): in CI that is Mesa's lavapipe, a Vulkan
driver that computes on the CPU (conftest lets ggml list it; ggml skips CPU-type devices
otherwise). The placement checks at the top need no device.

Tolerance: ggml's GPU backends compute in f32 here (the engine has Vulkan's products run in
its f32 shaders, unless KAZEIA_VULKAN_F16=1, and asks every product for f32 precision), so a
part on the GPU must match the reference as closely as the CPU engine does: talker logits and
hidden states within 1e-4 (measured on lavapipe: 2.2e-6), the decoder within 1e-3, the
issue's bound (measured: 6.5e-5). Greedy codes must be identical, or, where they part, the
choice must be one the backend's error can flip: its top-2 margin in the CPU engine's logits
(which match the official ones within 1e-4) is below that same 1e-4.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REFERENCE_MODELS, ref_array, ref_codes

from wyoming_kazeia._native import testing
from wyoming_kazeia.engine import Engine, resolve_placements
from wyoming_kazeia.errors import SettingsError
from wyoming_kazeia.native import (
    Generator,
    SpeechDecoder,
    compute_devices,
    describe_placement,
    resolve_placement,
)
from wyoming_kazeia.settings import EngineSettings

TOLERANCE = 1e-4
MODES = {  # as tests/test_generator_parity.py
    "stream": ("vivian", "english", False),
    "nonstream": ("vivian", "english", True),
    "auto_dialect": ("dylan", "auto", False),
}
FRAMES = 23
# The device the tests place parts on: the first GPU, as "auto" picks it.
GPU = [] if resolve_placement("auto") == "cpu" else [resolve_placement("auto")]
needs_gpu = pytest.mark.skipif(
    not GPU,
    reason="no GPU device here: ggml built without a GPU backend (script/setup --backend "
    "vulkan|cuda) or no driver (for Vulkan, Debian's mesa-vulkan-drivers)",
)


def test_the_cpu_is_always_a_device_and_auto_picks_the_first_gpu() -> None:
    devices = [d["id"] for d in compute_devices()]
    assert devices[0] == "cpu"
    assert resolve_placement("CPU") == "cpu"
    gpus = [d for d in devices if d != "cpu"]
    cuda = [d for d in gpus if d.startswith("cuda:")]
    assert resolve_placement("auto") == (cuda or gpus or ["cpu"])[0]
    # The banner's words for a device: its id, and for a GPU its name and memory.
    assert describe_placement("cpu") == "cpu"
    for gpu in compute_devices()[1:]:
        assert describe_placement(gpu["id"]).startswith(f"{gpu['id']} ({gpu['description']}, ")


GETENV_AFTER_DEVICES = """
import ctypes
from wyoming_kazeia.native import compute_devices
compute_devices()
libc = ctypes.CDLL(None)
libc.getenv.restype = ctypes.c_char_p
print(libc.getenv(b"GGML_VK_DISABLE_F16"))
"""


@pytest.mark.parametrize(
    ("environment", "disable_f16"),
    [({}, "b'1'"), ({"KAZEIA_VULKAN_F16": "1"}, "None"), ({"GGML_VK_DISABLE_F16": "x"}, "b'x'")],
)
def test_vulkan_products_run_in_f32_unless_f16_is_asked_for(
    environment: dict[str, str], disable_f16: str
) -> None:
    """By the first question about devices, before ggml opens a Vulkan device, ggml is told
    to use its f32 shaders, unless KAZEIA_VULKAN_F16=1 or the user set ggml's variable."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("GGML_VK_DISABLE_F16", "KAZEIA_VULKAN_F16")
    }
    out = subprocess.run(
        [sys.executable, "-c", GETENV_AFTER_DEVICES],
        env=env | environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == disable_f16


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"talker_backend": "cuda:9"}, "talker_backend 'cuda:9': no compute device 'cuda:9'"),
        ({"backend": "vulkan:7"}, "talker_backend 'vulkan:7': no compute device 'vulkan:7'"),
        ({"decoder_backend": "vulkan:7"}, "decoder_backend 'vulkan:7'"),
    ],
)
def test_a_device_that_is_not_here_is_refused_in_one_line_listing_the_devices(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(SettingsError) as err:
        resolve_placements(EngineSettings(**settings))
    text = str(err.value)
    assert message in text and "\n" not in text
    assert "devices here: cpu" in text


@pytest.mark.parametrize("value", ["gpu", "vulkan:", "cuda:x", "metal", ""])
def test_a_placement_of_another_form_is_a_settings_error(value: str) -> None:
    with pytest.raises(SettingsError, match="allowed: cpu\\|auto\\|vulkan\\[:N\\]\\|cuda\\[:N\\]"):
        EngineSettings(backend=value)


def test_every_part_follows_backend_unless_its_own_setting_says() -> None:
    s = EngineSettings(backend="AUTO", predictor_backend="cpu")
    assert [s.placement(p) for p in ("talker", "predictor", "decoder")] == ["auto", "cpu", "auto"]
    devices = resolve_placements(s)
    assert devices["decoder"] == devices["talker"] == resolve_placement("auto")
    assert resolve_placements(s.replace(decoder_backend="CPU"))["decoder"] == "cpu"


def test_a_decoder_process_decodes_on_the_cpu_whatever_backend_says() -> None:
    s = EngineSettings(backend="auto", decoder_subprocess=True)
    assert s.placement("decoder") == "cpu" and s.placement("talker") == "auto"
    assert resolve_placements(s)["decoder"] == "cpu"


@needs_gpu
def test_a_gpu_decoder_in_a_decoder_process_is_refused_in_one_line() -> None:
    with pytest.raises(SettingsError, match="kazeia-decoder process of decoder_subprocess"):
        resolve_placements(EngineSettings(decoder_backend=GPU[0], decoder_subprocess=True))


@pytest.fixture(scope="module", params=REFERENCE_MODELS)
def on_gpu(
    request: pytest.FixtureRequest, talker_gguf: dict[str, Path]
) -> tuple[str, Generator, Generator]:
    """(model, its generator with both stacks on the GPU, on the CPU)."""
    if not GPU:
        pytest.skip("no GPU device here")
    path = str(talker_gguf[request.param])
    gpu = Generator(path, threads=2, talker_device=GPU[0], predictor_device=GPU[0])
    assert (gpu.talker_device, gpu.predictor_device) == (GPU[0], GPU[0])
    return request.param, gpu, Generator(path, threads=2)


def frames_and_waits(
    gen: Generator, *args: Any, **kwargs: Any
) -> tuple[np.ndarray, float, dict[str, Any]]:
    """The codes of a generation, its graph computations per frame after the first (the
    first's include the prefill's; the draw of an eos that ended it, one computation on every
    path, not counted): each one a submission the host waits for on a GPU; and its stats."""
    it = testing.frames(gen, *args, **kwargs)
    codes = [next(it)]
    first = it.stats["computations"]
    codes += list(it)
    eos_draw = int(len(codes) < kwargs["max_frames"])
    waits = (it.stats["computations"] - first - eos_draw) / max(len(codes) - 1, 1)
    return np.stack(codes), waits, it.stats


def top2_margin(logits: np.ndarray) -> float:
    top = np.sort(logits)[-2:]
    return float(top[1] - top[0])


def explained_divergence(
    ours: dict[str, np.ndarray], cpu: dict[str, np.ndarray], expected: np.ndarray
) -> tuple[int, int] | None:
    """Where the codes first part from the reference (frame, codebook), None when they do
    not; asserts that the CPU engine's margin of that choice is within the tolerance."""
    differ = np.argwhere(ours["codes"] != expected)
    if len(differ) == 0:
        return None
    frame, group = (int(x) for x in differ[0])
    logits = cpu["talker_logits"][frame] if group == 0 else cpu["cp_logits"][frame, group - 1]
    assert top2_margin(logits) < TOLERANCE, (frame, group, top2_margin(logits))
    return frame, group


@needs_gpu
@pytest.mark.parametrize("mode", list(MODES))
def test_generator_on_a_gpu_matches_official(
    on_gpu: tuple[str, Generator, Generator], mode: str
) -> None:
    name, gpu, cpu_gen = on_gpu
    speaker, language, non_streaming = MODES[mode]
    ids = ref_array(name, "input_ids")
    ours = testing.trace(gpu, ids, speaker, language, non_streaming, FRAMES)
    expected = ref_array(name, f"{mode}_codes")
    cpu = testing.trace(cpu_gen, ids, speaker, language, non_streaming, FRAMES)
    assert np.array_equal(cpu["codes"], expected)  # the yardstick of the margins
    parted = explained_divergence(ours, cpu, expected)
    # Up to where the codes part, the inputs are the reference's: compare the outputs there.
    calls = FRAMES + 1 if parted is None else parted[0] + 1
    for key in ("talker_logits", "talker_hidden"):
        reference = ref_array(name, f"{mode}_{key}")[:calls]
        assert np.abs(ours[key][:calls] - reference).max() < TOLERANCE, key
    frames = FRAMES if parted is None else parted[0]
    assert np.abs(ours["cp_logits"][:frames] - cpu["cp_logits"][:frames]).max() < TOLERANCE


@needs_gpu
def test_a_cache_growing_on_a_gpu_changes_no_code(
    on_gpu: tuple[str, Generator, Generator],
) -> None:
    """The talker's cache grown every 5 frames (its step graph, or the whole frame's graph,
    built again each time, the spent ones kept for the run): the same greedy codes as the
    reference."""
    name, gpu, _ = on_gpu
    speaker, language, non_streaming = MODES["stream"]
    ids = ref_array(name, "input_ids")
    trace = testing.trace(gpu, ids, speaker, language, non_streaming, FRAMES, kv_block=5)
    assert np.array_equal(trace["codes"], ref_array(name, "stream_codes"))
    # Frames computed whole: the frame graph built again at each growth.
    greedy: dict[str, Any] = {"greedy": True, "repetition_penalty": 1.0, "max_frames": FRAMES}
    codes, waits, _ = frames_and_waits(
        gpu, ids, speaker, language, non_streaming, kv_block=5, **greedy
    )
    assert np.array_equal(codes, ref_array(name, "stream_codes"))
    assert waits == 1


@needs_gpu
def test_an_f16_cache_on_a_gpu_gives_the_logits_of_the_cpus(
    on_gpu: tuple[str, Generator, Generator],
) -> None:
    """kv_cache_type f16 on a GPU (the cache written by ggml's set_rows, widened by its copies
    before the products): teacher-forced on the CPU's codes with its f16 cache, the same logits
    within the tolerance, the cache growing every 5 frames."""
    name, gpu, cpu_gen = on_gpu
    speaker, language, non_streaming = MODES["stream"]
    ids = ref_array(name, "input_ids")
    gpu.kv_cache_type = cpu_gen.kv_cache_type = "f16"
    try:
        cpu = testing.trace(cpu_gen, ids, speaker, language, non_streaming, FRAMES)
        ours = testing.trace(
            gpu, ids, speaker, language, non_streaming, FRAMES, kv_block=5,
            forced_codes=cpu["codes"],
        )  # fmt: skip
    finally:
        gpu.kv_cache_type = cpu_gen.kv_cache_type = "f32"
    for key in ("talker_logits", "talker_hidden", "cp_logits"):
        assert np.abs(ours[key] - cpu[key]).max() < TOLERANCE, key


@needs_gpu
def test_frames_on_a_gpu_stream_what_generate_returns(
    on_gpu: tuple[str, Generator, Generator],
) -> None:
    name, gpu, _ = on_gpu
    args = (ref_array(name, "input_ids"), "vivian", "english", False)
    greedy: dict[str, Any] = {"greedy": True, "repetition_penalty": 1.0, "max_frames": 12}
    codes = gpu.generate(*args, **greedy)
    assert np.array_equal(np.stack(list(gpu.frames(*args, **greedy))), codes)


SAMPLINGS = [
    {"greedy": True, "repetition_penalty": 1.0},
    {"greedy": True},  # the model's repetition penalty, 1.05
    {"seed": 7},  # the model's own: temperature 0.9, top-k 50, penalty 1.05
    {"seed": 5, "repetition_penalty": 1.5},
    {"seed": 11, "top_k": 0, "temperature": 1.3},
    {"seed": 3, "top_p": 0.9},
    {"seed": 13, "top_k": 0, "top_p": 0.8},
]


def _samplings_per_model() -> list[Any]:
    """Every sampling on the first model; the first three on the others (the device's draws do
    not depend on the model's size, and on lavapipe a top-p over the whole vocabulary costs
    minutes a model)."""
    return [
        pytest.param(model, sampling, id=f"{model}-{i}")
        for model in REFERENCE_MODELS
        for i, sampling in enumerate(SAMPLINGS)
        if model == REFERENCE_MODELS[0] or i < 3
    ]


@needs_gpu
@pytest.mark.parametrize(("on_gpu", "sampling"), _samplings_per_model(), indirect=["on_gpu"])
def test_a_frame_on_a_gpu_is_one_computation_drawing_the_codes_of_the_cpu(
    on_gpu: tuple[str, Generator, Generator], sampling: dict[str, Any]
) -> None:
    """Both stacks on the GPU: after the first frame (the prefill's), a frame is one graph
    (the talker's step reading the input the frame before left on the device, code 0 drawn
    there with the repetition penalty, the control tokens suppressed and the eos rule, the
    code predictor's passes, the next step's input): the host waits once a frame and gets its
    16 codes, the CPU's, from the same uniforms. Apart (whole_frames=False) it waits twice:
    the talker's step, then the code predictor's frame as one graph of its own (15 single
    steps on the CPU), drawing the same codes."""
    name, gpu, cpu_gen = on_gpu
    args = (ref_array(name, "input_ids"), "vivian", "english", False)
    cpu_codes, cpu_waits, cpu_stats = frames_and_waits(
        cpu_gen, *args, max_frames=FRAMES, **sampling
    )
    gpu_codes, gpu_waits, _ = frames_and_waits(gpu, *args, max_frames=FRAMES, **sampling)
    apart, apart_waits, apart_stats = frames_and_waits(
        gpu, *args, max_frames=FRAMES, whole_frames=False, **sampling
    )
    assert np.array_equal(gpu_codes, cpu_codes)
    assert np.array_equal(apart, cpu_codes)
    assert (cpu_waits, gpu_waits, apart_waits) == (16, 1, 2)
    assert apart_stats["predictor_computations"] == apart_stats["frames"]
    assert cpu_stats["predictor_computations"] == 15 * cpu_stats["frames"]


@needs_gpu
@pytest.mark.parametrize("seed", [131, 237])
def test_whole_frames_on_a_gpu_stop_at_the_eos_the_cpu_draws(
    on_gpu: tuple[str, Generator, Generator], seed: int
) -> None:
    """Flattened logits over all codes: these seeds draw eos at frames 6 and 9 on the CPU (of
    tiny-0.6b; another model may go on to max_frames); the device draws it at the same frame
    and the generation ends there, eos not a frame."""
    name, gpu, cpu_gen = on_gpu
    flat: dict[str, Any] = {"temperature": 1000.0, "top_k": 0, "repetition_penalty": 1.0}
    args = (ref_array(name, "input_ids"), "vivian")
    cpu_codes, _, _ = frames_and_waits(cpu_gen, *args, seed=seed, max_frames=60, **flat)
    gpu_codes, gpu_waits, _ = frames_and_waits(gpu, *args, seed=seed, max_frames=60, **flat)
    assert np.array_equal(gpu_codes, cpu_codes)
    assert gpu_waits == 1
    if name == "tiny-0.6b":
        assert len(cpu_codes) < 10


@needs_gpu
def test_talker_on_a_gpu_with_the_predictor_on_the_cpu(talker_gguf: dict[str, Path]) -> None:
    name = REFERENCE_MODELS[0]
    gen = Generator(str(talker_gguf[name]), threads=2, talker_device=GPU[0])
    assert (gen.talker_device, gen.predictor_device) == (GPU[0], "cpu")
    ids = ref_array(name, "input_ids")
    codes = gen.generate(
        ids, "vivian", "english", greedy=True, repetition_penalty=1.0, max_frames=FRAMES
    )
    assert np.array_equal(codes, ref_array(name, "stream_codes"))


ENGINE_SETTINGS = EngineSettings(max_frames=12, seed=1)
ENGINE_TEXT = "Hello from the graphics card."


def speak(engine: Engine) -> np.ndarray:
    return np.concatenate(list(engine.synthesize(ENGINE_TEXT, "vivian", greedy=True)))


@needs_gpu
def test_engine_with_its_stacks_on_a_gpu_speaks_as_on_the_cpu(tiny_model: Path) -> None:
    """The service's engine with the stacks on the GPU, the decoder on the CPU: greedy codes
    equal to the CPU engine's give the same samples."""
    gpu = Engine(tiny_model, ENGINE_SETTINGS.replace(backend=GPU[0], decoder_backend="cpu"))
    assert gpu.devices == {"talker": GPU[0], "predictor": GPU[0], "decoder": "cpu"}
    gpu_pcm, cpu_pcm = speak(gpu), speak(Engine(tiny_model, ENGINE_SETTINGS))
    assert len(gpu_pcm) == 12 * gpu.hop_length
    assert np.array_equal(gpu_pcm, cpu_pcm)
    # Placed back on the CPU between syntheses: the generator is reloaded there.
    gpu.apply_settings(ENGINE_SETTINGS)
    assert gpu.devices["talker"] == "cpu" and gpu.generator.talker_device == "cpu"


# The decoder on a GPU: within the 1e-3 of the reference waveform (measured on lavapipe:
# 3.6e-5 / 4.2e-5 for the two tiny models; the CPU engine: 3e-5). Streamed pushes are computed
# in the one-pass decode's graph shape (padded), so they are bit-equal to it, as on the CPU.
DECODER_TOLERANCE = 1e-3


@needs_gpu
def test_engine_placed_on_a_gpu_speaks_within_the_decoder_tolerance(tiny_model: Path) -> None:
    """backend on the GPU places all three parts there: the same greedy codes as the CPU
    engine, a waveform within the decoder's tolerance (int16 PCM); placed back, the decoder
    reloads on the CPU."""
    gpu = Engine(tiny_model, ENGINE_SETTINGS.replace(backend=GPU[0]))
    assert gpu.devices == {"talker": GPU[0], "predictor": GPU[0], "decoder": GPU[0]}
    assert gpu.decoder.device == GPU[0]
    cpu_pcm = speak(Engine(tiny_model, ENGINE_SETTINGS))
    assert np.abs(speak(gpu).astype(np.int32) - cpu_pcm).max() < DECODER_TOLERANCE * 32767
    gpu.apply_settings(ENGINE_SETTINGS)
    assert gpu.decoder.device == "cpu"


@pytest.fixture(scope="module", params=REFERENCE_MODELS)
def decoder_on_gpu(
    request: pytest.FixtureRequest, decoder_gguf: dict[str, Path]
) -> tuple[str, SpeechDecoder]:
    """(model, its decoder on the GPU)."""
    if not GPU:
        pytest.skip("no GPU device here")
    decoder = SpeechDecoder(str(decoder_gguf[request.param]), threads=2, device=GPU[0])
    assert decoder.device == GPU[0]
    return request.param, decoder


@needs_gpu
def test_decoder_on_gpu_speaks_the_reference_waveform(
    decoder_on_gpu: tuple[str, SpeechDecoder],
) -> None:
    name, decoder = decoder_on_gpu
    codes = ref_codes(name, "dec_codes")
    out = decoder.decode(codes)
    assert out.shape == (len(codes) * 1920,)
    expected = ref_array(name, "dec_wav_full").reshape(-1)
    assert np.abs(out - expected).max() < DECODER_TOLERANCE


@needs_gpu
@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_decoder_on_gpu_streams_exactly_what_it_decodes_in_one_pass(
    decoder_on_gpu: tuple[str, SpeechDecoder], chunk: int
) -> None:
    """Bit-equal, pushes of any size: streamed frames sit at other columns of other pushes
    than in the one-pass decode's graphs (4 frames each: DECODER_GPU_CHUNK_FRAMES)."""
    name, decoder = decoder_on_gpu
    codes = ref_codes(name, "dec_codes")[:24]
    full = decoder.decode(codes)
    stream = decoder.stream()
    parts = [stream.push(codes[i : i + chunk]) for i in range(0, len(codes), chunk)]
    assert np.array_equal(np.concatenate(parts), full)


@needs_gpu
def test_streams_on_a_gpu_take_pushes_of_any_size_in_turn(
    decoder_on_gpu: tuple[str, SpeechDecoder],
) -> None:
    """Fresh streams each pushing 1 frame, then 4, as the engine does: every push fits in the
    graph memory reserved at the stream's start (when a push grew it instead, lavapipe read
    the freed buffer: this crashed the process in each of 3 runs of 10 streams)."""
    name, decoder = decoder_on_gpu
    codes = ref_codes(name, "dec_codes")[:9]
    full = decoder.decode(codes)
    for _ in range(5):
        stream = decoder.stream()
        parts = [stream.push(codes[:1])]
        parts += [stream.push(codes[i : i + 4]) for i in range(1, len(codes), 4)]
        assert np.array_equal(np.concatenate(parts), full)


@needs_gpu
def test_decoder_state_on_a_gpu_saves_and_restores_exactly(
    decoder_on_gpu: tuple[str, SpeechDecoder],
) -> None:
    """The state lives in the device's memory: saved and restored through the backend, a
    stream continues with the very samples of the stream it was saved from."""
    name, decoder = decoder_on_gpu
    codes = ref_codes(name, "dec_codes")[:12]
    first = decoder.stream()
    first.push(codes[:8])
    saved = first.save()
    second = decoder.stream()
    second.restore(saved)
    assert np.array_equal(second.push(codes[8:]), first.push(codes[8:]))
