"""Three chained process wake-ups through POSIX semaphores (futexes): what a launch +
synchronize costs the machine itself.

A launch + synchronize of an empty kernel wakes three processes in turn: the client wakes
the daemon, the daemon an AI core, the AI core the client. `Chain` does the same with
nothing else: process A (the caller) posts to B, B posts to C, C posts to A. One round is
A's post to its own wake-up. B and C are relays, `python bench/wakeups.py relay IN OUT`.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import posix_ipc


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


if __name__ == "__main__":
    if sys.argv[1:2] != ["relay"] or len(sys.argv) != 4:
        raise SystemExit("usage: wakeups.py relay INBOUND OUTBOUND")
    relay(sys.argv[2], sys.argv[3])
