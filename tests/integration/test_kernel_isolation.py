"""Kernel isolation (docs/kernel-isolation.md): a client's own kernels run in processes of
that client alone, which map only its device memory and live in the sandbox; built-in
kernels stay in the trusted workers.

Hostile kernels try to reach other clients' memory, the daemon's files and processes, and
code other clients share. Kernels cannot write files, so each reports how its attempt
ended into a device buffer of its own, which the test copies back.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest
from conftest import DaemonProcess, round_trip, run_client, runtime_of

from simnpu.proto import codes
from simnpu.proto.errors import NpuError

PAGE = 4096
SPAN = 32  # bytes a memory attack reads or overwrites; also the victim's secret
OUT = 64  # an attacker's buffer: int64 status and errno, then at DATA the bytes it read
DATA = 32
HOWS = ("maps", "base", "as_strided", "string_at", "scan")  # ways of reaching memory
MODES = ("read", "write")
WORKED, REFUSED, OS_ERROR, RAISED = 1, 2, 3, 4  # how an attempt ended, as kernels report it
REFUSALS = (errno.EACCES, errno.EPERM)  # the errno of a PermissionError

REPORT = """
WORKED, REFUSED, OS_ERROR, RAISED = 1, 2, 3, 4


def report(ctx, out, action):
    \"\"\"Run action(); write how it ended into out: int64 status, errno.\"\"\"
    cells = ctx.gm(out, "int64", 2)
    try:
        action()
        cells[:] = WORKED, 0
    except PermissionError as error:
        cells[:] = REFUSED, error.errno or 0
    except OSError as error:
        cells[:] = OS_ERROR, error.errno or 0
    except Exception:
        cells[:] = RAISED, 0
"""

# ---- another client's memory --------------------------------------------------------------------
MEMORY_ATTACKS = (
    f"""
import ctypes
import gc
import mmap

import numpy as np
from simnpu import kernel

HOWS = {HOWS!r}
SPAN, OUT, DATA = {SPAN}, {OUT}, {DATA}
DEVICE_BASE, DEVICE_SPAN = 1 << 47, 1 << 40
JUNK = b"\\xee" * SPAN
"""
    + REPORT
    + '''

def view(ctx, mine, own, victim, how):
    """A writable view of SPAN bytes at device address `victim`, reached from `mine`, the
    kernel's view of its own buffer at device address `own`."""
    if how == "maps":
        device, offset = divmod(victim - DEVICE_BASE, DEVICE_SPAN)
        return np.frombuffer(ctx._maps[device], np.uint8, SPAN, offset)
    if how == "base":
        root = mine
        while isinstance(root, np.ndarray):
            root = root.base
        whole = np.frombuffer(root, np.uint8)
        start = mine.ctypes.data - whole.ctypes.data + victim - own
        if not 0 <= start <= whole.size - SPAN:
            raise IndexError("the address is outside the mapping behind the view")
        return whole[start : start + SPAN]
    rows = np.lib.stride_tricks.as_strided(mine, shape=(2, SPAN), strides=(victim - own, 1))
    return rows[1]


def mappings(ctx):
    """Every mmap gc can reach in this process, ctx._maps' first."""
    found = {}
    for holder in [getattr(ctx, "_maps", ())] + gc.get_objects():
        if isinstance(holder, dict):
            items = list(holder.values())
        elif isinstance(holder, (list, tuple)):
            items = holder
        else:
            continue
        for item in items:
            if isinstance(item, mmap.mmap) and not item.closed:
                found[id(item)] = item
    return list(found.values())


def places(ctx, secret):
    """(mapping, position) of every copy of `secret` in this process's mappings."""
    for mapping in mappings(ctx):
        position = mapping.find(secret)
        while position >= 0:
            yield mapping, position
            position = mapping.find(secret, position + 1)


def read(ctx, mine, own, victim, how, secret):
    if how == "string_at":
        return ctypes.string_at(mine.ctypes.data + victim - own, SPAN)
    if how == "scan":
        for mapping, position in places(ctx, secret):
            return mapping[position : position + SPAN]
        raise LookupError("the secret is in no mapping of this process")
    return view(ctx, mine, own, victim, how).tobytes()


def write(ctx, mine, own, victim, how, secret):
    if how == "string_at":
        ctypes.memmove(mine.ctypes.data + victim - own, JUNK, SPAN)
    elif how == "scan":
        for mapping, position in list(places(ctx, secret)):
            mapping[position : position + SPAN] = JUNK
    else:
        view(ctx, mine, own, victim, how)[:] = np.frombuffer(JUNK, np.uint8)


