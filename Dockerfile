# One image for every stallwatch component: `stallwatch exporter`, `stallwatch restarter`,
# `stallwatch sim`. docker-compose.yml picks the subcommand and defines each service's
# healthcheck; the image's own HEALTHCHECK asks $STALLWATCH_HEALTHCHECK_URL (the exporter's
# /-/healthy by default; set it to http://127.0.0.1:9733/-/healthy for the restarter). Docker
# keeps a HEALTHCHECK only in its own image format (podman: `podman build --format docker`);
# Kubernetes uses its probes instead.
#
# Build arguments, all optional:
#   BASE_IMAGE      any image with Python >= 3.11 whose `python` and `pip` are on PATH
#                   (default python:3.11-slim)
#   VERSION, REVISION, SOURCE
#                   the OCI labels org.opencontainers.image.version (stallwatch's version),
#                   .revision (the commit: --build-arg REVISION=$(git rev-parse HEAD)), .source
#                   (the URL of the repository the image was built from; empty by default)
#   PIP_INDEX_URL, PIP_FIND_LINKS, PIP_NO_INDEX
#                   read by pip in the build stage only: a package index of your own, or wheels
#                   of stallwatch's dependencies and setuptools with no index at all (offline)
ARG BASE_IMAGE=python:3.11-slim

# --- build: wheels for stallwatch and its dependencies -------------------------------------
FROM ${BASE_IMAGE} AS build
ARG PIP_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
WORKDIR /src
COPY pyproject.toml README.md ./
COPY stallwatch ./stallwatch
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

# --- runtime ---------------------------------------------------------------------------------
FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG SOURCE=
LABEL org.opencontainers.image.title="stallwatch" \
      org.opencontainers.image.description="Keep LLM model servers up without using what the health check guards" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    STALLWATCH_HEALTHCHECK_URL=http://127.0.0.1:9732/-/healthy
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-index --find-links=/wheels stallwatch \
    && rm -rf /wheels \
    && groupadd --system --gid 10001 stallwatch \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin stallwatch \
    && mkdir -p /var/lib/stallwatch /etc/stallwatch \
    && chown stallwatch:stallwatch /var/lib/stallwatch
# The restarter's journal lives here; a named volume mounted on it inherits this ownership.
VOLUME ["/var/lib/stallwatch"]
WORKDIR /var/lib/stallwatch
USER 10001:10001
EXPOSE 9732 9733 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['STALLWATCH_HEALTHCHECK_URL'], timeout=4)"]
ENTRYPOINT ["stallwatch"]
CMD ["--help"]
