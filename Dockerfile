# syntax=docker/dockerfile:1
# hypocenter as a container: `docker build -t hypocenter .`
#
# The image listens on 0.0.0.0 (a container is reached through its published ports), so the server
# refuses to start until it has tokens: mount a tokens file (YAML: ingest | read | admin -> list of
# tokens) at /run/secrets/hypocenter-tokens, or set HYPOCENTER_AUTH_TOKEN_INGEST/_READ/_ADMIN, or
# (a laptop, a private network) pass --allow-unauthenticated. /healthz, /readyz, gRPC health and
# /metrics need no token. tests/deploy/test_image.py runs this file's RUN steps in a clean virtualenv.

ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- build: one wheel for hypocenter (with the rule catalog inside) and wheels for its dependencies
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY hypocenter ./hypocenter
COPY rules ./rules
RUN python -m pip wheel --no-cache-dir --wheel-dir /wheels '.[postgresql]'

# ---- runtime: the wheels installed, nothing else (no compiler, no source tree, no curl)
FROM ${PYTHON_IMAGE}
RUN groupadd --system --gid 10001 hypocenter \
    && useradd --system --uid 10001 --gid hypocenter --home-dir /var/lib/hypocenter --no-create-home \
       --shell /usr/sbin/nologin hypocenter \
    && install -d -o hypocenter -g hypocenter -m 0750 /var/lib/hypocenter
# DL3013: the only index is the wheels just built (--no-index), pinned by the build stage.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-cache-dir --no-index --find-links /wheels 'hypocenter[postgresql]'

# DL3064: the tokens file's path, not a token.
# hadolint ignore=DL3064
ENV PYTHONUNBUFFERED=1 \
    HYPOCENTER_GRPC_LISTEN=0.0.0.0:4317 \
    HYPOCENTER_HTTP_LISTEN=0.0.0.0:4318 \
    HYPOCENTER_METRICS_LISTEN=0.0.0.0:9464 \
    HYPOCENTER_STORE=/var/lib/hypocenter/hypocenter.db \
    HYPOCENTER_AUTH_TOKENS_FILE=/run/secrets/hypocenter-tokens

# OTLP/gRPC + hypocenter.v1, OTLP/HTTP + REST, Prometheus /metrics
EXPOSE 4317 4318 9464
# The SQLite store (or nothing, with HYPOCENTER_STORE=postgresql://…)
VOLUME ["/var/lib/hypocenter"]
WORKDIR /var/lib/hypocenter
USER 10001:10001

HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:4318/readyz', timeout=4).status != 200)"]

ENTRYPOINT ["hypocenter"]
CMD ["serve"]
