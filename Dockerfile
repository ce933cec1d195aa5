# syntax=docker/dockerfile:1
# The gpu-operator image: one image runs the controller (`gpu-operator controller`), the CRD
# hooks (`gpu-operator crds --apply`) and every node agent (`gpu-operator agent ...`).

# Pinned by digest (the multi-arch index of the 3.12.8-slim-bookworm tag): a re-pushed tag cannot
# change what we build on. Update tag and digest together. Any base with a `python` (3.11+) that
# has the venv module, `groupadd`/`useradd` and a /bin/sh works: scripts/build-image passes a
# Debian rootfs it makes with mmdebstrap (`--build-arg PYTHON_IMAGE=localhost/...`) where no
# registry but Debian's is reachable.
ARG PYTHON_IMAGE=python:3.12.8-slim-bookworm@sha256:2199a62885a12290dc9c5be3ca0681d367576ab7bf037da120e564723292a2f0

# ---- build: a wheel of the project and of every dependency -------------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md requirements.lock ./
COPY src ./src
# Dependencies come only from requirements.lock, each checked against its hashes
# (pip-compile --generate-hashes, see docs/security.md); the project wheel adds none of its own.
# pip from a virtual environment: a distribution's Python may have no pip of its own. A build
# behind a TLS-intercepting proxy passes its CA bundle as the secret `pip-ca` (build-image does).
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python -m venv /build-venv \
    && /build-venv/bin/python -m pip wheel --require-hashes --wheel-dir /wheels \
        -r requirements.lock \
    && /build-venv/bin/python -m pip wheel --no-deps --wheel-dir /wheels . \
    && cp requirements.lock /wheels/

# ---- runtime: the wheels installed into a virtual environment, run as a non-root user ----------
FROM ${PYTHON_IMAGE} AS runtime
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PATH=/opt/gpu-operator/bin:$PATH
# The digest of the sources (scripts/build-image passes it): podman/buildah keys a cached RUN on its
# text and the stage's build arguments, not on what it mounts from the build stage, so without it
# a source change would reuse this layer with the old code in it.
ARG SOURCE_DIGEST=unset
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    echo "gpu-operator sources $SOURCE_DIGEST" \
    && python -m venv /opt/gpu-operator \
    && /opt/gpu-operator/bin/pip install --no-index --find-links=/wheels --require-hashes \
        -r /wheels/requirements.lock \
    && /opt/gpu-operator/bin/pip install --no-index --no-deps --find-links=/wheels gpu-operator-py \
    && /opt/gpu-operator/bin/python -m compileall -q /opt/gpu-operator/lib \
    && /opt/gpu-operator/bin/python -m gpu_operator.agents.entrypoints install \
        /opt/gpu-operator/bin /opt/gpu-operator/bin/python \
    && /opt/gpu-operator/bin/python -m pip uninstall --yes --quiet pip setuptools \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin nonroot

LABEL org.opencontainers.image.title="gpu-operator" \
      org.opencontainers.image.description="API-compatible NVIDIA GPU Operator in Python" \
      org.opencontainers.image.licenses="Apache-2.0"

# NVIDIA's entry-point names (nvidia-device-plugin, nvidia-validator, ...: docs/image.md) are
# scripts next to `gpu-operator` in /opt/gpu-operator/bin, each running our agent, so an operand
# section pointed at this image starts it with NVIDIA's command line. Node agents run as root
# (their pods say runAsUser: 0); the operator itself runs as this user.
# Numeric, so Kubernetes can verify runAsNonRoot without resolving names.
USER 65532:65532
WORKDIR /tmp
ENTRYPOINT ["gpu-operator"]
CMD ["controller", "--leader-elect"]
