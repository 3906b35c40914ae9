# syntax=docker/dockerfile:1
#
# Two images for Kubernetes, every dependency baked in (nothing is pip-installed at run time, so
# an offline cluster works):
#
#   docker build -t critbatch:0.1.0 .                            # sweeps, Ray head/workers, service
#   docker build --target mlflow -t critbatch-mlflow:3.17.2 .   # MLflow server (PostgreSQL + S3)
#
# torch is the CPU wheel by default. For NVIDIA GPUs pick the CUDA variant of the same version
# (the wheels bring their CUDA runtime; the nodes bring the driver), e.g.
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t critbatch:0.1.0-cu128 .
# Behind a mirror, point TORCH_INDEX_URL and PIP_INDEX_URL at it.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# wget: KubeRay's Ray health probes; bash: KubeRay starts Ray with `bash -lc`.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends bash ca-certificates wget \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --gid 1000 ray \
 && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash ray

# ---- the MLflow tracking server ------------------------------------------------------------------
FROM python-base AS mlflow
ARG MLFLOW_VERSION=3.17.2
RUN pip install "mlflow==${MLFLOW_VERSION}" "psycopg2-binary>=2.9,<3" "boto3>=1.34,<2"
USER 1000:1000
WORKDIR /home/ray
EXPOSE 5000
CMD ["mlflow", "server", "--host", "0.0.0.0", "--port", "5000"]

# ---- critbatch (the default target: keep it last) ------------------------------------------------
FROM python-base AS critbatch
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# torch first, from its own index, so that `pip install ".[sweep,service]"` finds it satisfied and never pulls the
# multi-GB default (CUDA) build.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /app
# constraints.txt: the exact versions the test suite passed with (as `make install` uses them).
# psycopg2: the PostgreSQL driver of the sweeps' Optuna study storage on Kubernetes
# (CRITBATCH_OPTUNA_STORAGE=postgresql+psycopg2://..., k8s/base/optuna.yaml); the MLflow image has it too.
COPY pyproject.toml constraints.txt README.md* ./
COPY critbatch ./critbatch
COPY sweeps ./sweeps
COPY workloads ./workloads
COPY service ./service
RUN pip install -c constraints.txt ".[sweep,service]" "psycopg2-binary>=2.9,<3" \
 && python -c "import torch, ray, mlflow, optuna, psycopg2, transformers, critbatch; assert torch.__version__.startswith('${TORCH_VERSION}')"
# The bundled data sets: specs name them relative to the working directory (/app).
COPY data ./data
ENV HOME=/home/ray \
    RAY_USAGE_STATS_ENABLED=0 \
    HF_HUB_OFFLINE=1 \
    MPLCONFIGDIR=/tmp/matplotlib
USER 1000:1000
# 8000: critbatch serve; 6379, 8265, 10001: Ray GCS, dashboard, client
EXPOSE 8000 6379 8265 10001
CMD ["critbatch", "--help"]
