"""Model parts placed on a GPU through ggml's Vulkan or CUDA backend, against the official
outputs.

Runs on the first GPU device there is (CUDA first, as "auto" picks) where ggml was built with
a GPU backend (script/setup --backend vulkan|cuda): in CI that is Mesa's lavapipe, a Vulkan
driver that computes on the CPU (conftest lets ggml list it; ggml skips CPU-type devices
otherwise). The placement checks at the top need no device.

Tolerance: lavapipe multiplies matrices of more than 8 columns with f16 activations (about
3e-4 relative), so talker logits and hidden states must be within 1e-2 of the reference
(measured: at most 3.6e-3). Greedy codes must be identical, or, where they part, the choice
must be one the backend's error can flip: its top-2 margin in the CPU engine's logits (which
match the official ones within 1e-4) is below that same 1e-2.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REFERENCE_MODELS, ref_array, ref_codes

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

TOLERANCE = 1e-2
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


def test_the_stacks_follow_backend_and_the_decoder_only_its_own_setting() -> None:
    s = EngineSettings(backend="AUTO", predictor_backend="cpu")
    assert [s.placement(p) for p in ("talker", "predictor", "decoder")] == ["auto", "cpu", "cpu"]
    assert resolve_placements(s)["decoder"] == "cpu"
    auto = resolve_placements(s.replace(decoder_backend="auto"))
    assert auto["decoder"] == auto["talker"] == resolve_placement("auto")


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
    ours = gpu.trace(ids, speaker, language, non_streaming, FRAMES)
    expected = ref_array(name, f"{mode}_codes")
    cpu = cpu_gen.trace(ids, speaker, language, non_streaming, FRAMES)
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
def test_frames_on_a_gpu_stream_what_generate_returns(
    on_gpu: tuple[str, Generator, Generator],
) -> None:
    name, gpu, _ = on_gpu
    args = (ref_array(name, "input_ids"), "vivian", "english", False)
    greedy: dict[str, Any] = {"greedy": True, "repetition_penalty": 1.0, "max_frames": 12}
    codes = gpu.generate(*args, **greedy)
    assert np.array_equal(np.stack(list(gpu.frames(*args, **greedy))), codes)


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
def test_engine_placed_on_a_gpu_speaks_as_on_the_cpu(tiny_model: Path) -> None:
    """The service's engine with backend on the GPU: the stacks there, the decoder on the
    CPU; greedy codes equal to the CPU engine's give the same samples."""
    gpu = Engine(tiny_model, ENGINE_SETTINGS.replace(backend=GPU[0]))
    assert gpu.devices == {"talker": GPU[0], "predictor": GPU[0], "decoder": "cpu"}
    gpu_pcm, cpu_pcm = speak(gpu), speak(Engine(tiny_model, ENGINE_SETTINGS))
    assert len(gpu_pcm) == 12 * gpu.hop_length
    assert np.array_equal(gpu_pcm, cpu_pcm)
    # Placed back on the CPU between syntheses: the generator is reloaded there.
    gpu.apply_settings(ENGINE_SETTINGS)
    assert gpu.devices["talker"] == "cpu" and gpu.generator.talker_device == "cpu"


# The decoder on lavapipe: measured 2.2e-2 at most from the reference (the CPU: 3e-5). Traced
# layer by layer against the same ggml ops on the CPU: the transformer's output is within
# 3.5e-4 (relative) even with f32 activations (lavapipe's math builtins are approximations),
# and the random-weight vocoder, whose activations reach ~130 before the last conv, amplifies
# that about 60-fold. Hence a tolerance that says only that the GPU path computes the same
# waveform; parity to 1e-3 is not shown on this driver.
DECODER_TOLERANCE = 5e-2


