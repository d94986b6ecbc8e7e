# syntax=docker/dockerfile:1
# batchplan: the planner API and the gradient-check worker, one image.
#
#   CPU (default):  docker build -t batchplan:cpu .
#   CUDA:           docker build -t batchplan:cuda \
#                     --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 \
#                     --build-arg TORCH_VERSION=2.13.0 .
#
# The CUDA wheels bundle their CUDA libraries, so the slim base serves both; the host needs
# the NVIDIA driver and the container toolkit (docker-compose.yml reserves the GPUs).

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim AS build
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
# torch first, in a layer of its own: it is most of the image and changes least often.
RUN pip install --index-url "${TORCH_INDEX_URL}" "torch==${TORCH_VERSION}"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
# Not editable: the runtime stage gets the installed package, not the sources.
RUN pip install .

FROM python:${PYTHON_VERSION}-slim AS runtime
ARG TORCH_VERSION=2.13.0
LABEL org.opencontainers.image.title="batchplan" \
      org.opencontainers.image.description="Splits a distributed PyTorch batch exactly, and proves it." \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.batchplan.torch-version="${TORCH_VERSION}"
RUN groupadd --system --gid 10001 batchplan \
    && useradd --system --uid 10001 --gid batchplan --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin batchplan \
    && mkdir -p /data \
    && chown batchplan:batchplan /data
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    BATCHPLAN_JOBS_DB=/data/jobs.sqlite3 \
    BATCHPLAN_LOG_FORMAT=json
WORKDIR /data
VOLUME ["/data"]
USER 10001:10001
EXPOSE 8000
# slim has no curl: python's urllib raises (exit 1) on a refused connection or a non-2xx answer.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/livez', timeout=4)"]
CMD ["uvicorn", "app.main:app", "--host", "0.0.0.0", "--port", "8000"]
