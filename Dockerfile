# syntax=docker/dockerfile:1
# Kazeia TTS: the Wyoming text-to-speech service for Home Assistant.
#   docker build -t kazeia-tts .
#   docker run -p 10200:10200 -v kazeia-data:/data kazeia-tts [--zeroconf] [server flags...]
# The first start downloads Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice into /data and converts it
# once; --model /data/... uses a checkpoint or converted model already in the volume.

#
# GPU images (the talker and code predictor on a GPU: --backend auto|vulkan|cuda):
#   docker build --build-arg BACKEND=vulkan -t kazeia-tts:vulkan .   (run with --device /dev/dri)
#   docker build --build-arg BACKEND=cuda -t kazeia-tts:cuda .       (run with --gpus all)
# CUDA's compiler and libraries come from PyPI's nvidia-* packages (script/gpu-deps cuda), so
# the base image stays Debian's Python; CUDA_ARCHITECTURES picks the GPU generations.

# Build stage: compiles the native extension (scikit-build-core brings CMake from PyPI) and
# collects the wheels of the package and its dependencies. ggml comes from libggml-python: on
# amd64 built from its source release with every x86-64 CPU variant (script/ggml-wheel:
# the image runs on CPUs without AVX2) and the GPU backend asked for, on arm64 its prebuilt
# wheel (CPU only).
FROM python:3.11-slim-bookworm AS build
ARG BACKEND=cpu
ARG CUDA_ARCHITECTURES="75;80;86;89;90"
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential=12.9 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN if [ "${BACKEND}" != "cpu" ]; then PYTHON=python script/gpu-deps "${BACKEND}"; fi \
    && if [ "$(uname -m)" = "x86_64" ] || [ "${BACKEND}" != "cpu" ]; then \
        PYTHON=python CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
            script/ggml-wheel --backend "${BACKEND}" --install \
        && PATH="$(ls -d /src/build/cuda-deps/nvidia/cu*/bin 2>/dev/null || true):${PATH}" \
            pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels . ; \
    else \
        pip wheel --no-cache-dir --wheel-dir /wheels . ; \
    fi

# Runtime stage: no compiler, non-root user, models and settings in /data. A GPU image adds
# its backend's runtime: the Vulkan loader and Mesa's drivers, or CUDA's runtime and cuBLAS
# from PyPI (the NVIDIA driver itself comes from the host through --gpus).
FROM python:3.11-slim-bookworm
ARG BACKEND=cpu
ARG CUDA_MAJOR=13
# hadolint ignore=DL3008,DL3013
RUN if [ "${BACKEND}" = "vulkan" ]; then \
        apt-get update \
        && apt-get install -y --no-install-recommends libvulkan1 mesa-vulkan-drivers \
        && rm -rf /var/lib/apt/lists/* ; \
    elif [ "${BACKEND}" = "cuda" ]; then \
        pip install --no-cache-dir "nvidia-cuda-runtime==${CUDA_MAJOR}.*" \
            "nvidia-cublas==${CUDA_MAJOR}.*" ; \
    fi
ENV LD_LIBRARY_PATH=/usr/local/lib/python3.11/site-packages/nvidia/cu${CUDA_MAJOR}/lib
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KZTTS_DATA_DIR=/data \
    HF_HOME=/data/hf-cache
# The only wyoming-kazeia in /wheels is the one just built: no version to pin.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels wyoming-kazeia
RUN useradd --system --create-home --uid 1000 kazeia \
    && mkdir -p /data \
    && chown kazeia:kazeia /data
USER 1000:1000
WORKDIR /home/kazeia
VOLUME /data
EXPOSE 10200
# A describe -> info round trip (the rhasspy images' convention); the start period covers a first
# start that downloads (~2.5 GB) and converts the model, while the server already answers.
HEALTHCHECK --interval=30s --timeout=10s --start-period=30m --retries=3 \
    CMD ["python", "-m", "wyoming_kazeia.health_check", "--uri", "tcp://127.0.0.1:10200"]
# Extra arguments of `docker run` are appended: e.g. --zeroconf, --voice vivian-fr, --mqtt-host.
ENTRYPOINT ["python", "-m", "wyoming_kazeia", "--uri", "tcp://0.0.0.0:10200", "--data-dir", "/data"]
