from typing import Any

import numpy as np
import numpy.typing as npt

from .errors import InputError as InputError
from .errors import ModelError as ModelError

DECODER_GPU_CHUNK_FRAMES: int
DECODER_MAX_CHUNK_FRAMES: int
DECODER_PRECISIONS: tuple[str, ...]
KERNEL_ISA: str
KV_CACHE_TYPES: tuple[str, ...]
PROMPT_ROLE_TOKENS: int
PROMPT_TRAILER_TOKENS: int

class DecoderHParams:
    @property
    def sample_rate(self) -> int: ...
    @property
    def hop_length(self) -> int: ...
    @property
    def num_quantizers(self) -> int: ...
    @property
    def codebook_size(self) -> int: ...
    @property
    def as_dict(self) -> dict[str, Any]: ...

def read_decoder_hparams(path: str) -> DecoderHParams: ...
def frame_budget(text_tokens: int) -> int: ...
def cpu_backend() -> dict[str, Any]: ...
def missing_cpu_features() -> list[str]: ...
def compute_devices() -> list[dict[str, Any]]: ...
def gpu_backends() -> list[str]: ...
def resolve_placement(placement: str) -> str: ...
def describe_placement(device_id: str) -> str: ...

# A stream decodes an utterance in pushes: push(codes [n, 16]) gives exactly the next
# n * hop_length samples; reset() starts a new utterance.
class DecoderStream:
    def push(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    def reset(self) -> None: ...
    def save(self) -> bytes: ...
    def restore(self, state: bytes) -> None: ...
    @property
    def frames_pushed(self) -> int: ...

class CoreShare:
    def __init__(self, cores: int = 0) -> None: ...
    @property
    def cores(self) -> int: ...
    @property
    def generator_computing(self) -> bool: ...
    @property
    def generator_alone(self) -> bool: ...
    @property
    def last_push_cpu_share(self) -> float: ...
    OTHERS_BUSY_BELOW: float
    OTHERS_GONE_FROM: float

class SpeechDecoder:
    def __init__(
        self,
        path: str,
        threads: int = 2,
        polite: bool = False,
        device: str = "cpu",
        precision: str = "f32",
        core_share: CoreShare | None = None,
    ) -> None: ...
    @property
    def device(self) -> str: ...
    @property
    def precision(self) -> str: ...
    @property
    def core_share(self) -> CoreShare | None: ...
    def decode(self, codes: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    def stream(self) -> DecoderStream: ...
    @property
    def hparams(self) -> dict[str, Any]: ...
    @property
    def threads(self) -> int: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def hop_length(self) -> int: ...
    @property
    def num_quantizers(self) -> int: ...
    @property
    def codebook_size(self) -> int: ...

class FrameIterator:
    def __iter__(self) -> FrameIterator: ...
    def __next__(self) -> npt.NDArray[np.int32]: ...
    def close(self) -> None: ...
    @property
    def stats(self) -> dict[str, float]: ...

class SpeakerEncoder:
    def __init__(self, path: str, threads: int = 2) -> None: ...
    def mel(self, audio: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    def embed(self, audio: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    def embed_mel(self, mel: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def min_samples(self) -> int: ...
    @property
    def hparams(self) -> dict[str, Any]: ...

class SpeechEncoder:
    def __init__(self, path: str, threads: int = 2) -> None: ...
    def encode(
        self, audio: npt.ArrayLike
    ) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.float32]]: ...
    @property
    def sample_rate(self) -> int: ...
    @property
    def frame_samples(self) -> int: ...
    @property
    def hparams(self) -> dict[str, Any]: ...

class Voice:
    def __init__(
        self,
        instruct_ids: npt.ArrayLike | None = None,
        speaker_embedding: npt.ArrayLike | None = None,
        ref_ids: npt.ArrayLike | None = None,
        ref_codes: npt.ArrayLike | None = None,
    ) -> None: ...
    @property
    def in_context(self) -> bool: ...
    @property
    def reference_frames(self) -> int: ...

class Generator:
    def __init__(
        self,
        path: str,
        threads: int = 2,
        polite: bool = False,
        talker_device: str = "cpu",
        predictor_device: str = "cpu",
        core_share: CoreShare | None = None,
    ) -> None: ...
    @property
    def talker_device(self) -> str: ...
    @property
    def predictor_device(self) -> str: ...
    @property
    def core_share(self) -> CoreShare | None: ...
    # input_ids: TextTokenizer.prompt_ids of the text. Unset sampling values come from the
    # model's generation_config.json; greedy=True takes the argmax.
    def frames(
        self,
        input_ids: npt.ArrayLike,
        speaker: str = "",
        language: str = "auto",
        non_streaming: bool = False,
        greedy: bool = False,
        seed: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        max_frames: int = 2048,
        voice: Voice | None = None,
    ) -> FrameIterator: ...
    def generate(
        self,
        input_ids: npt.ArrayLike,
        speaker: str = "",
        language: str = "auto",
        non_streaming: bool = False,
        greedy: bool = False,
        seed: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        max_frames: int = 2048,
        voice: Voice | None = None,
    ) -> npt.NDArray[np.int32]: ...
    def text_tokens(self, input_ids: npt.ArrayLike) -> int: ...
    @property
    def damaged(self) -> bool: ...
    @property
    def hparams(self) -> dict[str, Any]: ...
    @property
    def threads(self) -> int: ...
    @threads.setter
    def threads(self, value: int) -> None: ...
    @property
    def kv_cache_type(self) -> str: ...
    @kv_cache_type.setter
    def kv_cache_type(self, value: str) -> None: ...
    @property
    def speakers(self) -> list[str]: ...
    @property
    def languages(self) -> list[str]: ...

# _native.formats: the converter's audience.
class _Formats:
    def parts(self) -> list[dict[str, Any]]: ...
    def tensor_specs(self, part: str, hparams: dict[str, Any]) -> list[dict[str, Any]]: ...
    def quantize(self, data: npt.ArrayLike, type: str) -> bytes: ...

formats: _Formats

# _native.testing: test hooks and bench probes, in development builds only (KAZEIA_TESTING).
class _Testing:
    def frames(
        self,
        generator: Generator,
        input_ids: npt.ArrayLike,
        speaker: str = "",
        language: str = "auto",
        non_streaming: bool = False,
        greedy: bool = False,
        seed: int | None = None,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        max_frames: int = 2048,
        voice: Voice | None = None,
        kv_block: int = 256,
        whole_frames: bool = True,
    ) -> FrameIterator: ...
    def trace(
        self,
        generator: Generator,
        input_ids: npt.ArrayLike,
        speaker: str = "",
        language: str = "auto",
        non_streaming: bool = False,
        max_frames: int = 2048,
        kv_block: int = 256,
        voice: Voice | None = None,
        forced_codes: npt.ArrayLike | None = None,
    ) -> dict[str, Any]: ...
    def select_token(
        self,
        logits: npt.ArrayLike,
        history: list[int],
        repetition_penalty: float,
        suppress_begin: int,
        suppress_end: int,
        keep: int,
        greedy: bool,
        temperature: float,
        top_k: int,
        top_p: float,
        seed: int,
        n: int,
    ) -> list[int]: ...
    Q8_GEMM_ISA: str
    KV_BLOCK: int  # the talker cache's slots added at a time
    def conv_gemm(
        self,
        w: npt.ArrayLike,
        x: npt.ArrayLike,
        taps: int = 1,
        dilation: int = 1,
        precision: str = "f32",
        threads: int = 2,
        period: int = 0,
    ) -> npt.NDArray[np.float32]: ...
    def q8_matmul(
        self,
        w: npt.ArrayLike,
        x: npt.ArrayLike,
        gemm: bool = True,
        threads: int = 2,
        repeats: int = 1,
        panels: bool = False,
    ) -> dict[str, Any]: ...
    def last_level_cache_bytes(self) -> int: ...
    def read_bandwidth(self, megabytes: int = 256, threads: int = 2) -> float: ...
    def read_bandwidth_passes(
        self, megabytes: int = 256, threads: int = 2
    ) -> list[list[float]]: ...
    def joined_rows(self, a_as_panels: bool) -> list[tuple[str, int]]: ...
    SHORT_TIME_SLICE_NS: int
    def pool_thread_scheduling(self, threads: int) -> dict[str, Any]: ...
    def generator_beside_push(
        self, stream: DecoderStream, codes: npt.ArrayLike, share: CoreShare, threads: int = 3
    ) -> dict[str, int]: ...
    def pool_threads_beside_decoder(
        self, threads: int, share: CoreShare, decoder_threads: int, seconds: float = 1.0
    ) -> int: ...
    def decoder_pool_threads(
        self, threads: int, share: CoreShare, generator_computing: bool, seconds: float = 0.5
    ) -> int: ...
    def push_cpu_seconds(
        self,
        stream: DecoderStream,
        codes: npt.ArrayLike,
        share: CoreShare,
        generator_computing: bool,
    ) -> dict[str, float]: ...
    def set_thread_time_slice(self, ns: int) -> bool: ...
    def thread_time_slice_ns(self) -> int: ...
    def fma_peak(self, threads: int = 2) -> float: ...
    FMA_PEAK_ISA: str
    def sin_squared(self, x: npt.ArrayLike) -> npt.NDArray[np.float32]: ...
    def to_bf16(self, x: npt.ArrayLike) -> npt.NDArray[np.uint16]: ...
    def window_attention(
        self,
        q: npt.ArrayLike,
        k: npt.ArrayLike,
        v: npt.ArrayLike,
        mask: npt.ArrayLike,
        n_kv_heads: int,
        scale: float,
        cache_capacity: int = 0,
        in_ggml_ops: bool = False,
        cache_type: str = "f32",
    ) -> npt.NDArray[np.float32]: ...

testing: _Testing

def decoder_bf16_isa() -> str: ...
def cpu_has_amx_bf16() -> bool: ...
