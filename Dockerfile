# One image for every stallwatch component: `stallwatch exporter`, `stallwatch restarter`,
# `stallwatch sim`. docker-compose.yml picks the subcommand and defines the healthchecks, so
# the image has none of its own.
#
# Build arguments, all optional:
#   BASE_IMAGE      any image with Python >= 3.11 whose `python` and `pip` are on PATH
#                   (default python:3.11-slim)
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
LABEL org.opencontainers.image.title="stallwatch" \
      org.opencontainers.image.description="Keep LLM model servers up without using what the health check guards" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
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
ENTRYPOINT ["stallwatch"]
CMD ["--help"]