@kernel("ptr", "u64", "u32", "u32", "u64", "u64", "u64", "u64")
def attack(ctx, out, victim, how, mode, s0, s1, s2, s3):
    """Read (mode 0) or overwrite (mode 1) the SPAN bytes at device address `victim`, which
    this kernel was not given, by HOWS[how]; the secret is the inverted words s0..s3 (for
    the scan). Reports into out, with the bytes read at DATA."""
    mine = ctx.gm(out, "uint8", OUT)
    secret = b"".join((~word & ((1 << 64) - 1)).to_bytes(8, "little") for word in (s0, s1, s2, s3))

    def attempt():
        if mode == 0:
            mine[DATA:] = np.frombuffer(read(ctx, mine, out, victim, HOWS[how], secret), np.uint8)
        else:
            write(ctx, mine, out, victim, HOWS[how], secret)

    report(ctx, out, attempt)


@kernel("ptr")
def mark(ctx, out):
    ctx.gm(out, "int64", 1)[0] = 7
'''
)

VICTIM = """
import json, sys
import numpy as np
import simnpu.client as npu

PATTERN = bytes.fromhex(sys.argv[1]) * 128
with npu.Device(0):
    buffer = npu.DeviceBuffer.from_array(np.frombuffer(PATTERN, np.uint8))
    print(buffer.ptr, flush=True)
    while sys.stdin.readline():
        intact = buffer.to_numpy().tobytes() == PATTERN
        a = np.arange(4096, dtype=np.float32)
        x, y, z = (npu.DeviceBuffer.from_array(v) for v in (a, 2 * a, np.zeros_like(a)))
        npu.builtin("add_f32").launch(4, x, y, z, a.size)
        npu.current_stream().synchronize()
        works = bool(np.array_equal(z.to_numpy(np.float32), 3 * a))
        for used in (x, y, z):
            used.free()
        print(json.dumps({"intact": intact, "works": works}), flush=True)
"""


class Victim:
    """Another client (a process of its own) holding a page of device memory filled with a
    secret; check() tells whether the secret is intact and its calls still work."""

    def __init__(self, address: str):
        self.secret = os.urandom(SPAN)
        self.errors = ""
        self.process = subprocess.Popen(
            [sys.executable, "-c", VICTIM, self.secret.hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "SIMNPU_ADDRESS": address},
        )
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the victim did not start:\n{self.close()}")
        self.ptr = int(line)

    def check(self) -> dict:
        """{"intact": its buffer still holds the secret, "works": malloc, copies and
        add_f32 still give it exact results}."""
        self.process.stdin.write("check\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        assert line, f"the victim failed:\n{self.close()}"
        return json.loads(line)

    def close(self) -> str:
        """End the victim (idempotent); its stderr."""
        if self.process.returncode is None:
            try:
                _, self.errors = self.process.communicate("", timeout=60)
            finally:
                if self.process.poll() is None:
                    self.process.kill()
                    self.process.communicate()
        return self.errors


@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("secrets") / "token"
    path.write_text(uuid.uuid4().hex)
    path.chmod(0o600)
    return path


@pytest.fixture(scope="module")
def daemon(tmp_path_factory, token_file):
    """This module's daemon (as conftest's), its command line naming a token file."""
    process = DaemonProcess(tmp_path_factory.mktemp("npu"), "--token-file", str(token_file))
    yield process
    assert process.stop() == 0, process.output()


@contextlib.contextmanager
def client_of(address: str):
    """This test process as a Pythonic-API client of the daemon at `address`, device 0 set."""
    import simnpu.client as npu

    npu.connect(address)
    try:
        with npu.Device(0):
            yield npu
    finally:
        npu.shutdown()


@pytest.fixture
def attacker(daemon):
    with client_of(daemon.address) as npu:
        yield npu


@pytest.fixture
def victim(daemon):
    made = Victim(daemon.address)
    yield made
    made.close()


def synchronize(npu) -> int:
    """0 if the current stream's work succeeded, else the code its synchronize reported
    (reported once: the stream works again after)."""
    try:
        npu.current_stream().synchronize()
    except NpuError as error:
        return error.code
    return 0


def inverted(secret: bytes) -> list[int]:
    """The secret as four u64 kernel arguments, inverted: no copy of it travels."""
    return [~int.from_bytes(secret[i : i + 8], "little") & ((1 << 64) - 1) for i in (0, 8, 16, 24)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", HOWS)
def test_a_kernel_cannot_reach_another_clients_memory(daemon, attacker, victim, how, mode):
    """The victim's device address, passed as a plain integer: through the worker's maps,
    a view's base, as_strided, ctypes or a scan of every mapping, the kernel finds nothing
    of the victim or faults (507015), and its client's next launch works."""
    module = attacker.Module.from_source(MEMORY_ATTACKS, "attacks.py")
    out = attacker.DeviceBuffer(OUT)
    out.fill(0)
    args = (out, victim.ptr, HOWS.index(how), MODES.index(mode), *inverted(victim.secret))
    module.function("attack").launch(1, *args)
    code = synchronize(attacker)
    assert code in (0, codes.ACL_ERROR_RT_AICORE_EXCEPTION), code
    leaked = out.to_numpy().tobytes()
    assert not [i for i in range(0, SPAN, 8) if victim.secret[i : i + 8] in leaked], (
        f"the kernel read the victim's secret by {how}"
    )
    out.fill(0)
    module.function("mark").launch(1, out)
    assert synchronize(attacker) == 0, "the attacker's next launch failed"
    assert out.to_numpy(np.int64)[0] == 7
    assert victim.check() == {"intact": True, "works": True}, f"the victim was hurt by {how}"
    assert daemon.process.poll() is None


def pages(blocks: list[tuple[int, int]]) -> set[int]:
    """The 4 KiB pages of device memory that (address, size) blocks touch."""
    return {
        page
        for address, size in blocks
        for page in range(address // PAGE, (address + size - 1) // PAGE + 1)
    }


def assert_apart(ours: list[tuple[int, int]], theirs: list[tuple[int, int]]) -> None:
    shared = sorted(pages(ours) & pages(theirs))
    assert not shared, (
        f"{len(shared)} pages hold blocks of both sessions, first at {shared[0] * PAGE:#x}"
    )


def test_allocations_of_different_sessions_never_share_a_page(daemon):
    sizes = [1, 31, 32, 100, 512, 1000, 2048, 4095, 4096, 4097, 10000]
    with runtime_of(daemon.address) as first, runtime_of(daemon.address) as second:
        ours: list[tuple[int, int]] = []
        theirs: list[tuple[int, int]] = []
        for size in sizes:  # interleaved: each could land right after the other's last block
            ours.append((first.memory.malloc(size), size))
            theirs.append((second.memory.malloc(size), size))
        assert_apart(ours, theirs)
        for address, _ in ours[::2]:  # holes in the first session's pages
            first.memory.free(address)
        del ours[::2]
        theirs += [(second.memory.malloc(size), size) for size in sizes]
        assert_apart(ours, theirs)
        round_trip(first)
        round_trip(second)


# ---- the sandbox --------------------------------------------------------------------------------
ATTEMPT = (
    """
import os, signal, socket, subprocess, sys
from simnpu import kernel
"""
    + REPORT
    + """

def action():
ACTION


@kernel("ptr")
def attempt(ctx, out):
    report(ctx, out, action)
"""
)


def attempt(npu, action: str) -> tuple[int, int]:
    """Run `action` (Python statements) in a kernel of this client: (status, errno) as the
    kernel reported them. Raises NpuError if the launch failed."""
    body = textwrap.indent(textwrap.dedent(action).strip(), "    ")
    module = npu.Module.from_source(ATTEMPT.replace("ACTION", body), "attempt.py")
    out = npu.DeviceBuffer(16)
    out.fill(0)
    module.function("attempt").launch(1, out)
    npu.current_stream().synchronize()
    status, error = (int(value) for value in out.to_numpy(np.int64))
    out.free()
    module.unload()
    return status, error


def assert_refused(outcome: tuple[int, int], what: str) -> None:
    status, error = outcome
    assert status == REFUSED and error in REFUSALS, f"{what}: {outcome} (status, errno)"


@pytest.mark.parametrize("target", ["cmdline", "environ", "token file"])
def test_a_kernel_cannot_read_the_daemons_command_line_or_token_file(
    daemon, attacker, token_file, target
):
    path = str(token_file) if target == "token file" else f"/proc/{daemon.pid}/{target}"
    assert_refused(attempt(attacker, f"open({path!r}, 'rb').read()"), f"reading {path}")
    assert daemon.process.poll() is None


@pytest.mark.parametrize("action", ["open a segment", "list /dev/shm"])
def test_a_kernel_cannot_reach_shared_memory_segments(daemon, attacker, action):
    segment = f"/dev/shm/simnpu-{daemon.pid}-dev0"  # every client's device memory
    assert os.path.exists(segment)
    code = (
        f"open({segment!r}, 'rb').read(16)"
        if action == "open a segment"
        else "os.listdir('/dev/shm')"
    )
    assert_refused(attempt(attacker, code), action)


@pytest.mark.parametrize("what", ["file", "folder"])
def test_a_kernel_cannot_write_outside_its_scratch_directory(attacker, tmp_path, what):
    path = tmp_path / "planted"
    code = f"open({str(path)!r}, 'w').write('x')" if what == "file" else f"os.mkdir({str(path)!r})"
    assert_refused(attempt(attacker, code), f"making a {what} in {tmp_path}")
    assert not path.exists()


def processes_running(marker: str) -> list[int]:
    """The processes whose command line holds `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if marker.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


SPAWNS = {
    "fork": """
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
    """,
    "Popen": "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', MARKER])",
    "socket": "socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()",
}


@pytest.mark.parametrize("how", SPAWNS)
def test_a_kernel_cannot_start_processes_or_open_sockets(daemon, attacker, how):
    marker = f"simnpu-test-{uuid.uuid4().hex}"
    try:
        status, error = attempt(attacker, SPAWNS[how].replace("MARKER", repr(marker)))
        assert status in (REFUSED, OS_ERROR), f"{how}: {(status, error)} (status, errno)"
        assert not processes_running(marker), "the kernel left a process behind"
    finally:
        for pid in processes_running(marker):
            os.kill(pid, signal.SIGKILL)
    assert daemon.process.poll() is None


@pytest.mark.parametrize("target", ["daemon", "worker"])
def test_a_kernel_cannot_kill_the_daemon_or_its_workers(start_daemon, target):
    daemon = start_daemon()
    pid = daemon.pid if target == "daemon" else daemon.workers[0]
    with client_of(daemon.address) as npu:
        assert_refused(attempt(npu, f"os.kill({pid}, signal.SIGKILL)"), f"killing the {target}")
    assert daemon.process.poll() is None
    with runtime_of(daemon.address) as rt:
        round_trip(rt)


POISON = '''
import numpy as np
from simnpu import kernel

