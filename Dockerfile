# syntax=docker/dockerfile:1.7
# kvgate images. Three targets from one file:
#   docker build --target operator -t kvgate:0.1.0 .        # `kvgate run` (kopf operator)
#   docker build --target eval     -t kvgate-eval:0.1.0 .   # `kvgate eval` (lm-eval accuracy Job)
#   docker build --target load     -t kvgate-load:0.1.0 .   # `kvgate load-job` (inference-perf)
# All run as a non-root user and write nothing outside /tmp, so they work with
# readOnlyRootFilesystem: true and an emptyDir mounted at /tmp.

# Pinned to an exact patch release of Debian 12 slim; bump deliberately.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
# The load image's: inference-perf 0.7.0 requires Python 3.12 or newer.
ARG LOAD_PYTHON_IMAGE=python:3.12.12-slim-bookworm

# ---- build: a venv in /opt/kvgate with kvgate and its runtime dependencies ----
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# The image's venv gets no pip, no bytecode (about 150 MB) and no libraries' test suites
# (26 MB): pip runs from a separate venv that stays in this stage, and Python compiles what
# it imports at start. hack/trim-venv.sh drops what nothing imports (it says what and why).
COPY hack/trim-venv.sh /opt/pip/trim-venv
RUN python -m venv /opt/pip \
 && /opt/pip/bin/pip install --upgrade pip \
 && python -m venv --without-pip /opt/kvgate \
 && /opt/pip/bin/pip --python /opt/kvgate/bin/python install --no-compile . \
 && sh /opt/pip/trim-venv /opt/kvgate

# ---- build-eval: the same venv plus the `eval` extra (lm-eval), trimmed the same way ----
FROM build AS build-eval
RUN /opt/pip/bin/pip --python /opt/kvgate/bin/python install --no-compile ".[eval]" \
 && sh /opt/pip/trim-venv /opt/kvgate

# ---- runtime base: non-root, HOME and caches under /tmp ----
FROM ${PYTHON_IMAGE} AS runtime
# A fixed numeric UID lets Kubernetes verify runAsNonRoot without reading /etc/passwd.
RUN groupadd --system --gid 65532 kvgate \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin kvgate
# Every library that writes (pip, Hugging Face, lm-eval, matplotlib) is pointed at /tmp.
ENV PATH=/opt/kvgate/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    XDG_DATA_HOME=/tmp/.local/share \
    HF_HOME=/tmp/hf \
    MPLCONFIGDIR=/tmp/.config/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 65532:65532

# ---- operator: the kopf operator with its liveness endpoint on :8080/healthz ----
FROM runtime AS operator
COPY --from=build /opt/kvgate /opt/kvgate
EXPOSE 8080
ENTRYPOINT ["kvgate", "run"]
CMD ["--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz"]

# ---- eval: the paired GSM8K accuracy Job ----
FROM runtime AS eval
COPY --from=build-eval /opt/kvgate /opt/kvgate
ENTRYPOINT ["kvgate", "eval"]

# ---- build-load: kvgate and inference-perf (pinned in the requirements file) on Python 3.12 ----
# Not trimmed: inference-perf's transformers may import what trim-venv drops.
FROM ${LOAD_PYTHON_IMAGE} AS build-load
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN python -m venv /opt/pip \
 && /opt/pip/bin/pip install --upgrade pip \
 && python -m venv --without-pip /opt/kvgate \
 && /opt/pip/bin/pip --python /opt/kvgate/bin/python install --no-compile . \
      -r operator/kvgate/load/requirements.txt

# ---- load: the load Job, both arms under inference-perf; the same user and /tmp as runtime ----
FROM ${LOAD_PYTHON_IMAGE} AS load
RUN groupadd --system --gid 65532 kvgate \
 && useradd --system --uid 65532 --gid 65532 --home-dir /tmp --no-create-home \
      --shell /usr/sbin/nologin kvgate
ENV PATH=/opt/kvgate/bin:$PATH \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    XDG_DATA_HOME=/tmp/.local/share \
    HF_HOME=/tmp/hf \
    MPLCONFIGDIR=/tmp/.config/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KVGATE_INFERENCE_PERF=/opt/kvgate/bin/inference-perf
WORKDIR /tmp
USER 65532:65532
COPY --from=build-load /opt/kvgate /opt/kvgate
ENTRYPOINT ["kvgate", "load-job"]
