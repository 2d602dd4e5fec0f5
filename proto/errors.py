"""The one exception type of simnpu: NpuError carries an ACL return code.

Callers branch on `.code`, never on the message. Out-of-memory is also a MemoryError.
Everything here pickles, so errors cross process boundaries (workers, tests) intact.
"""

from simnpu.proto import codes


class NpuError(Exception):
    """An ACL-level failure: `.code` is the ACL return code, `.message` says why; a task's
    failure reported by the daemon has the task's sequence number in `.task_seq`."""

    task_seq: int = 0

    def __init__(self, code: int, message: str = ""):
        self.code = int(code)
        self.message = message
        super().__init__(f"{codes.error_name(self.code)} ({self.code}): {message}")

    def __reduce__(self):
        return (type(self), (self.code, self.message))


class NpuMemoryError(NpuError, MemoryError):
    """Device memory could not be allocated (207001 unless stated otherwise)."""

    def __init__(self, message: str = "", code: int = codes.ACL_ERROR_RT_MEMORY_ALLOCATION):
        super().__init__(code, message)

    def __reduce__(self):
        return (type(self), (self.message, self.code))


class NotSupportedError(NpuError):
    """A call the simulated NPU does not simulate (ACL_ERROR_RT_FEATURE_NOT_SUPPORT)."""

    def __init__(self, what: str, code: int = codes.ACL_ERROR_RT_FEATURE_NOT_SUPPORT):
        super().__init__(code, f"{what} is not supported by the simulated NPU")
        self.what = what

    def __reduce__(self):
        return (type(self), (self.what, self.code))


def error_for(code: int, message: str = "") -> NpuError:
    """The exception an ACL code received from the daemon becomes (an out-of-memory code
    gives an NpuMemoryError, so that `except MemoryError` catches it on the client too)."""
    if code in (codes.ACL_ERROR_RT_MEMORY_ALLOCATION, codes.ACL_ERROR_RT_DEVICE_OOM):
        return NpuMemoryError(message, code)
    return NpuError(code, message)


def invalid(message: str) -> NpuError:
    """A runtime parameter error (107000), the code of most bad-input cases."""
    return NpuError(codes.ACL_ERROR_RT_PARAM_INVALID, message)


def check_num_blocks(num_blocks: int) -> None:
    """A launch's numBlocks is 1 to MAX_NUM_BLOCKS; else 107000, as the CANN runtime's
    rtKernelLaunch refuses 0 and more than 16 bits of blockDim."""
    if num_blocks < 1:
        raise invalid("numBlocks must be at least 1")
    if num_blocks > codes.MAX_NUM_BLOCKS:
        raise invalid(
            f"numBlocks {num_blocks} is more than the {codes.MAX_NUM_BLOCKS} blocks a launch "
            "may have"
        )


def bad_handle(kind: str, handle: int) -> NpuError:
    """An unknown, stale or foreign handle (107017)."""
    return NpuError(
        codes.ACL_ERROR_RT_INVALID_HANDLE, f"{kind} handle {handle:#x} is not valid in this session"
    )