np.add = np.subtract  # when the module is loaded, wherever that is


@kernel("ptr")
def poison(ctx, out):
    """np.add = np.subtract here too; out[block] = np.add(2, 1) as this process computes it."""
    np.add = np.subtract
    ctx.gm(out, "int64", ctx.block_num)[ctx.block_idx] = np.add(2, 1)
'''

BYSTANDER = """
import numpy as np
import simnpu.client as npu

rng = np.random.default_rng(7)
with npu.Device(0):
    for round_ in range(50):
        a, b = (rng.standard_normal(4096).astype(np.float32) for _ in range(2))
        x, y, z = (npu.DeviceBuffer.from_array(v) for v in (a, b, np.zeros_like(a)))
        npu.builtin("add_f32").launch(4, x, y, z, a.size)
        npu.current_stream().synchronize()
        if not np.array_equal(z.to_numpy(np.float32), a + b):
            print("wrong in round", round_)
            break
        for used in (x, y, z):
            used.free()
    else:
        print("exact")
"""


def test_replacing_a_numpy_function_changes_only_the_kernels_own_process(start_daemon):
    daemon = start_daemon()
    blocks = 16  # more than every AI core takes
    with client_of(daemon.address) as npu:
        out = npu.DeviceBuffer(8 * blocks)
        npu.Module.from_source(POISON, "poison.py").function("poison").launch(blocks, out)
        npu.current_stream().synchronize()
        assert list(out.to_numpy(np.int64)) == [1] * blocks  # its own np.add subtracts
        bystander = run_client(daemon.address, BYSTANDER)
    assert bystander.returncode == 0, bystander.stderr
    assert bystander.stdout.strip() == "exact", "another client's add_f32 used the kernel's np.add"


# ---- what a kernel process says of itself --------------------------------------------------------
FORGER = '''
import json, os, socket, stat, struct
from simnpu import kernel


