# The ichord image: Debian bookworm's python3 (3.11), ichord and its pinned dependencies in a venv at
# /opt/ichord, run as UID 65532 with a read-only root filesystem (the chart mounts /tmp and the
# trust directory as emptyDirs). scripts/image.sh builds the same root filesystem without a Docker
# engine (mmdebstrap + the same venv + umoci) and starts it; keep the two recipes in step.
#
#   docker build --build-arg VERSION=$(python3 -c 'import ichord; print(ichord.__version__)') -t ichord .
#
# Debian's python3 rather than the python:3.11-slim image: it is what the daemonless build can
# install from apt, so the image the tests start is the image this file builds.
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY ichord ./ichord
# ichord's wheel and exactly the pinned wheels of its dependencies (constraints.txt), then a venv
# holding them, installed by pip run from its wheel (no pip left in the image); scripts/image.sh
# does the same in its chroot.
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --upgrade pip \
    && /opt/build/bin/pip wheel --no-cache-dir --wheel-dir /wheels -c constraints.txt . pip \
    && python3 -m venv --without-pip /opt/ichord \
    && set -- /wheels/pip-*.whl \
    && /opt/ichord/bin/python "$1/pip" install --no-cache-dir --no-index --disable-pip-version-check \
        --find-links /wheels ichord

FROM ${BASE}
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="ichord" \
      org.opencontainers.image.description="Keeps Talos Linux clusters' certificate authorities and configuration safe" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/maesh/ichord" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 ca-certificates libstdc++6 \
    && rm -rf /var/lib/apt/lists/* \
    && echo 'nonroot:x:65532:65532:nonroot:/home/nonroot:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'nonroot:x:65532:' >> /etc/group \
    && install -d -o 65532 -g 65532 -m 0700 /home/nonroot
COPY --from=build /opt/ichord /opt/ichord
# No .pyc written at run time (the root filesystem is read-only; pip compiled them at install).
ENV PATH=/opt/ichord/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /home/nonroot
ENTRYPOINT ["ichord"]
CMD ["run"]
