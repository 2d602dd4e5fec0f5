"""The least rights a process that runs a client's kernels keeps (docs/kernel-isolation.md).

`enter(policy)` is called by such a process on itself, after it has mapped its memory and
opened what it needs, before it runs any kernel. Every part is a Linux feature called
through ctypes:

- PR_SET_PDEATHSIG: it dies with its parent (the daemon), checked against a race.
- PR_SET_NO_NEW_PRIVS, and resource limits: address space, file size, no core dumps.
- Landlock: files are read only under `policy.readable`, written only under
  `policy.scratch`; with ABI 4+ TCP bind/connect are refused, with ABI 6+ signals to and
  abstract Unix sockets of processes outside the sandbox.
- seccomp: no sockets, no new processes or programs, no tracing or reading of other
  processes, no call that takes another process's pid (its limits, priority, scheduling,
  affinity, pages, group), no remapping of its memory, no mounts, namespaces, io_uring,
  BPF, module or permission changes; each such call fails with EPERM (clone3 with ENOSYS,
  so the C library falls back to clone, whose flags a filter can see: threads stay
  allowed).

`enter` returns which parts are in force; a part the kernel lacks is reported, not
raised, so the caller can log it once.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import resource
import signal
import struct
from dataclasses import dataclass, field

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_SECCOMP = 22
_SECCOMP_MODE_FILTER = 2


@dataclass(frozen=True)
class Policy:
    """What a sandboxed process may still do."""

    readable: tuple[str, ...]  # directories whose files it may read (and map, and run)
    scratch: str  # the one directory it may write in
    parent: int  # the pid it must die with
    address_space: int = 8 << 30  # RLIMIT_AS in bytes
    file_size: int = 256 << 20  # RLIMIT_FSIZE in bytes


@dataclass
class InForce:
    """Which parts of the sandbox hold (False: the running kernel lacks the feature)."""

    landlock_abi: int = 0
    seccomp: bool = False
    missing: list[str] = field(default_factory=list)


def enter(policy: Policy) -> InForce:
    """Put the calling process in the sandbox, irreversibly. Blocks nothing."""
    _die_with(policy.parent)
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (policy.file_size, policy.file_size))
    resource.setrlimit(resource.RLIMIT_AS, (policy.address_space, policy.address_space))
    state = InForce()
    state.landlock_abi = _landlock(policy)
    if not state.landlock_abi:
        state.missing.append("Landlock (file and network rules)")
    state.seccomp = _seccomp()
    if not state.seccomp:
        state.missing.append(f"seccomp (no filter for {platform.machine()})")
    return state


def unavailable() -> list[str]:
    """The parts `enter` cannot put in force on this machine (to be said once)."""
    missing = []
    if not landlock_abi():
        missing.append("Landlock (file and network rules)")
    if platform.machine() != "x86_64":
        missing.append(f"seccomp (no filter for {platform.machine()})")
    return missing


def _die_with(parent: int) -> None:
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent:  # it died before the death signal was armed
        os._exit(1)


# ---- Landlock ------------------------------------------------------------------------------------
_SYS_LANDLOCK_CREATE_RULESET, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT_SELF = 444, 445, 446
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_FS_EXECUTE, _FS_WRITE_FILE, _FS_READ_FILE, _FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_ALL_ABI1 = (1 << 13) - 1  # execute .. make_sym
_FS_REFER, _FS_TRUNCATE, _FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1
_READ = _FS_EXECUTE | _FS_READ_FILE | _FS_READ_DIR


def landlock_abi() -> int:
    """The Landlock ABI version of the running kernel (0: none)."""
    version = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _CREATE_RULESET_VERSION)
    return max(int(version), 0)


def _landlock(policy: Policy) -> int:
    abi = landlock_abi()
    if abi < 1:
        return 0
    handled = _FS_ALL_ABI1
    if abi >= 2:
        handled |= _FS_REFER
    if abi >= 3:
        handled |= _FS_TRUNCATE
    if abi >= 5:
        handled |= _FS_IOCTL_DEV
    net = _NET_BIND_TCP | _NET_CONNECT_TCP if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("=QQQ", handled, net, scoped)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    buffer = ctypes.create_string_buffer(attr[:size], size)
    ruleset = _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, buffer, size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in policy.readable:
            _allow(ruleset, path, _READ & handled)
        _allow(ruleset, policy.scratch, handled & ~_FS_EXECUTE)
        if _libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)
    return abi


def _allow(ruleset: int, path: str, access: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except FileNotFoundError:
        return  # nothing there to allow
    try:
        if not os.path.isdir(path):  # rules on files take file rights only
            access &= _FS_EXECUTE | _FS_READ_FILE | _FS_WRITE_FILE | _FS_TRUNCATE
        rule = ctypes.create_string_buffer(struct.pack("=Qi", access, fd), 12)
        if _libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _RULE_PATH_BENEATH, rule, 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
    finally:
        os.close(fd)


# ---- seccomp -------------------------------------------------------------------------------------
_AUDIT_ARCH_X86_64 = 0xC000003E
_CLONE_THREAD = 0x00010000
# x86-64 system calls a kernel has no business making (numbers from asm/unistd_64.h)
_DENIED_X86_64 = {
    "socket": 41,
    "connect": 42,
    "accept": 43,
    "bind": 49,
    "listen": 50,
    "socketpair": 53,
    "fork": 57,
    "vfork": 58,
    "execve": 59,
    "chmod": 90,
    "fchmod": 91,
    "chown": 92,
    "fchown": 93,
    "lchown": 94,
    "ptrace": 101,
    "mknod": 133,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "setxattr": 188,
    "lsetxattr": 189,
    "fsetxattr": 190,
    "removexattr": 197,
    "lremovexattr": 198,
    "fremovexattr": 199,
    "tkill": 200,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "mknodat": 259,
    "fchownat": 260,
    "fchmodat": 268,
    "unshare": 272,
    "accept4": 288,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "memfd_create": 319,
    "kexec_file_load": 320,
    "bpf": 321,
    "execveat": 322,
    "userfaultfd": 323,
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "pidfd_open": 434,
    "pidfd_getfd": 438,
    "fchmodat2": 452,
    # the mapping of its memory: a remapped or grown window could reach further into the
    # device's segment (the C library's realloc falls back to copying)
    "mremap": 25,
    "remap_file_pages": 216,
    # other processes: their groups, sessions, resources, pages and handles
    "setpgid": 109,
    "setsid": 112,
    "migrate_pages": 256,
    "move_pages": 279,
    "kcmp": 312,
    "process_madvise": 440,
    "process_mrelease": 448,
}
# calls whose first argument is a pid: allowed for 0 (the caller) and its own pid only
_OWN_PID_ARG0_X86_64 = {
    "rt_sigqueueinfo": 129,
    "sched_setparam": 142,
    "sched_getparam": 143,
    "sched_setscheduler": 144,
    "sched_getscheduler": 145,
    "sched_rr_get_interval": 148,
    "getpgid": 121,
    "getsid": 124,
    "sched_setaffinity": 203,
    "sched_getaffinity": 204,
    "get_robust_list": 274,
    "rt_tgsigqueueinfo": 297,
    "prlimit64": 302,
    "sched_setattr": 314,
    "sched_getattr": 315,
}
# calls of (which, who): allowed for which = a process (0 for priorities, 1 for I/O
# priorities) and who 0 or its own pid; a process group or a user is refused
_OWN_PROCESS_WHO_X86_64 = {
    "getpriority": (140, 0),
    "setpriority": (141, 0),
    "ioprio_set": (251, 1),
    "ioprio_get": (252, 1),
}
_SYS_KILL_X86_64, _SYS_TGKILL_X86_64 = 62, 234
_SYS_CLONE_X86_64, _SYS_CLONE3_X86_64 = 56, 435

# BPF (linux/filter.h, linux/seccomp.h)
_LD_W_ABS, _JEQ_K, _JSET_K, _RET_K = 0x20, 0x15, 0x45, 0x06
_RET_ALLOW, _RET_ERRNO, _RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
_OFF_NR, _OFF_ARCH, _OFF_ARG0_LOW, _OFF_ARG1_LOW = 0, 4, 16, 24


def _seccomp() -> bool:
    if platform.machine() != "x86_64":
        return False
    program = _filter_x86_64(os.getpid())
    code = b"".join(struct.pack("=HBBI", *insn) for insn in program)
    buffer = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("=HxxxxxxQ", len(program), ctypes.addressof(buffer))
    fprog_buffer = ctypes.create_string_buffer(fprog, len(fprog))
    if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.addressof(fprog_buffer), 0, 0):
        if ctypes.get_errno() in (errno.EINVAL, errno.EPERM, errno.ENOSYS):  # not allowed here
            return False
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")
    return True


def _filter_x86_64(own_pid: int) -> list[tuple[int, int, int, int]]:
    """The filter: (code, jump-if-true, jump-if-false, k) instructions."""
    deny = (_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)
    allow = (_RET_K, 0, 0, _RET_ALLOW)
    program = [
        (_LD_W_ABS, 0, 0, _OFF_ARCH),
        (_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64),
        (_RET_K, 0, 0, _RET_KILL_PROCESS),  # another ABI (x32, i386) on an x86-64 kernel
        (_LD_W_ABS, 0, 0, _OFF_NR),
        (_JEQ_K, 0, 1, _SYS_CLONE3_X86_64),
        (_RET_K, 0, 0, _RET_ERRNO | errno.ENOSYS),  # the C library falls back to clone
    ]
    for number in sorted(_DENIED_X86_64.values()):
        program += [(_JEQ_K, 0, 1, number), deny]
    # clone: threads only
    program += [
        (_JEQ_K, 0, 4, _SYS_CLONE_X86_64),
        (_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
        (_JSET_K, 1, 0, _CLONE_THREAD),
        deny,
        allow,
    ]
    # kill / tgkill: this process only (its own threads, raise())
    program += [
        (_JEQ_K, 1, 0, _SYS_KILL_X86_64),
        (_JEQ_K, 0, 4, _SYS_TGKILL_X86_64),
        (_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
        (_JEQ_K, 1, 0, own_pid),
        deny,
        allow,
    ]
    # a pid argument (a pid_t: the kernel reads its low 32 bits): the caller only
    for number in sorted(_OWN_PID_ARG0_X86_64.values()):
        program += [
            (_JEQ_K, 0, 5, number),
            (_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
            (_JEQ_K, 2, 0, 0),
            (_JEQ_K, 1, 0, own_pid),
            deny,
            allow,
        ]
    for number, process in sorted(_OWN_PROCESS_WHO_X86_64.values()):
        program += [
            (_JEQ_K, 0, 7, number),
            (_LD_W_ABS, 0, 0, _OFF_ARG0_LOW),
            (_JEQ_K, 0, 3, process),
            (_LD_W_ABS, 0, 0, _OFF_ARG1_LOW),
            (_JEQ_K, 2, 0, 0),
            (_JEQ_K, 1, 0, own_pid),
            deny,
            allow,
        ]
    program.append(allow)
    return program