def forge(payload: bytes) -> int:
    """Write a framed report on every socket this process holds: the count written."""
    written = 0
    for fd in range(3, 64):
        try:
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            os.write(fd, struct.pack("!i", len(payload)) + payload)
            written += 1
        except OSError:
            pass
    return written


@kernel("i64")
def forge_results(ctx, token):
    """Say that kernels of other tasks (any token) succeeded, then go on."""
    reports = [[t, 0, 0, 0, ""] for t in range(max(1, token - 50), token + 50)]
    forge(json.dumps(["results", reports]).encode())


@kernel()
def forge_pickle(ctx):
    """Send a pickle that would run a command if the daemon unpickled it."""
    forge(b"cos\\nsystem\\n(S'touch /tmp/pwned'\\ntR.")
'''


@pytest.mark.parametrize("kernel", ["forge_results", "forge_pickle"])
def test_a_forged_report_ends_only_the_forgers_kernel_process(daemon, attacker, victim, kernel):
    """A kernel that writes its own 'results' on its process's socket to the daemon gets its
    process ended (507015 for its launch); nothing it wrote is believed or unpickled, the
    victim's work and memory are untouched, and the attacker's next launch works.

    (The kernel process writes its own client's completion signal, so the first
    synchronize may believe the kernel's batch went well: a kernel can mislead only its
    own client. The daemon's verdict is reported once it has ended the process.)"""
    module = attacker.Module.from_source(FORGER, "forger.py")
    args = (1000,) if kernel == "forge_results" else ()
    reported = daemon.output().count("bad report")
    module.function(kernel).launch(1, *args)
    first = synchronize(attacker)
    deadline = time.monotonic() + 60
    while True:  # the daemon has refused this report and ended the process
        log = daemon.output()
        if log.count("bad report") > reported and "restarting it" in log.split("bad report")[-1]:
            break
        assert time.monotonic() < deadline, log
        time.sleep(0.02)
    assert codes.ACL_ERROR_RT_AICORE_EXCEPTION in (first, synchronize(attacker))
    assert not os.path.exists("/tmp/pwned")
    out = attacker.DeviceBuffer(OUT)
    module = attacker.Module.from_source(MEMORY_ATTACKS, "attacks.py")
    module.function("mark").launch(1, out)
    assert synchronize(attacker) == 0, "the attacker's next launch failed"
    assert out.to_numpy(np.int64)[0] == 7
    assert victim.check() == {"intact": True, "works": True}
    assert "bad report" in daemon.output()


# ---- the mapping of its memory -----------------------------------------------------------------
REMAPS = (
    f"""
import ctypes, mmap
import numpy as np
from simnpu import kernel

SPAN, OUT, DATA = {SPAN}, {OUT}, {DATA}
DEVICE_BASE, DEVICE_SPAN = 1 << 47, 1 << 40
JUNK = b"\\xee" * SPAN
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
"""
    + REPORT
    + '''

