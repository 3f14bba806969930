# Kazeia TTS: the Wyoming text-to-speech service for Home Assistant.
#   docker build -t kazeia-tts .
#   docker run -p 10200:10200 -v kazeia-data:/data kazeia-tts [--zeroconf] [server flags...]
# The first start downloads Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice into /data and converts it
# once; --model /data/... uses a checkpoint or converted model already in the volume. The
# address is KZTTS_URI (default tcp://0.0.0.0:10200), read by the server and its health check
# alike: `-e KZTTS_URI=tcp://0.0.0.0:10300` moves both.
#
# GPU images (the talker and code predictor on a GPU: --backend auto|vulkan|cuda):
#   docker build --build-arg BACKEND=vulkan -t kazeia-tts:vulkan .   (run with --device /dev/dri)
#   docker build --build-arg BACKEND=cuda -t kazeia-tts:cuda .       (run with --gpus all)
# CUDA's compiler and libraries come from PyPI's nvidia-* packages (script/gpu-deps cuda), so
# the base image stays Debian's; CUDA_ARCHITECTURES picks the GPU generations.
#
# The base is Debian's own image with Debian's Python (as rhasspy's wyoming images), so that
# the image is made of Debian's packages and our wheels only (script/image-test builds it).

# Build stage: compiles the native extension (scikit-build-core brings CMake from PyPI) and
# collects the wheels of the package and its dependencies. ggml comes from libggml-python: on
# amd64 built from its source release with every x86-64 CPU variant (script/ggml-wheel:
# the image runs on CPUs without AVX2) and the GPU backend asked for, on arm64 its prebuilt
# wheel (CPU only).
FROM debian:bookworm-slim AS build
ARG BACKEND=cpu
ARG CUDA_ARCHITECTURES="75;80;86;89;90"
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential python3 python3-dev \
        python3-venv ca-certificates curl xz-utils \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/build
ENV PATH=/opt/build/bin:${PATH}
WORKDIR /src
# ggml first, from what its build reads only: a change elsewhere keeps this layer.
COPY pyproject.toml ./
COPY script/ggml-wheel script/gpu-deps script/
RUN if [ "${BACKEND}" != "cpu" ]; then PYTHON=python script/gpu-deps "${BACKEND}"; fi \
    && if [ "$(uname -m)" = "x86_64" ] || [ "${BACKEND}" != "cpu" ]; then \
        PYTHON=python CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
            script/ggml-wheel --backend "${BACKEND}" --install >/dev/null ; \
    fi
COPY . .
RUN if [ "$(uname -m)" = "x86_64" ] || [ "${BACKEND}" != "cpu" ]; then \
        PATH="$(ls -d /src/build/cuda-deps/nvidia/cu*/bin 2>/dev/null || true):${PATH}" \
            pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels . ; \
    else \
        pip wheel --no-cache-dir --wheel-dir /wheels . ; \
    fi

# Runtime stage: Debian's python3 and a venv of the wheels, no compiler, user and group 1000,
# models and settings in /data. A GPU image adds its backend's runtime: the Vulkan loader and
# Mesa's drivers, or CUDA's runtime and cuBLAS from PyPI (the NVIDIA driver itself comes from
# the host through --gpus).
FROM debian:bookworm-slim
ARG BACKEND=cpu
ARG CUDA_MAJOR=13
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && if [ "${BACKEND}" = "vulkan" ]; then \
        apt-get install -y --no-install-recommends libvulkan1 mesa-vulkan-drivers ; \
    fi \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/kazeia
ENV PATH=/opt/kazeia/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KZTTS_URI=tcp://0.0.0.0:10200 \
    KZTTS_DATA_DIR=/data \
    HF_HOME=/data/hf-cache
# The only wyoming-kazeia in the build's /wheels is the one just built: no version to pin. They
# are mounted at /mnt, which exists, so that no empty mount point stays. CUDA's libraries
# from PyPI are made known to the dynamic loader (a CPU image has no such path).
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/mnt \
    pip install --no-cache-dir --no-index --find-links /mnt wyoming-kazeia \
    && if [ "${BACKEND}" = "cuda" ]; then \
        pip install --no-cache-dir "nvidia-cuda-runtime==${CUDA_MAJOR}.*" \
            "nvidia-cublas==${CUDA_MAJOR}.*" \
        && ls -d /opt/kazeia/lib/python3*/site-packages/nvidia/cu*/lib \
            > /etc/ld.so.conf.d/nvidia-pypi.conf \
        && ldconfig ; \
    fi
RUN groupadd --gid 1000 kazeia \
    && useradd --uid 1000 --gid 1000 --create-home kazeia \
    && mkdir -p /data \
    && chown 1000:1000 /data
USER 1000:1000
WORKDIR /home/kazeia
VOLUME /data
EXPOSE 10200
# A describe -> info round trip (the rhasspy images' convention) at KZTTS_URI; the start period
# covers a first start that downloads (~2.5 GB) and converts the model, while the server
# already answers (the check prints "loading: ..." then, and passes).
HEALTHCHECK --interval=10s --timeout=10s --start-period=30m --retries=3 \
    CMD ["python", "-m", "wyoming_kazeia.health_check"]
# Extra arguments of `docker run` are appended: e.g. --zeroconf, --voice vivian-fr, --mqtt-host.
ENTRYPOINT ["python", "-m", "wyoming_kazeia"]
