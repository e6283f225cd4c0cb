# fastllm runtime image. CPU by default:
#   docker build -t fastllm-runtime .
# CUDA: a CUDA runtime base and the matching torch wheel index, e.g.
#   docker build -t fastllm-runtime:cuda \
#     --build-arg BASE_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 .
# (`fastllm doctor` inside the container checks the torch/CUDA pair: CUDA >= 11.6 on GPU.)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/fastllm \
    PATH=/opt/fastllm/bin:$PATH

# CUDA bases (Ubuntu) ship no Python; python:3.11-slim already has it. A venv in both cases
# (Debian/Ubuntu system Pythons refuse `pip install` outside one).
RUN if ! command -v python3 >/dev/null 2>&1 || ! python3 -c "import venv, ensurepip" 2>/dev/null; then \
        apt-get update && \
        apt-get install -y --no-install-recommends python3 python3-venv python3-pip && \
        rm -rf /var/lib/apt/lists/*; \
    fi && \
    python3 -m venv "$VIRTUAL_ENV"

# jemalloc: `fastllm serve` re-executes itself with it preloaded (runtime/memory/host_malloc.py),
# so the server's RSS follows what it holds instead of glibc's heap high-water mark (docs/soak.md).
# g++: the AVX2 int4/int8 kernels (runtime/models/cpu_kernels) are compiled on the machine that runs
# them, once, into TORCH_EXTENSIONS_DIR (without it torch's slower kernels run)
RUN apt-get update && \
    apt-get install -y --no-install-recommends libjemalloc2 g++ && \
    rm -rf /var/lib/apt/lists/*

# torch first, from the wheel index of the chosen build (CPU: no multi-GB CUDA wheel pulled in)
RUN pip install --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"

WORKDIR /app
COPY pyproject.toml README.md ./
COPY runtime ./runtime
COPY monitoring ./monitoring
COPY storage ./storage
COPY alerts ./alerts
COPY dashboards ./dashboards
RUN pip install . && fastllm --help >/dev/null

COPY deploy/entrypoint.sh /usr/local/bin/fastllm-entrypoint
RUN chmod 0755 /usr/local/bin/fastllm-entrypoint && \
    useradd --create-home --uid 10001 --user-group fastllm && \
    mkdir -p /models /var/lib/fastllm && \
    chown fastllm:fastllm /models /var/lib/fastllm

USER fastllm
WORKDIR /home/fastllm

# Settings the runtime reads (runtime/config.py); compose and `docker run -e` override them.
ENV FASTLLM_HOST=0.0.0.0 \
    FASTLLM_PORT=8000 \
    FASTLLM_MODEL_PATH=/models/default \
    FASTLLM_DATABASE_URL=sqlite:////var/lib/fastllm/fastllm.db \
    FASTLLM_LOG_SPOOL_PATH=/var/lib/fastllm/inference_log.spool.jsonl \
    FASTLLM_MALLOC=jemalloc \
    TORCH_EXTENSIONS_DIR=/var/lib/fastllm/torch_extensions

EXPOSE 8000

# /ready is 200 only once the model is loaded (503 while loading, failed or draining)
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s --retries=3 \
    CMD python -c "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('FASTLLM_PORT', '8000'), timeout=4)"

ENTRYPOINT ["fastllm-entrypoint"]
CMD ["serve"]
