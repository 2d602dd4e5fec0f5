"""The simulated device address space.

Device pointers lie at 2**47 and above, outside any user-space host address on Linux
x86-64/aarch64, so a copy of kind ACL_MEMCPY_DEFAULT and memset can tell host from device
by the number alone. Device d owns [DEVICE_BASE + d * DEVICE_SPAN, ... + DEVICE_SPAN).
"""

DEVICE_BASE = 1 << 47
DEVICE_SPAN = 1 << 40  # 1 TiB of address space per device
MAX_MEMORY = DEVICE_SPAN // 2  # a device's memory, at most; the upper half is left for
# reserved virtual address ranges (docs/device-memory.md)


def device_address(device: int, offset: int) -> int:
    return DEVICE_BASE + device * DEVICE_SPAN + offset


def is_device_address(address: int) -> bool:
    return address >= DEVICE_BASE


def split_device_address(address: int) -> tuple[int, int]:
    """(device index, offset in its memory) of a device address."""
    device, offset = divmod(address - DEVICE_BASE, DEVICE_SPAN)
    return device, offset
