# syntax=docker/dockerfile:1
# Kazeia TTS: Wyoming text-to-speech service (the server module is coming; see README.md).
#   docker build -t kazeia-tts .
#   docker run -p 10200:10200 -v kazeia-data:/data kazeia-tts

# Build stage: compiles the native extension (scikit-build-core brings CMake from PyPI; ggml comes
# prebuilt from libggml-python) and collects the wheels of the package and its dependencies.
FROM python:3.11-slim-bookworm AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# Runtime stage: no compiler, non-root user, models and settings in /data.
FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels wyoming-kazeia
RUN useradd --system --create-home --uid 1000 kazeia \
    && mkdir -p /data \
    && chown kazeia:kazeia /data
USER kazeia
WORKDIR /home/kazeia
VOLUME /data
EXPOSE 10200
ENTRYPOINT ["python", "-m", "wyoming_kazeia", "--uri", "tcp://0.0.0.0:10200", "--data-dir", "/data"]