def mesa_22_lavapipe() -> bool:
    """The GPU is Debian 12's lavapipe (Mesa 22.x), whose executor crashes now and then on the
    decoder's graphs: a SIGSEGV in libvulkan_lvp's queue thread at the very address of its
    crash on ggml's fused shaders (measured: 4 in 35 engine runs with the decoder there, 0 in
    30 with it on the CPU; GGML_VK_DISABLE_GRAPH_OPTIMIZE and GGML_VK_SERIALIZE_SUBMISSIONS
    do not help). vulkaninfo (Debian's vulkan-tools, script/gpu-deps) names the driver.
    KAZEIA_GPU_DECODER_TESTS=1 runs the checks there all the same (by hand: a crash ends the
    run)."""
    if os.environ.get("KAZEIA_GPU_DECODER_TESTS") == "1":
        return False
    if not GPU or "llvmpipe" not in describe_placement(GPU[0]):
        return False
    try:
        info = subprocess.run(
            ["vulkaninfo", "--summary"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except OSError:
        return True  # cannot tell: taken for the driver measured here
    return re.search(r"driverInfo\s*=\s*Mesa 22\.", info) is not None


# The decoder's GPU checks run on every GPU but that one; they stay in the suite so that a
# real GPU or a newer Mesa runs them.
needs_a_decoder_safe_gpu = pytest.mark.skipif(
    mesa_22_lavapipe(),
    reason="Debian 12's lavapipe (Mesa 22) crashes in its own queue thread on the decoder's "
    "graphs now and then (see mesa_22_lavapipe); KAZEIA_GPU_DECODER_TESTS=1 runs them there "
    "by hand",
)


@needs_a_decoder_safe_gpu
@needs_gpu
def test_engine_with_its_decoder_on_a_gpu_speaks_within_the_decoder_tolerance(
    tiny_model: Path,
) -> None:
    """The decoder placed on the GPU too: the same greedy codes as the CPU engine, a
    waveform within the decoder's tolerance (int16 PCM); placed back, it reloads on the CPU."""
    gpu = Engine(tiny_model, ENGINE_SETTINGS.replace(backend=GPU[0], decoder_backend=GPU[0]))
    assert gpu.decoder.device == GPU[0]
    cpu_pcm = speak(Engine(tiny_model, ENGINE_SETTINGS))
    assert np.abs(speak(gpu).astype(np.int32) - cpu_pcm).max() < DECODER_TOLERANCE * 32767
    gpu.apply_settings(ENGINE_SETTINGS)
    assert gpu.decoder.device == "cpu"


@pytest.fixture(scope="module")
def decoder_on_gpu(decoder_gguf: dict[str, Path]) -> SpeechDecoder:
    if not GPU:
        pytest.skip("no GPU device here")
    decoder = SpeechDecoder(str(decoder_gguf[REFERENCE_MODELS[0]]), threads=2, device=GPU[0])
    assert decoder.device == GPU[0]
    return decoder


@needs_a_decoder_safe_gpu
@needs_gpu
def test_decoder_on_gpu_speaks_the_reference_waveform(decoder_on_gpu: SpeechDecoder) -> None:
    codes = ref_codes(REFERENCE_MODELS[0], "dec_codes")
    out = decoder_on_gpu.decode(codes)
    assert out.shape == (len(codes) * 1920,)
    expected = ref_array(REFERENCE_MODELS[0], "dec_wav_full").reshape(-1)
    assert np.abs(out - expected).max() < DECODER_TOLERANCE


@needs_a_decoder_safe_gpu
@needs_gpu
@pytest.mark.parametrize("chunk", [1, 4])
def test_decoder_on_gpu_streams_what_it_decodes_in_one_pass(
    decoder_on_gpu: SpeechDecoder, chunk: int
) -> None:
    codes = ref_codes(REFERENCE_MODELS[0], "dec_codes")[:24]
    full = decoder_on_gpu.decode(codes)
    stream = decoder_on_gpu.stream()
    parts = [stream.push(codes[i : i + chunk]) for i in range(0, len(codes), chunk)]
    assert np.abs(np.concatenate(parts) - full).max() < DECODER_TOLERANCE


@needs_a_decoder_safe_gpu
@needs_gpu
def test_decoder_state_on_a_gpu_saves_and_restores_exactly(
    decoder_on_gpu: SpeechDecoder,
) -> None:
    """The state lives in the device's memory: saved and restored through the backend, a
    stream continues with the very samples of the stream it was saved from."""
    codes = ref_codes(REFERENCE_MODELS[0], "dec_codes")[:12]
    first = decoder_on_gpu.stream()
    first.push(codes[:8])
    saved = first.save()
    second = decoder_on_gpu.stream()
    second.restore(saved)
    assert np.array_equal(second.push(codes[8:]), first.push(codes[8:]))
