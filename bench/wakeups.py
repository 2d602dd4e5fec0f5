"""Three chained process wake-ups through POSIX semaphores (futexes): what a launch +
synchronize costs the machine itself.

A launch + synchronize of an empty kernel wakes three processes in turn: the client wakes
the daemon, the daemon an AI core, the AI core the client. `Chain` does the same with
nothing else: process A (the caller) posts to B, B posts to C, C posts to A. One round is
A's post to its own wake-up. B and C are relays, `python bench/wakeups.py relay IN OUT`.

`python bench/wakeups.py waker-cost [COUNT]` prints (JSON) what waking a sleeping process
costs the waker, p50 in µs: posting a POSIX semaphore (a futex wake), and sending a small
pickled batch on a multiprocessing Connection to a process asleep in poll() on it (how the
daemon hands a worker its batch, and a worker its report to the daemon).
"""

from __future__ import annotations

import json
import os
import secrets
import select
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection

import posix_ipc

_BATCH = [(3, 17, 0, "empty", b"", 0, 1, 1, None, 0), (9, "/simnpu-1-s1-notify", 3, 1234)]
_ASLEEP_S = 0.0005  # between two wake-ups: the woken process is asleep again by then


class Chain:
    """The caller and two relay processes, woken in a ring; a context manager that stops the
    relays (by PID) and removes the semaphores."""

    def __init__(self) -> None:
        tag = f"/simnpu-bench-wake-{os.getpid()}-{secrets.token_hex(4)}"
        names = [f"{tag}-{index}" for index in range(3)]  # wakes A, B, C
        self._semaphores = [posix_ipc.Semaphore(name, posix_ipc.O_CREX) for name in names]
        self._relays: list[subprocess.Popen] = []
        try:
            for inbound, outbound in ((1, 2), (2, 0)):  # B: wakes C; C: wakes A
                self._relays.append(
                    subprocess.Popen(
                        [sys.executable, __file__, "relay", names[inbound], names[outbound]]
                    )
                )
            self._semaphores[1].release()  # the first round: both relays have opened theirs
            self._semaphores[0].acquire(60)
        except BaseException:
            self.close()
            raise
        finally:
            for name in names:
                posix_ipc.unlink_semaphore(name)  # open handles stay valid; nothing is left

    def rounds(self, count: int) -> list[float]:
        """`count` rounds A -> B -> C -> A, each in seconds."""
        wake_b, wake_a = self._semaphores[1], self._semaphores[0]
        samples = []
        clock = time.perf_counter
        for _ in range(count):
            start = clock()
            wake_b.release()
            wake_a.acquire()
            samples.append(clock() - start)
        return samples

    def close(self) -> None:
        for relay in self._relays:
            relay.kill()
            relay.wait()
        for semaphore in self._semaphores:
            semaphore.close()

    def __enter__(self) -> Chain:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def relay(inbound: str, outbound: str) -> None:
    """Wait on `inbound`, post `outbound`, until killed."""
    wait, post = posix_ipc.Semaphore(inbound), posix_ipc.Semaphore(outbound)
    while True:
        wait.acquire()
        post.release()


def waker_cost(count: int = 3000) -> dict[str, float]:
    """p50 µs the waker spends waking a process asleep on a semaphore, and on a socket."""
    name = f"/simnpu-bench-sleeper-{os.getpid()}-{secrets.token_hex(4)}"
    semaphore = posix_ipc.Semaphore(name, posix_ipc.O_CREX)
    ours, theirs = socket.socketpair()
    sleepers = [
        subprocess.Popen(
            [sys.executable, __file__, "sleep-semaphore", name], stdout=subprocess.PIPE
        ),
        subprocess.Popen(
            [sys.executable, __file__, "sleep-socket", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
        ),
    ]
    theirs.close()
    connection = Connection(ours.detach())
    try:
        assert sleepers[0].stdout is not None  # (a pipe)
        sleepers[0].stdout.readline()  # it has opened the semaphore
        posix_ipc.unlink_semaphore(name)  # the open handles stay valid
        figures = {}
        for kind, wake in (
            ("futex", semaphore.release),
            ("socket", lambda: connection.send(_BATCH)),
        ):
            samples = []
            for _ in range(count):
                time.sleep(_ASLEEP_S)
                start = time.perf_counter()
                wake()
                samples.append(time.perf_counter() - start)
            samples.sort()
            figures[f"{kind}_p50_us"] = samples[len(samples) // 2] * 1e6
        return figures
    finally:
        connection.close()
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
            if sleeper.stdout is not None:
                sleeper.stdout.close()
        semaphore.close()


def sleep_on_semaphore(name: str) -> None:
    """Take every post of semaphore `name`, until killed."""
    semaphore = posix_ipc.Semaphore(name)
    print("ready", flush=True)
    while True:
        semaphore.acquire()


def sleep_on_socket(fd: int) -> None:
    """Receive every message on socket `fd`, asleep in poll() between them, until its end
    closes."""
    connection = Connection(fd)
    incoming = select.poll()
    incoming.register(fd, select.POLLIN)
    while True:
        incoming.poll()
        try:
            connection.recv()
        except EOFError:
            return


if __name__ == "__main__":
    command = sys.argv[1:2]
    if command == ["relay"] and len(sys.argv) == 4:
        relay(sys.argv[2], sys.argv[3])
    elif command == ["waker-cost"] and len(sys.argv) <= 3:
        print(json.dumps(waker_cost(*map(int, sys.argv[2:]))))
    elif command == ["sleep-semaphore"] and len(sys.argv) == 3:
        sleep_on_semaphore(sys.argv[2])
    elif command == ["sleep-socket"] and len(sys.argv) == 3:
        sleep_on_socket(int(sys.argv[2]))
    else:
        raise SystemExit("usage: wakeups.py relay INBOUND OUTBOUND | waker-cost [COUNT]")
