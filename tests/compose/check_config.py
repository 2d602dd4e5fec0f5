"""The project's rules for docker-compose.yml, checked on `docker compose config --format json`.

    docker compose config --format json | python tests/compose/check_config.py

Prints one line per broken rule and exits 1 if any; `docker compose config -q` has already
checked the file against the compose specification.
"""

import json
import sys

SERVER = "npu"


def problems(config: dict) -> list[str]:
    services = config.get("services", {})
    found = []
    npu = services.get(SERVER)
    if npu is None:
        return [f"no service {SERVER!r}"]
    if npu.get("ipc") != "shareable":
        found.append(f"{SERVER}: ipc is {npu.get('ipc')!r}, not 'shareable'")
    if not npu.get("init"):
        found.append(f"{SERVER}: init is not true")
    if int(npu.get("shm_size") or 0) < 1 << 30:
        found.append(
            f"{SERVER}: shm_size {npu.get('shm_size')!r} is under 1 GiB (what 4 ranks hold)"
        )
    if "healthcheck" not in npu or npu["healthcheck"].get("disable"):
        found.append(f"{SERVER}: no healthcheck")
    for port in npu.get("ports", []):
        if port.get("host_ip") != "127.0.0.1":
            found.append(
                f"{SERVER}: port {port.get('target')} is published on "
                f"{port.get('host_ip') or 'every interface'}, not 127.0.0.1"
            )
    environment = npu.get("environment") or {}
    if "SIMNPU_TOKEN" in environment and environment["SIMNPU_TOKEN"] not in ("", None):
        found.append(f"{SERVER}: a fixed SIMNPU_TOKEN is written in the file")
    rank = services.get("rank", {})
    if rank.get("ipc") != f"service:{SERVER}":
        found.append(f"rank: ipc is {rank.get('ipc')!r}, not 'service:{SERVER}'")
    if not {"SIMNPU_JOB", "SIMNPU_WORLD_SIZE"} <= set(rank.get("environment") or {}):
        found.append("rank: SIMNPU_JOB and SIMNPU_WORLD_SIZE are not both set")
    remote = services.get("remote", {})
    if str(remote.get("ipc", "")).startswith(("service:", "container:", "host")):
        found.append(f"remote: ipc {remote.get('ipc')!r} shares memory; it must not")
    for name, service in services.items():
        if name != SERVER and service.get("pull_policy") != "never":
            found.append(f"{name}: pull_policy is not 'never' (the image is built by {SERVER})")
    return found


if __name__ == "__main__":
    broken = problems(json.load(sys.stdin))
    for line in broken:
        print(line)
    sys.exit(1 if broken else 0)
