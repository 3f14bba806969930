# syntax=docker/dockerfile:1
# Kazeia TTS: the Wyoming text-to-speech service for Home Assistant.
#   docker build -t kazeia-tts .
#   docker run -p 10200:10200 -v kazeia-data:/data kazeia-tts [--zeroconf] [server flags...]
# The first start downloads Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice into /data and converts it
# once; --model /data/... uses a checkpoint or converted model already in the volume.

# Build stage: compiles the native extension (scikit-build-core brings CMake from PyPI) and
# collects the wheels of the package and its dependencies. ggml comes from libggml-python: on
# amd64 built from its source release with every x86-64 CPU variant (script/ggml-wheel:
# the image runs on CPUs without AVX2), on arm64 its prebuilt wheel.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential=12.9 \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN if [ "$(uname -m)" = "x86_64" ]; then \
        PYTHON=python script/ggml-wheel --install \
        && pip wheel --no-cache-dir --no-build-isolation --wheel-dir /wheels . ; \
    else \
        pip wheel --no-cache-dir --wheel-dir /wheels . ; \
    fi

# Runtime stage: no compiler, non-root user, models and settings in /data.
FROM python:3.11-slim-bookworm
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
