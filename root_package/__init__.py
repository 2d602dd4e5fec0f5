"""simnpu: a simulated Ascend-style NPU shared by many host processes.

Kernel authors need only `from simnpu import kernel`; host programs use `acl` (pyACL
compatible), `hccl`, or the Pythonic `simnpu.client`.
"""

__all__ = ["kernel"]
__version__ = "0.1.0"


def __getattr__(name: str):
    # `kernel` is imported on first use: a host program's session does not need it
    if name == "kernel":
        from simnpu.proto.kernel_abi import kernel

        globals()["kernel"] = kernel
        return kernel
    raise AttributeError(f"module 'simnpu' has no attribute {name!r}")
