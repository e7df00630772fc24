# Fleet's image for compose.yaml: the CLI, the workers (with gcc for the command workloads and bubblewrap for
# their sandbox) and Flower.
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev bubblewrap \
    && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md /src/
COPY fleet /src/fleet
RUN pip install --no-cache-dir "/src[ops]" && rm -rf /src

# Workers run unprivileged; their state and artifact cache live in the volume mounted here.
RUN useradd --system --create-home --home-dir /var/lib/fleet --uid 10001 fleet
USER fleet
WORKDIR /var/lib/fleet
ENV FLEET_HOME=/var/lib/fleet PYTHONUNBUFFERED=1
CMD ["fleet", "--help"]
