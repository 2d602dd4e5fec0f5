"""The device daemon: devices, their units (worker processes), the scheduler and the gRPC
server, started and stopped in the right order. Workers are spawned before gRPC starts."""

from __future__ import annotations

import contextlib
import faulthandler
import itertools
import logging
import os
import signal
import socket
import threading
import time
from concurrent import futures
from importlib import resources

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from simnpu.proto import npu_pb2, observe, service, socket_folder
from simnpu.proto.kernel_abi import discover_kernels
from simnpu.server.control.client_limits import ClientLimits
from simnpu.server.control.credentials import Peer, Peers, Tenancy
from simnpu.server.control.daemon_config import DaemonConfig
from simnpu.server.control.module_loads import ModuleLoads
from simnpu.server.control.service import NpuServicer
from simnpu.server.control.session import CLOSED, Session
from simnpu.server.core.cnt_notifies import CntNotifies
from simnpu.server.core.functions import Binary
from simnpu.server.core.ipc_events import IpcEvents
from simnpu.server.core.notifies import Notifies
from simnpu.server.core.rate_limits import ClientLog
from simnpu.server.core.scheduler import Scheduler
from simnpu.server.core.tenants import Tenant
from simnpu.server.hccl.collectives import Collectives
from simnpu.server.hccl.daemon_links import SERVER_KEEPALIVE
from simnpu.server.hccl.job_rendezvous import Jobs
from simnpu.server.memory.device_backing import BackingLog
from simnpu.server.memory.device_memory import DeviceWithMemory
from simnpu.server.memory.host_memory import HostMemory
from simnpu.server.memory.ipc_memory import IpcMemory
from simnpu.server.memory.memory_views import memory_snapshot, memory_stats
from simnpu.server.memory.shareable_memory import ShareableMemory
from simnpu.server.memory.window_table import WindowTable
from simnpu.server.observation import observer, smi_view  # noqa: F401 - handlers: registers every handler
from simnpu.server.observation.observer import Observer
from simnpu.server.units.kernel_processes import KernelProcesses
from simnpu.server.units.process_executor import ProcessExecutor
from simnpu.shm.region import shm_available_bytes, unlink_daemon_segments

log = logging.getLogger("simnpu.daemon")


