# simnpu in one image: the device daemon (the default command) and its clients (the
# examples, or your own program). docker-compose.yml runs one daemon and several clients;
# docs/containers.md explains the setup.
#
#   docker build -t simnpu .
#   docker run --rm --init --shm-size 2g -e SIMNPU_MEMORY=256MiB simnpu     # a daemon
#
# The daemon listens on unix:///run/simnpu/simnpu.sock (owner-only: the simnpu user) and,
# when SIMNPU_LISTEN adds one, on TCP with a shared token (SIMNPU_TOKEN, SIMNPU_TOKEN_FILE).
# Its device memory lives in /dev/shm: give the container enough (shm_size).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /opt/simnpu

# The dependencies (and the build's own requirements) in a layer of their own, taken from
# pyproject.toml: a change of simnpu's code does not download them again.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb')); \
print('\n'.join(p['build-system']['requires'] + p['project']['dependencies']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The multihost extra for worlds across hosts (docs/multihost.md), only when asked for:
#   docker build --build-arg SIMNPU_EXTRAS=multihost -t simnpu:multihost .
# torch's CPU build, from PyTorch's own index (PyPI's torch is the CUDA build).
ARG SIMNPU_EXTRAS=""
RUN if [ "$SIMNPU_EXTRAS" = multihost ]; then \
        pip install torch --index-url https://download.pytorch.org/whl/cpu; \
    elif [ -n "$SIMNPU_EXTRAS" ]; then \
        echo "SIMNPU_EXTRAS: only 'multihost' is known, not '$SIMNPU_EXTRAS'" >&2; exit 1; \
    fi

# simnpu itself (setup.py compiles the protocol), then the examples the clients run.
COPY . .
RUN pip install --no-deps --no-build-isolation . \
 && rm -rf build simnpu.egg-info \
 && python -c "import simnpu.server.control.daemon, simnpu.client, acl, hccl"

# Not root: a non-privileged user owns the daemon's socket directory.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/simnpu \
        --shell /usr/sbin/nologin simnpu \
 && install -d -o simnpu -g simnpu -m 0700 /run/simnpu
USER simnpu

# Clients find the daemon here (a volume shared with the daemon's container) and never
# start one of their own.
ENV SIMNPU_ADDRESS=unix:///run/simnpu/simnpu.sock \
    SIMNPU_AUTOSTART=0
EXPOSE 50151

# `simnpu serve` handles SIGTERM itself (clients are told, workers stopped, shared memory
# unlinked); run it with an init (`--init`, compose `init: true`) to reap stray children.
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["simnpu", "health", "--quiet"]
CMD ["simnpu", "serve"]
