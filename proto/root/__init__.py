"""simnpu: a simulated Ascend-style NPU shared by many host processes.

Kernel authors need only `from simnpu import kernel`; host programs use `acl` (pyACL
compatible), `hccl`, or the Pythonic `simnpu.client`.
"""

from simnpu.proto.kernel_abi import kernel

__all__ = ["kernel"]
__version__ = "0.1.0"