def remapped(page, page_offset, victim_offset, how):
    """The address of device offset `victim_offset` through a remapping of the page at
    address `page` (device offset `page_offset`) of this process's window."""
    if how == "mremap":  # a second, larger mapping of the same file pages (old size 0)
        length = victim_offset - page_offset + mmap.PAGESIZE
        moved = libc.syscall(25, ctypes.c_void_p(page), 0, ctypes.c_size_t(length), 1)
        if moved == -1:
            raise OSError(ctypes.get_errno(), "mremap")
        return moved + victim_offset - page_offset
    pgoff = victim_offset // mmap.PAGESIZE  # remap_file_pages: the page shows another one
    if libc.syscall(216, ctypes.c_void_p(page), mmap.PAGESIZE, 0, ctypes.c_size_t(pgoff), 0):
        raise OSError(ctypes.get_errno(), "remap_file_pages")
    return page + victim_offset % mmap.PAGESIZE


@kernel("ptr", "ptr", "u64", "u32")
def remap(ctx, out, bait, victim, how):
    """Read, then overwrite, the SPAN bytes at device address `victim` through a remapping
    of the page of `bait` (this kernel's own buffer): how 0 mremap, 1 remap_file_pages."""
    mine = ctx.gm(out, "uint8", OUT)
    page = ctx.gm(bait, "uint8", mmap.PAGESIZE).ctypes.data
    offsets = [(address - DEVICE_BASE) % DEVICE_SPAN for address in (bait, victim)]

    def attempt():
        there = remapped(page, offsets[0], offsets[1], ("mremap", "remap_file_pages")[how])
        mine[DATA:] = np.frombuffer(ctypes.string_at(there, SPAN), np.uint8)
        ctypes.memmove(there, JUNK, SPAN)

    report(ctx, out, attempt)
