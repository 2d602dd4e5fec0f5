#!/bin/sh
# One "host" of docker-compose.yml's `multihost` profile: its own daemon and /dev/shm, and
# RANKS_PER_HOST rank processes beside it, of a job that spans every host through the seed
# daemon (SIMNPU_JOB_SEED). First the data-parallel example trains and checks itself
# against numpy; then the ranks all_reduce until a host is lost (examples/hccl_lost_host.py).
# The daemon keeps serving after its ranks are done. docs/multihost.md, docs/containers.md.
set -u
simnpu serve &
daemon=$!
until simnpu health --quiet 2>/dev/null; do sleep 0.5; done

run_ranks() {  # run_ranks JOB PROGRAM: RANKS_PER_HOST processes of PROGRAM in job JOB
    pids=""
    for _ in $(seq "$RANKS_PER_HOST"); do
        SIMNPU_JOB=$1 python "$2" &
        pids="$pids $!"
    done
    status=0
    for pid in $pids; do wait "$pid" || status=1; done
    echo "host $(hostname): job $1 ended with status $status"
}

run_ranks "${SIMNPU_JOB}-train" examples/hccl_data_parallel.py
run_ranks "${SIMNPU_JOB}-loss" examples/hccl_lost_host.py
wait "$daemon"
