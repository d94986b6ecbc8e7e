# syntax=docker/dockerfile:1
# batchplan: two images from one Dockerfile.
#
#   Planner only (no torch):  docker build --target api -t batchplan:api .
#   Worker, CPU (default):    docker build -t batchplan:cpu .
#   Worker, CUDA:             docker build -t batchplan:cuda \
#                               --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                               --build-arg TORCH_VERSION=2.13.0 .
#
# The `api` target serves plans, exports, schedules (charts too) and elastic plans; it has no
# torch, so it is a fraction of the worker's size and keeps no state. The worker (the default,
# last target) also runs gradient checks. The CUDA wheels bundle their CUDA libraries, so the
# slim base serves both; the host needs the NVIDIA driver and the container toolkit
# (docker-compose.yml reserves the GPUs).

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src

FROM build AS build-api
COPY pyproject.toml README.md ./
COPY app ./app
# Not editable: the runtime stage gets the installed package, not the sources. No extras:
# torch is the `worker` extra; matplotlib is installed but imported only to draw a chart.
RUN pip install .

FROM build AS build-worker
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
# torch first, in a layer of its own: it is most of the image and changes least often.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
COPY pyproject.toml README.md ./
COPY app ./app
# The `worker` extra asks only for a torch range, which the wheel above satisfies.
RUN pip install "./[worker]"

FROM python:${PYTHON_VERSION}-slim AS runtime
LABEL org.opencontainers.image.title="batchplan" \
      org.opencontainers.image.description="Splits a distributed PyTorch batch exactly, and proves it." \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid 10001 batchplan \
    && useradd --system --uid 10001 --gid batchplan --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin batchplan \
    && mkdir -p /data \
    && chown batchplan:batchplan /data
# MPLCONFIGDIR: the user has no home, and a read-only container writes only to its /tmp
# (a tmpfs in docker-compose.yml); matplotlib caches its font list there.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    BATCHPLAN_LOG_FORMAT=json
USER 10001:10001
EXPOSE 8000
# slim has no curl: python's urllib raises (exit 1) on a refused connection or a non-2xx answer.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=4)"]
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000"]

# The planner: no torch, no worker, nothing written, so no volume (it runs read-only).
FROM runtime AS api
COPY --from=build-api /opt/venv /opt/venv
ENV BATCHPLAN_WORKER_ENABLED=false
WORKDIR /tmp

# The worker (default target): the planner plus warm rank processes; job results in /data.
FROM runtime AS worker
ARG TORCH_VERSION=2.13.0
LABEL io.batchplan.torch-version="${TORCH_VERSION}"
COPY --from=build-worker /opt/venv /opt/venv
ENV BATCHPLAN_WORKER_ENABLED=true \
    BATCHPLAN_JOBS_DB=/data/jobs.sqlite3
WORKDIR /data
VOLUME ["/data"]
# Healthy once every rank process is warm: /readyz answers 503 while ranks warm up or are
# replaced (the planner serves meanwhile) and while none can start; the check also reads
# worker.ready. Its ranks import torch first, hence the longer start period.
# Anyone who reaches the port can run checks unless an API key is set, and the server warns
# at start-up when it has none: docker run -e BATCHPLAN_API_KEY="$(openssl rand -hex 32)" ...
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import json, urllib.request; r = json.load(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)); raise SystemExit(0 if r['worker'].get('ready', True) else 1)"]