'''
)


@pytest.mark.parametrize("how", ["mremap", "remap_file_pages"])
def test_a_kernel_cannot_remap_its_memory_onto_another_clients(start_daemon, how):
    """A kernel remaps a page of its own device memory to reach further into the device's
    segment -- a second, larger mapping (mremap with old size 0) or another file page
    (remap_file_pages): refused (EPERM), the victim's secret neither read nor changed."""
    daemon = start_daemon()
    with client_of(daemon.address) as npu:
        bait = npu.DeviceBuffer(PAGE)  # first: the victim's block comes after it
        victim = Victim(daemon.address)
        try:
            assert victim.ptr > bait.ptr
            out = npu.DeviceBuffer(OUT)
            out.fill(0)
            module = npu.Module.from_source(REMAPS, "remaps.py")
            module.function("remap").launch(
                1, out, bait, victim.ptr, ["mremap", "remap_file_pages"].index(how)
            )
            assert synchronize(npu) == 0
            status, error = (int(value) for value in out.to_numpy(np.int64)[:2])
            leaked = out.to_numpy().tobytes()
            assert not [i for i in range(0, SPAN, 8) if victim.secret[i : i + 8] in leaked], (
                f"the kernel read the victim's secret by {how}"
            )
            assert (status, error) == (REFUSED, errno.EPERM), f"{how}: {(status, error)}"
            assert victim.check() == {"intact": True, "works": True}
        finally:
            victim.close()


def shared_files_of(pid: int) -> tuple[set[str], set[str]]:
    """(the /dev/shm files process `pid` maps, those it holds a descriptor of)."""
    mapped = set()
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith("/dev/shm/"):
                mapped.add(fields[5].strip().removesuffix(" (deleted)"))
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith("/dev/shm/"):
                held.add(target.removesuffix(" (deleted)"))
    return mapped, held


def test_a_kernel_process_maps_no_file_that_holds_another_clients_bytes(start_daemon):
    """The mapping-level guard, whatever calls a kernel makes (mremap, remap_file_pages
    where no seccomp filter stops them): every file a client's kernel process maps holds
    that client's memory only -- not the device's segment, not the victim's bytes -- and it
    holds no descriptor of any. The attacker's own bytes are found in what it maps (the
    check can see memory), the victim's nowhere."""
    daemon = start_daemon("--memory", "64MiB")
    with client_of(daemon.address) as npu:
        bait = npu.DeviceBuffer.from_array(np.frombuffer(b"attacker" * 512, np.uint8))
        victim = Victim(daemon.address)
        try:
            out = npu.DeviceBuffer(OUT)
            npu.Module.from_source(MEMORY_ATTACKS, "attacks.py").function("mark").launch(1, out)
            assert synchronize(npu) == 0
            processes = own_kernel_processes(daemon)
            assert processes, "the kernel ran in no kernel process"
            device_segment = f"/dev/shm/simnpu-{daemon.pid}-dev0"
            own_bytes_seen = False
            for pid in processes:
                mapped, held = shared_files_of(pid)
                assert device_segment not in mapped, "it maps the device's whole segment"
                assert not held, f"it holds descriptors of {sorted(held)}"
                for path in mapped:
                    with open(path, "rb") as file:  # sparse: holes read as zeros
                        content = file.read()
                    assert victim.secret not in content, f"{path} holds the victim's bytes"
                    own_bytes_seen |= b"attacker" * 512 in content
            assert own_bytes_seen, "its own memory is in none of the files it maps"
            assert bait.to_numpy().tobytes() == b"attacker" * 512
            assert victim.check() == {"intact": True, "works": True}
        finally:
            victim.close()


SHARED = """
import time

import numpy as np
from simnpu import kernel


@kernel("ptr", "ptr", "u32")
def touch(ctx, shared, out, n):
    \"\"\"Copy the n bytes at `shared` to `out`, then mark their first 8.\"\"\"
    seen = ctx.gm(shared, "uint8", n)
    ctx.gm(out, "uint8", n)[:] = seen
    seen[:8] = np.frombuffer(b"imported", np.uint8)


@kernel("ptr", "ptr", "u32")
def slow_fill(ctx, buffer, started, n):
    \"\"\"Write "run!" at `started`, sleep a while, then write "late" all over the n bytes
    at `buffer`.\"\"\"
    ctx.gm(started, "uint8", 4)[:] = np.frombuffer(b"run!", np.uint8)
    time.sleep(1.0)
    ctx.gm(buffer, "uint8", n)[:] = np.frombuffer(b"late" * (n // 4), np.uint8)
"""


def test_an_importers_kernel_process_maps_nothing_else_of_the_exporter(start_daemon):
    """The exporter's other bytes are out of an importer's reach, whatever calls its kernel
    makes: the exported pages live in a file of their block alone (made at the export), so
    every file the importer's kernel process maps lacks the exporter's secret (which sits in
    another block) and one of them holds the shared bytes; both sides see each other's
    writes through it."""
    daemon = start_daemon("--memory", "64MiB")
    h2d, d2h = codes.ACL_MEMCPY_HOST_TO_DEVICE, codes.ACL_MEMCPY_DEVICE_TO_HOST
    secret = os.urandom(32) * 512
    shared = b"exported" * 2048
    secret_host = np.frombuffer(secret, np.uint8).copy()
    shared_host = np.frombuffer(shared, np.uint8).copy()
    with runtime_of(daemon.address) as exporter, client_of(daemon.address) as npu:
        hidden = exporter.memory.malloc(len(secret))
        exporter.memory.memcpy(hidden, len(secret), secret_host.ctypes.data, len(secret), h2d)
        block = exporter.memory.malloc(len(shared))
        exporter.memory.memcpy(block, len(shared), shared_host.ctypes.data, len(shared), h2d)
        key = exporter.memory.ipc_mem_get_export_key(
            block, len(shared), codes.ACL_RT_IPC_MEM_EXPORT_FLAG_DISABLE_PID_VALIDATION
        )
        imported = npu.DeviceBuffer.ipc_import(key)
        out = npu.DeviceBuffer(len(shared))
        npu.Module.from_source(SHARED, "shared.py").function("touch").launch(
            1, imported, out, len(shared)
        )
        assert synchronize(npu) == 0
        assert out.to_numpy().tobytes() == shared, "the importer's kernel read other bytes"
        seen = np.zeros(16, np.uint8)
        exporter.memory.memcpy(seen.ctypes.data, 16, block, 16, d2h)
        assert seen.tobytes() == b"imported" + shared[8:16], "the exporter missed its write"
        processes = own_kernel_processes(daemon)  # the importer's only: the exporter ran none
        assert processes, "the kernel ran in no kernel process"
        shared_seen = False
        for pid in processes:
            mapped, held = shared_files_of(pid)
            assert not held, f"it holds descriptors of {sorted(held)}"
            for path in mapped:
                with open(path, "rb") as file:
                    content = file.read()
                assert secret[:64] not in content, f"{path} holds the exporter's other bytes"
                shared_seen |= shared[64:128] in content
        assert shared_seen, "the shared bytes are in none of the files it maps"
        imported.free()
        exporter.memory.ipc_mem_close(key)
        exporter.memory.free(block)
        exporter.memory.free(hidden)


def test_an_export_waits_for_the_exporters_running_kernel(start_daemon):
    """aclrtIpcMemGetExportKey while the exporter's kernel is running and has yet to write
    the buffer: the export moves the pages into their own file only after the kernel
    ended, so nothing it wrote is lost -- the exporter, its next kernel and the importer
    all read it."""
    from device_peek import peek

    daemon = start_daemon()
    n = 2 * PAGE
    with client_of(daemon.address) as npu, runtime_of(daemon.address) as importer:
        buffer, started = npu.DeviceBuffer(n), npu.DeviceBuffer(PAGE)
        buffer.fill(0)
        started.fill(0)
        module = npu.Module.from_source(SHARED, "shared.py")
        module.function("slow_fill").launch(1, buffer, started, n)
        deadline = time.monotonic() + 60
        while peek(daemon.pid, started.ptr, 4) != b"run!":
            assert time.monotonic() < deadline, "the kernel never started"
            time.sleep(0.01)
        key = buffer.ipc_export()  # while the kernel sleeps before it writes
        assert synchronize(npu) == 0
        late = b"late" * (n // 4)
        assert buffer.to_numpy().tobytes() == late, "the kernel's write was lost"
        out = npu.DeviceBuffer(n)
        module.function("touch").launch(1, buffer, out, n)  # a kernel process mapping anew
        assert synchronize(npu) == 0
        assert out.to_numpy().tobytes() == late
        address = importer.memory.ipc_mem_import_by_key(key)
        seen = np.zeros(n, np.uint8)
        importer.memory.memcpy(seen.ctypes.data, n, address, n, codes.ACL_MEMCPY_DEVICE_TO_HOST)
        assert seen.tobytes() == b"imported" + late[8:]
        importer.memory.ipc_mem_close(key)
        buffer.free()


def test_a_new_block_never_shows_another_clients_freed_bytes(start_daemon):
    """A client frees a block holding a secret (too small for its pages to go back at
    free); another client's next block lands on the same pages and reads zeros, never the
    secret."""
    daemon = start_daemon()
    secret = np.frombuffer(os.urandom(64) * 1024, np.uint8)
    h2d, d2h = codes.ACL_MEMCPY_HOST_TO_DEVICE, codes.ACL_MEMCPY_DEVICE_TO_HOST
    with runtime_of(daemon.address) as first, runtime_of(daemon.address) as second:
        address = first.memory.malloc(secret.nbytes)
        first.memory.memcpy(address, secret.nbytes, secret.ctypes.data, secret.nbytes, h2d)
        fence = first.memory.malloc(secret.nbytes)  # after it: its free block stays small
        assert fence > address
        first.memory.free(address)
        first.sync.synchronize_device()  # the free has been done (aclrtFree is posted)
        reused = second.memory.malloc(secret.nbytes)
        assert reused == address, "the allocator did not reuse the freed block"
        seen = np.ones_like(secret)
        second.memory.memcpy(seen.ctypes.data, seen.nbytes, reused, seen.nbytes, d2h)
        assert not seen.any(), "the new block shows the last owner's bytes"
        second.memory.free(reused)
        first.memory.free(fence)


# ---- other processes ---------------------------------------------------------------------------
ACTS_ON = {
    "prlimit": "import resource; resource.prlimit(PID, resource.RLIMIT_CPU, (1, 1))",
    "setpriority": "os.setpriority(os.PRIO_PROCESS, PID, 19)",
    "sched_setaffinity": "os.sched_setaffinity(PID, {0})",
    "ioprio_get": """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.syscall(252, 1, PID) < 0:
            raise OSError(ctypes.get_errno(), 'ioprio_get')
    """,
}


def standing(pid: int) -> tuple:
    """What the actions of ACTS_ON would change of process `pid`."""
    import resource

    return (
        resource.prlimit(pid, resource.RLIMIT_CPU),
        os.getpriority(os.PRIO_PROCESS, pid),
        os.sched_getaffinity(pid),
    )


@pytest.mark.parametrize("target", ["daemon", "worker"])
@pytest.mark.parametrize("action", ACTS_ON)
def test_a_kernel_cannot_act_on_the_daemon_or_its_workers(daemon, attacker, action, target):
    """The daemon's pid is no secret (its scratch folder's name holds it); a kernel that
    sets its CPU limit, priority or affinity, or reads its I/O priority, is refused, and
    nothing of it changed."""
    pid = daemon.pid if target == "daemon" else daemon.workers[0]
    before = standing(pid)
    code = textwrap.dedent(ACTS_ON[action]).replace("PID", str(pid))
    assert_refused(attempt(attacker, code), f"{action} on the {target}")
    assert standing(pid) == before
    assert daemon.process.poll() is None


SECRETS = """
import ctypes, os, sys
from simnpu import kernel


@kernel("ptr", "u64")
def secrets(ctx, out, size):
    \"\"\"Write into out what this process knows of its start: os.environ, sys.argv and the
    C library's environment (the strings of its initial stack).\"\"\"
    found = [f"{key}={value}" for key, value in os.environ.items()] + list(sys.argv)
    table = ctypes.POINTER(ctypes.c_char_p).in_dll(ctypes.CDLL(None), "environ")
    index = 0
    while table[index] is not None:
        found.append(table[index].decode(errors="replace"))
        index += 1
    data = "\\n".join(found).encode()[:size]
    ctx.gm(out, "uint8", len(data))[:] = list(data)
"""


def test_a_kernel_starts_with_a_clean_environment_and_command_line(start_daemon, tmp_path):
    """The daemon's environment (its token, an autostarting client's variables) and
    command line (its token file) are nowhere in a kernel's process."""
    secret = uuid.uuid4().hex
    token_file = tmp_path / "token"
    token_file.write_text(uuid.uuid4().hex)
    daemon = start_daemon(
        "--token-file", str(token_file), env={"SIMNPU_TOKEN": secret, "MY_SECRET": secret}
    )
    size = 1 << 16
    with client_of(daemon.address) as npu:
        out = npu.DeviceBuffer(size)
        out.fill(0)
        npu.Module.from_source(SECRETS, "secrets.py").function("secrets").launch(1, out, size)
        assert synchronize(npu) == 0
        seen = out.to_numpy().tobytes().rstrip(b"\0").decode()
    assert "PYTHONSAFEPATH=1" in seen  # what the kernel read is its process's environment
    assert secret not in seen
    assert str(token_file) not in seen and "--token-file" not in seen
    assert "MY_SECRET" not in seen


# ---- what a kernel leaves behind ---------------------------------------------------------------
LEAVERS = '''
import os, threading, time
from simnpu import kernel


