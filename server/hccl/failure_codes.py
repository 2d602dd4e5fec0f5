"""How a failed HCCL collective is reported: (the ACL code its rank's synchronize returns,
the HcclResult HcclGetCommAsyncError returns)."""

from simnpu.proto import codes
from simnpu.proto import hccl_types as ht

MISMATCH = (codes.ACL_ERROR_RT_PARAM_INVALID, ht.HCCL_E_PARA)
TIMEOUT = (codes.ACL_ERROR_RT_TASK_TIMEOUT, ht.HCCL_E_TIMEOUT)
REMOTE = (codes.ACL_ERROR_RT_COMM_OP_RETRY_FAIL, ht.HCCL_E_REMOTE)
# a replayed collective whose rank destroyed the communicator after capturing it: as an
# eager call on a destroyed communicator, a bad argument (HcclResult HCCL_E_PARA)
DESTROYED = (codes.ACL_ERROR_RT_PARAM_INVALID, ht.HCCL_E_PARA)
