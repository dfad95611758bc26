# Stratagem: one image for the service, the Ray head and Ray workers.
#
#   docker build -t stratagem:cpu .                                   # CPU torch (the service, CPU workers)
#   docker build -t stratagem:gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126 .
#
# The GPU variant only swaps the torch wheel: CUDA wheels bundle the CUDA runtime, so the base stays
# python:3.11-slim and the host needs just the NVIDIA driver and the NVIDIA Container Toolkit.
FROM python:3.11-slim

ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# torch first, from the index that decides CPU or CUDA; a later `pip install .` keeps it.
RUN pip install --index-url "${TORCH_INDEX}" "torch==${TORCH_VERSION}"

COPY pyproject.toml README.md ./
COPY stratagem ./stratagem
COPY simulator ./simulator
COPY optimizer_service ./optimizer_service
COPY trial_runner ./trial_runner
COPY models ./models
COPY migrations ./migrations
COPY examples ./examples
RUN pip install ".[service]"

RUN useradd --create-home --uid 10001 stratagem
USER stratagem

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=5 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"

# Migrations run at start-up (under a PostgreSQL advisory lock), so replicas can start together.
CMD ["python", "-m", "optimizer_service", "--host", "0.0.0.0", "--port", "8000"]