@kernel()
def many_threads(ctx):
    """Start 200 threads that sleep, then wait: over the bound of threads at once."""
    threading.stack_size(256 << 10)
    for _ in range(200):
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    time.sleep(30)


@kernel()
def burners(ctx):
    """Leave three threads burning CPU behind, and return."""
    def burn():
        while True:
            pass
    for _ in range(3):
        threading.Thread(target=burn, daemon=True).start()


@kernel("u32", "u32")
def scratch_files(ctx, count, mib):
    """Write `count` files of `mib` MiB each (each under the cap of one file) in its
    scratch folder, then wait."""
    block = os.urandom(1 << 20)
    for index in range(count):
        with open(f"file{index}", "wb") as out:
            for _ in range(mib):
                out.write(block)
    time.sleep(30)
'''


def own_kernel_processes(daemon) -> list[int]:
    """The daemon's kernel processes (its zygote's children)."""
    from conftest import children_of, descendants

    return sorted(set(descendants(daemon.pid)) - set(children_of(daemon.pid)))


@pytest.mark.parametrize(
    "kernel, args, why",
    [
        ("many_threads", (), "it started"),
        ("scratch_files", (3, 100), "it wrote over 256 MiB in its scratch folder"),
        ("scratch_files", (5000, 0), "it made over 4096 files in its scratch folder"),
    ],
    ids=["threads", "scratch bytes", "scratch files"],
)
def test_a_kernel_over_a_bound_is_ended(daemon, attacker, victim, kernel, args, why):
    """A kernel that starts too many threads at once, or fills its scratch folder past its
    total, has its process killed by its zygote: its launch fails with 507015, the daemon's
    log says why, its scratch folder is gone, and its client's next launch and the victim's
    work are unaffected."""
    module = attacker.Module.from_source(LEAVERS, "leavers.py")
    module.function(kernel).launch(1, *args)
    assert synchronize(attacker) == codes.ACL_ERROR_RT_AICORE_EXCEPTION
    assert f"was killed by its zygote: {why}" in daemon.output()
    assert daemon.scratch_directories() and not os.listdir(daemon.scratch_directories()[0])
    out = attacker.DeviceBuffer(OUT)
    marks = attacker.Module.from_source(MEMORY_ATTACKS, "attacks.py")
    marks.function("mark").launch(1, out)
    assert synchronize(attacker) == 0, "the attacker's next launch failed"
    assert out.to_numpy(np.int64)[0] == 7
    assert victim.check() == {"intact": True, "works": True}


def test_threads_a_kernel_leaves_running_end_with_its_process(daemon, attacker, victim):
    """A kernel that returns leaving threads that burn CPU: its launch succeeds, and its
    process is ended once the batch is done (the next launch gets a new one)."""
    module = attacker.Module.from_source(LEAVERS, "leavers.py")
    before = set(own_kernel_processes(daemon))
    module.function("burners").launch(1)
    assert synchronize(attacker) == 0
    deadline = time.monotonic() + 30
    while set(own_kernel_processes(daemon)) - before:
        assert time.monotonic() < deadline, "the process of the burners' kernel still runs"
        time.sleep(0.02)
    assert victim.check() == {"intact": True, "works": True}
