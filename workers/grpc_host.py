"""Hosting a grpc.aio server inside a Ray actor or Serve replica, and running model code on a "device".

The server gets an event loop of its own on a background thread, so it depends on nothing about how
Ray runs the host's methods. Model code runs on a single-thread executor, the process's *device*:
forward passes of concurrent sessions queue there as kernels do on a GPU stream, and on CPU that
thread is pinned to the cores standing in for this process's device.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc
import torch

from .sim_device import PassCurve, SimConfig, SimStream

log = logging.getLogger("specserve.grpc")
T = TypeVar("T")
# Streams carry a few hundred bytes per step; the cap only has to bound a malicious prompt.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# Keepalive pings on the long-lived connections between the router and the workers: a peer that
# vanished without closing its connection (a machine lost, a network partition) is noticed within
# time + timeout, and its streams fail; without them a silent peer looks like a slow one forever.
KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS = 10_000, 5_000
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                   ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                   ("grpc.keepalive_permit_without_calls", 1), ("grpc.http2.max_pings_without_data", 0)]
# SO_REUSEPORT off: a port something else holds is an error, not a port silently shared with it.
SERVER_OPTIONS = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.so_reuseport", 0),
                  ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS), ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                  # Accept the router's pings at that rate, even between streams.
                  ("grpc.keepalive_permit_without_calls", 1),
                  ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
                  ("grpc.http2.max_ping_strikes", 0)]


# The device thread's name as the OS knows it (/proc/PID/task/TID/comm), so that tools outside the
# process (the host-path bench, top -H) can tell the pass's CPU from the rest of the process's.
DEVICE_THREAD = "specserve-dev"


def name_os_thread(name: str) -> None:
    """Name the calling thread for the OS (Linux; 15 characters at most); elsewhere, nothing."""
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "w") as comm:
            comm.write(name[:15])
    except OSError:
        pass


class Device:
    """One thread that runs every model call of this process, pinned to its cores on CPU.

    With ``sim`` it stands for an accelerator it is not (workers/sim_device.py): each pass's math
    runs here, then holds the device for the time the pass's curve gives it."""

    def __init__(self, threads: int, cpus: tuple[int, ...] = (), sim: SimConfig | None = None) -> None:
        self.cpus = usable_cpus(cpus)
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="device", initializer=self._setup, initargs=(threads,))
        # Calls submitted (counted on the event loop) and started (on the device thread): one thread
        # writes each, so their difference, the calls waiting, needs no lock.
        self._submitted = self._started = 0
        self.sim = sim
        self.stream = SimStream() if sim is not None else None
        self.busy_seconds = 0.0  # in passes, summed (written on the device thread)

    def timing(self, model: str, role: str) -> PassCurve | None:
        """The curve ``model``'s passes take on this device (None: a real device, its passes' own time)."""
        return self.sim.curve(model, role) if self.sim is not None else None

    def passed(self, started: float, modelled: float | None, wait: bool = True) -> tuple[float, float | None]:
        """On the device thread, after a pass's math (begun at ``started``): on a simulated device,
        the pass queued for its ``modelled`` seconds, and with ``wait`` its end waited out here. The
        seconds the device was busy with it, and (simulated, not waited) when it ends."""
        if self.stream is None or modelled is None:
            busy, end = time.perf_counter() - started, None
        elif wait:
            busy, end = self.stream.hold(modelled, started), None
        else:
            begin, end = self.stream.enqueue(modelled, started)
            busy = end - begin
        self.busy_seconds += busy
        return busy, end

    def _setup(self, threads: int) -> None:
        if self.cpus:
            os.sched_setaffinity(0, self.cpus)  # this thread (and the torch threads it starts)
        torch.set_num_threads(threads)
        name_os_thread(DEVICE_THREAD)

    async def run(self, fn: Callable[..., T], *args) -> T:
        def started() -> T:
            self._started += 1
            return fn(*args)
        self._submitted += 1
        return await asyncio.get_running_loop().run_in_executor(self.executor, started)

    @property
    def waiting(self) -> bool:
        """Calls wait for the device thread (another model's pass, a Score): a run of passes back
        to back (workers/batching.py) yields to them."""
        return self._submitted > self._started

    async def run_timed(self, fn: Callable[..., T], *args) -> tuple[T, float]:
        """As ``run``, with the seconds ``fn`` itself took on the device. Timed on the device
        thread: a call queued behind other sessions' work must not report the wait as compute,
        or every cost measured from device times inflates with load."""
        def timed() -> tuple[T, float]:
            start = time.perf_counter()
            result = fn(*args)
            return result, time.perf_counter() - start
        return await self.run(timed)


# Pinning shares one machine's cores out among processes that stand for separate devices. Where a
# scheduler already gives each process its own share (Kubernetes pods), the KubeRay manifest turns
# it off: a fixed core number there means one core of a shared node.
PINNING_ENV = "SPECSERVE_CPU_PINNING"


def usable_cpus(wanted: tuple[int, ...]) -> set[int]:
    """The configured cores this process may run on; a missing core is logged and skipped."""
    if os.environ.get(PINNING_ENV, "on") == "off":
        return set()
    available = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    missing = set(wanted) - available
    if missing:
        log.warning("cores %s are not available to this process (it has %s); not pinning to them",
                    sorted(missing), sorted(available))
    return set(wanted) & available


class BackgroundServer:
    """A grpc.aio server on its own event-loop thread. ``add_servicers(server)`` registers the services;
    with ``credentials`` it serves TLS, and ``interceptors`` see every call first (authentication).
    ``reuse_port``: share the port with the other processes that bind it so (SO_REUSEPORT: the kernel
    spreads connections over them)."""

    def __init__(self, add_servicers: Callable[[grpc.aio.Server], None], host: str = "0.0.0.0", port: int = 0,
                 name: str = "grpc", credentials: grpc.ServerCredentials | None = None,
                 interceptors: Sequence[grpc.aio.ServerInterceptor] = (), reuse_port: bool = False) -> None:
        self._add_servicers = add_servicers
        self._options = [(key, int(reuse_port)) if key == "grpc.so_reuseport" else (key, value)
                         for key, value in SERVER_OPTIONS]
        self._bind = f"{host}:{port}"
        self._credentials = credentials
        self._interceptors = tuple(interceptors)
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure:
            raise self._failure

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_until_complete(self._start())
        except BaseException as exc:  # reported to the constructor's caller
            self._failure = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        self.server = grpc.aio.server(options=self._options, interceptors=self._interceptors)
        self._add_servicers(self.server)
        if self._credentials is None:
            self.port = self.server.add_insecure_port(self._bind)
        else:
            self.port = self.server.add_secure_port(self._bind, self._credentials)
        if not self.port:
            raise OSError(f"cannot listen on {self._bind}: the port is in use or the address is not local")
        await self.server.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def call(self, coro) -> object:
        """Run a coroutine on the server's loop from another thread and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self, grace: float = 1.0) -> None:
        if self._thread.is_alive():
            self.call(self.server.stop(grace))
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=grace + 5)


def advertised_host() -> str:
    """The address other nodes reach this process at (Ray's node IP when inside Ray)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:  # outside Ray: fall back to the hostname's address
        pass
    return socket.gethostbyname(socket.gethostname())
