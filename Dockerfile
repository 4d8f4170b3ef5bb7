# syntax=docker/dockerfile:1
# One image for every Shoal component: `shoal broker`, `shoal gateway`,
# `shoal operator` (and the CLI). Build from the repository root:
#
#   docker build -t shoal:dev .
#
# The base is pinned to an exact Python and Debian release. It is not pinned
# by digest: this repository is built where no registry can be asked, so a
# digest here could not be checked. To pin it, take the digest from
# `docker buildx imagetools inspect python:3.11.13-slim-bookworm` and append
# @sha256:<digest> to both FROM lines (and the ARG below).
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

# -- build: the shoal wheel and the wheels of everything it depends on ------------
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
# Only what the wheel is built from: the package folders mapped in
# pyproject.toml (tests/unit/test_dockerfile.py keeps this list complete).
COPY pyproject.toml README.md ./
COPY shoal shoal
COPY broker broker
COPY tenancy tenancy
COPY gateway gateway
COPY connector connector
COPY operator operator
COPY benchmarks benchmarks
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# -- runtime: a virtualenv with those wheels, nothing else ------------------------
FROM ${PYTHON_IMAGE}
ENV PATH=/opt/shoal/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Installed from the build stage's wheels only: the runtime stage never
# reaches an index, so it gets exactly what the build stage resolved.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m venv /opt/shoal \
    && /opt/shoal/bin/pip install --no-cache-dir --no-index --find-links=/wheels shoal \
    && /opt/shoal/bin/pip uninstall --yes pip
# A numeric user, so that Kubernetes' runAsNonRoot can verify it; the Helm
# chart and the operator's pods run as this uid with a read-only root.
RUN groupadd --system --gid 10001 shoal \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin shoal
USER 10001:10001
WORKDIR /tmp
ENTRYPOINT ["shoal"]
CMD ["--help"]