class Daemon:
    def __init__(self, config: DaemonConfig):
        config.validate()
        self.config = config
        self.limits = ClientLimits(config)  # what one client may hold (client_limits.py)
        # kernel module loads: each client's rate, every client's turn (module_loads.py)
        self.module_loads = ModuleLoads(config.max_module_bytes)
        self._lines: dict[str, ClientLog] = {}  # peer key -> its log lines' rate
        self.query_lines = ClientLog("Query calls")  # the lines about queries, all together
        self.devices: list[DeviceWithMemory] = []
        self.ipc = IpcMemory(self.devices)  # exported device memory (aclrtIpcMem*)
        self.shareable = ShareableMemory()  # exported physical memory (aclrtMemExport...)
        self.notifies = Notifies(config.reserves)  # notifies, exported ones by key
        self.ipc_events = IpcEvents()  # exported IPC events by handle
        self.cnt_notifies = CntNotifies(config.reserves)  # count notifies' ids
        self.sessions: dict[int, Session] = {}
        self.peers = Peers()  # the credentials sockets: who a client is (credentials.py)
        self.tenancy = Tenancy(config.token, config.tenants)  # whose a client is (likewise)
        self._peer_of: dict[int, Peer] = {}  # session id -> its peer
        self._session_ids = itertools.count(1)
        self._binary_ids = itertools.count(2)
        self._model_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._stopping = False  # stop() has begun (under _lock)
        self._stopped = threading.Event()
        self._last_activity = time.monotonic()
        self.server: grpc.Server | None = None
        self.health: health.HealthServicer | None = None
        self._socket_paths: list[str] = []  # socket files this daemon created (and removes)
        self.executor: ProcessExecutor | None = None
        self.scheduler: Scheduler | None = None
        self.collectives: Collectives | None = None  # HCCL (server/hccl/collectives.py)
        self.observer: Observer | None = (
            None  # timeline and checkers (server/observation/observer.py), when asked for
        )
        self.jobs: Jobs | None = (
            None  # job rendezvous (server/hccl/job_rendezvous.py), with the scheduler
        )
        source = resources.files("simnpu.server.kernels").joinpath("builtin.py").read_text()
        self.builtin_binary = Binary(
            1, source, "<simnpu builtin kernels>", discover_kernels(source)
        )

    def observe(self, flags: int = 0) -> Observer:
        """The daemon's observer (server/observation/observer.py), made and subscribed to the
        scheduler on first use: at start when `simnpu serve --trace / --check` asked for it
        (`flags` for every client), else when a client first asks (ObserveRequest)."""
        assert self.scheduler is not None, "the daemon runs"
        with self.scheduler.lock:
            if self.observer is None:
                config = self.config
                self.observer = Observer(
                    self.scheduler,
                    self.devices,
                    self.ipc,
                    flags,
                    config.trace_path,
                    config.check_report,
                    config.trace_buffer,
                )
                self.scheduler.subscribe(self.observer)
            return self.observer

    @property
    def kernels(self) -> KernelProcesses:
        """Where clients' own kernels run (server/units/kernel_processes.py)."""
        assert self.executor is not None, "the daemon runs"
        return self.executor.kernels

    # ---- start and stop --------------------------------------------------------------------------
    def start(self) -> None:
        """Create device memory, start workers and the scheduler, then serve gRPC."""
        check_shm_space(self.config.staging_bytes)  # device memory costs nothing until used
        host = HostMemory()
        windows = WindowTable()  # what every device maps at reserved addresses
        backing = BackingLog()  # which file backs each page of every device's memory
        try:
            units_per_device = self.config.ai_cores + self.config.copy_engines
            for index in range(self.config.devices):
                self.devices.append(
                    DeviceWithMemory(
                        index,
                        self.config.memory_bytes,
                        self.config.ai_cores,
                        self.config.copy_engines,
                        index * units_per_device,
                        host,
                        windows,
                        self.config.reserves,
                        backing,
                    )
                )
            units = [unit for device in self.devices for unit in device.all_units()]
            self.executor = ProcessExecutor(
                units, [device.region.name for device in self.devices], windows, backing
            )
            first = self.devices[0]
            first.started = True  # nearly every client uses it; the others start on first use
            self.executor.start(first.all_units())
            for device in self.devices:  # frees end the kernel processes that map the block
                device.kernels = self.executor.kernels
            self.scheduler = Scheduler(
                self.devices,
                self.executor,
                self.config.op_timeout_s,
                self.config.core_share_window_s,
            )
            self.collectives = Collectives(self.scheduler, self.devices)
            self.scheduler.dispatcher = self.collectives  # matched collectives go out first
            worlds = self.collectives.worlds  # worlds across hosts (multihost.md)
            worlds.advertise = self.config.advertise
            worlds.token = self.config.token or ""
            bits = self.config.checks | (observe.TRACE if self.config.trace_path else 0)
            if bits:  # --trace / --check: every client is observed from the start
                self.observe(bits)
                log.info("observing every client: %s", observe.describe(bits))
            self.jobs = Jobs(self.scheduler, self.collectives)
            self.scheduler.start()
            self._start_grpc()
        except BaseException:
            self.stop()
            raise
        if self.config.idle_exit_s is not None:
            threading.Thread(
                target=self._idle_watch,
                args=(self.config.idle_exit_s,),
                name="simnpu-idle",
                daemon=True,
            ).start()
        log.info(
            "simnpu daemon %d serving %s: %d device(s) of %d MiB, "
            "%d AI cores + %d copy engines each",
            os.getpid(),
            ", ".join(self.config.listen),
            self.config.devices,
            self.config.memory_bytes >> 20,
            self.config.ai_cores,
            self.config.copy_engines,
        )

    def _start_grpc(self) -> None:
        self.server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=2 * self.config.max_sessions + 8, thread_name_prefix="simnpu-rpc"
            ),
            # a TCP port another process listens on is refused, not shared: gRPC's default
            # SO_REUSEPORT would let a second daemon take half of the first one's clients
            options=[*service.CHANNEL_OPTIONS, *SERVER_KEEPALIVE, ("grpc.so_reuseport", 0)],
        )
        self.server.add_generic_rpc_handlers([NpuServicer(self).handlers()])
        self.health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        socket_paths = {a: service.parse_address(a).path for a in self.config.listen}
        # Network addresses first: a Unix socket accepts connections from its bind on (they
        # wait for start()), and whoever finds one accepting -- a test, a tool, autostart --
        # may at once use the daemon's other addresses; they must be listening by then.
        for address, path in sorted(socket_paths.items(), key=lambda item: item[1] is not None):
            if path is not None:
                prepare_socket_path(path)
            previous = os.umask(0o177) if path is not None else None  # the socket is born 0600
            try:
                if not self.server.add_insecure_port(address):
                    raise RuntimeError(f"cannot listen on {address}")
            finally:
                if previous is not None:
                    os.umask(previous)
            if path is not None:
                self._socket_paths.append(path)
                os.chmod(path, 0o600)  # in case the binding ignored the umask
                # before serving: a client that connects at once finds its credentials
                # socket, else it would count as a peer without credentials
                self.peers.listen(path)
        self.server.start()
        with self._lock:  # idle from now, when clients can come (--idle-exit)
            self._last_activity = time.monotonic()
        self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        self.health.set(service.SERVICE, health_pb2.HealthCheckResponse.SERVING)

    def wait(self) -> None:
        """Block until stop() is called (by a signal, the idle timer, or another thread).
        Wakes every second: a signal the kernel hands to another thread runs its Python
        handler only when this thread next runs."""
        while not self._stopped.wait(1.0):
            pass

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the daemon; SIGUSR1 writes every thread's stack to its
        log and leaves it running (for a daemon that seems stuck)."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(
                signum, lambda *_: threading.Thread(target=self.stop, daemon=True).start()
            )
        faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)

    def stop(self) -> None:
        """Tell clients the device is gone, stop serving, stop workers, unlink all memory."""
        with self._lock:  # once; and no session opens after this snapshot of them
            if self._stopping:
                return
            self._stopping = True
            sessions = list(self.sessions.values())
        if self.health is not None:
            self.health.enter_graceful_shutdown()
        for session in sessions:
            session.outbox.put(
                npu_pb2.Notice(
                    kind=npu_pb2.Notice.KIND_DEVICE_GONE,
                    message="the simnpu daemon is shutting down",
                )
            )
            session.outbox.put(CLOSED)
        if self.server is not None:
            self.server.stop(grace=1).wait(5)
        observer.write_files(self.observer)  # --trace / --check-report files
        if self.scheduler is not None:
            if self.collectives is not None:
                with self.scheduler.lock:
                    self.collectives.worlds.stop()  # engine processes, peer streams
            self.scheduler.stop()
        if self.executor is not None:
            # under the scheduler lock: a session's post (its ring thread runs until the
            # session is released, below) never uses a worker's pipe while it closes
            with self.scheduler.lock if self.scheduler is not None else contextlib.nullcontext():
                self.executor.stop()
        for session in sessions:
            try:
                session.release_all()
            except Exception:  # a bug of ours must not keep the daemon from stopping
                log.exception("%r: releasing what it held failed", session)
        for device in self.devices:
            device.close()
        unlink_daemon_segments(os.getpid())  # whatever a racing session created meanwhile
        for path in self._socket_paths:
            remove_socket_file(path)
        self.peers.close()
        self._stopped.set()
        log.info("simnpu daemon %d stopped", os.getpid())

    def _idle_watch(self, idle_exit_s: float) -> None:
        while not self._stopped.wait(0.2):
            with self._lock:
                idle = not self.sessions and time.monotonic() - self._last_activity > idle_exit_s
            if idle:
                log.info("no client for %.1f s: exiting", idle_exit_s)
                self.stop()

    # ---- sessions ------------------------------------------------------------------------------
    def use_device(self, device: DeviceWithMemory) -> None:
        """A session names `device`: launch its workers if they have not been (without
        waiting for them: its work waits in its streams until they are ready)."""
        with self._lock:
            if device.started:
                return
            device.started = True
        assert self.executor is not None, "the daemon runs"
        self.executor.launch(device.all_units())

    def open_session(self, connection: str, peer: Peer, tenant: Tenant) -> Session | str:
        """A new session of `peer`, of `tenant` (on gRPC's `connection`), or why there is
        none: the daemon's session limit, or the peer's (--max-sessions-per-peer:
        client_limits.py)."""
        with self._lock:
            if self._stopping:
                return "the daemon is shutting down"
            held = sum(1 for other in self._peer_of.values() if other.key == peer.key)
            refused = self.limits.session_refused(len(self.sessions), held, peer.key)
            if refused is not None:
                return refused
            session = Session(self, next(self._session_ids), connection, tenant)
            session.owner.lines = self._client_lines(peer.key)
            self.sessions[session.id] = session
            self._peer_of[session.id] = peer
            self._last_activity = time.monotonic()
        return session

    def _client_lines(self, key: str) -> ClientLog:
        """The log lines of peer `key`, which all its sessions share (under _lock): a peer
        cannot get a fresh rate by opening another session. Peers without a session whose
        rate has rested are forgotten, after a line of what was not logged, if anything."""
        live = {peer.key for peer in self._peer_of.values()}
        for other, rested in list(self._lines.items()):
            if other != key and other not in live and rested.rested:
                rested.settle(log)
                del self._lines[other]
        lines = self._lines.get(key)
        if lines is None:
            lines = self._lines[key] = ClientLog(key)
        return lines

    def peer_of(self, session: Session) -> Peer:
        """Who `session`'s client is (server/control/credentials.py)."""
        with self._lock:
            return self._peer_of.get(session.id, Peer("?", 0))

    def close_session(self, session: Session) -> None:
        if self._stopping or self.scheduler is None:  # (stop() releases every session)
            return
        session.close(self._session_closed)

    def _session_closed(self, session: Session) -> None:
        with self._lock:
            self.sessions.pop(session.id, None)
            self._peer_of.pop(session.id, None)
            self._last_activity = time.monotonic()
        session.outbox.put(CLOSED)
        session.owner.lines.info(
            log, "%r ended after %s; its resources are freed", session, session.tally()
        )

    # ---- daemon-wide ids and helpers (any thread) ------------------------------------------------
    def next_binary_id(self) -> int:
        with self._lock:
            return next(self._binary_ids)

    def next_model_id(self) -> int:
        """The id of a new model run instance (aclmdlRIGetId), unique in the daemon."""
        with self._lock:
            return next(self._model_ids)

    def forget_segment(self, name: str) -> None:
        """A pinned, staging or notify segment was unlinked: units drop their mapping with
        their next batch (under the scheduler lock)."""
        for device in self.devices:
            for unit in device.all_units():
                unit.forget.append(name)

    def describe(self, what: str, device_index: int, viewer: Tenant) -> object:
        """Read-only views for tools (the Query RPC), as tenant `viewer` may see them: its
        own processes, jobs and memory; the operator sees everything, and alone the
        timeline and the checkers' findings (docs/security.md)."""
        if what == "jobs":  # processes waiting in a job rendezvous (server/hccl/job_rendezvous.py)
            return self.jobs.describe(viewer) if self.jobs is not None else {}
        if what in ("memory_stats", "memory_snapshot"):
            if not 0 <= device_index < len(self.devices):
                return {
                    "error": f"device {device_index} does not exist "
                    f"(this daemon simulates {len(self.devices)})"
                }
            if what == "memory_stats":
                return memory_stats(self, self.devices[device_index])
            return memory_snapshot(self, self.devices[device_index], viewer)
        if what in ("trace", "check_report"):
            if not viewer.operator:
                return {
                    "error": f"the {what.replace('_', ' ')} shows every client's work: "
                    "only the operator may ask for it (docs/security.md)"
                }
            return observer.query(self.observer, what)
        with self._lock:
            sessions = [s for s in self.sessions.values() if viewer.sees(s.tenant)]
        return {
            "pid": os.getpid(),
            "devices": [smi_view.device(self, d) for d in self.devices],  # (simnpu smi)
            "processes": [smi_view.process(s) for s in sessions],
            "observe": observer.summary(self.observer),
            "module_loads": self.module_loads.describe(),
        }


def check_shm_space(needed: int) -> None:
    """Refuse to start when /dev/shm cannot hold even one client's staging area. Device
    memory is committed as clients allocate it (docs/device-memory.md), so a short /dev/shm
    fails allocations (207001) rather than the start."""
    available = shm_available_bytes()
    if available < needed:
        raise RuntimeError(
            f"/dev/shm has {available >> 20} MiB free but a client's staging area needs "
            f"{needed >> 20} MiB: lower --staging, or enlarge /dev/shm (docker: shm_size)"
        )


def prepare_socket_path(path: str) -> None:
    """Make the socket's folder if missing (owner-only), check that it is safe
    (simnpu.proto.socket_folder: PermissionError otherwise), and remove a socket file a dead
    daemon left; RuntimeError if a daemon answers there."""
    socket_folder.make_folder(os.path.dirname(os.path.abspath(path)))
    if os.path.exists(path):
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # left behind by a daemon that died
        else:
            raise RuntimeError(f"another simnpu daemon is already listening on {path}")
        finally:
            probe.close()


def remove_socket_file(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
