"""hostmem.check_pageable: what it proves of a host range before a copy touches it
(msync: mapped-ness only). The check
itself never touches the memory, so these run in the test process; the copies that use it
are tested against a daemon in tests/integration/test_copies.py."""

from __future__ import annotations

import ctypes
import mmap

import numpy as np
import pytest

from simnpu.client import hostmem
from simnpu.proto import codes
from simnpu.proto.errors import NpuError
from simnpu.shm.addresses import DEVICE_BASE

PAGE = mmap.PAGESIZE


@pytest.fixture
def pages():
    """Three pages of one mapping: read-write, read-only, inaccessible; and a fourth unmapped."""
    memory = mmap.mmap(-1, 4 * PAGE)
    base = ctypes.addressof(ctypes.c_char.from_buffer(memory))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    assert libc.mprotect(base + PAGE, PAGE, mmap.PROT_READ) == 0
    assert libc.mprotect(base + 2 * PAGE, PAGE, 0) == 0
    assert libc.munmap(base + 3 * PAGE, PAGE) == 0
    yield base, base + PAGE, base + 2 * PAGE, base + 3 * PAGE
    libc.mprotect(base, 3 * PAGE, mmap.PROT_READ | mmap.PROT_WRITE)


def refused(address: int, count: int, write: bool, why: str) -> None:
    with pytest.raises(NpuError) as info:
        hostmem.check_pageable(address, count, write, "dst" if write else "src")
    assert info.value.code == codes.ACL_ERROR_RT_PARAM_INVALID
    name = "dst" if write else "src"
    assert info.value.message.startswith(f"{name} {address:#x}: the {count} bytes"), info.value
    assert why in info.value.message, info.value


def test_what_the_check_proves(pages):
    """msync(MS_ASYNC) finds unmapped pages, not protections (the documented gap)."""
    good, read_only, no_access, gone = pages
    array = np.zeros(3 * PAGE + 5, np.uint8)
    hostmem.check_pageable(array.ctypes.data, array.nbytes, True, "dst")
    hostmem.check_pageable(good + 7, PAGE - 7, True, "dst")
    hostmem.check_pageable(read_only, PAGE, True, "dst")  # mapped: not refused
    hostmem.check_pageable(no_access, PAGE, False, "src")  # mapped: not refused
    refused(gone, PAGE, True, "are not mapped in this process")
    refused(no_access + PAGE // 2, PAGE, False, "are not mapped in this process")
    refused(0x1234, 16, True, "are not mapped in this process")
    refused(0x1234, 16, False, "are not mapped in this process")
    refused(DEVICE_BASE - 8, 16, False, "are not mapped in this process")
