"""The control deployment: what the service must have exactly one of, whatever the router processes.

One Serve replica on the router's node holds the registry (the table of workers' endpoints) and
the draft pool (its workers, their supervision and autoscaling). The router processes, however many
``router.replicas`` asks for, find the registry by name and take no part in the pool; one of them
failing or being replaced (a rollout) leaves both, and so every draft worker, standing.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import ray

from specserve.workers.logs import log_to_stderr
from specserve.workers.registry import REGISTRY_NAME, Registration, start_registry

from .config import ServiceConfig
from .models import ModelSet
from .placement import router_options
from .pool import DraftPool

log = logging.getLogger("specserve.control")
REGISTRY_POLL_SECONDS = 0.2
REGISTRY_WAIT_SECONDS = 120.0  # the control replica starting beside the routers: Serve places both at once


class Control:
    def __init__(self, config: dict, models: ModelSet) -> None:
        log_to_stderr()  # this process is Serve's: specserve's lines would be lost
        cfg = ServiceConfig.model_validate(config)
        registration = Registration(cfg.namespace, cfg.router.heartbeat_seconds)
        self.registry = start_registry(registration, router_options(cfg.router)["resources"])
        self.pool = DraftPool(cfg, models)
        # The pool's supervision and autoscaling run on a loop of their own: Serve's replica loop
        # is for the calls Serve makes.
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="draft-pool", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.pool.run())

    def swap_head(self, name: str, source: str, timeout: float = 300.0) -> list[str]:  # commands/swap_head.py's
        """The draft pool serves the EAGLE-3 head at ``source`` as draft ``name`` from now on (see
        ``DraftPool.swap_head``); called through Serve: the control deployment's handle."""
        return asyncio.run_coroutine_threadsafe(self.pool.swap_head(name, source), self.loop).result(timeout)

    def check_health(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the draft pool's supervision stopped")

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.stop()


def find_registry(namespace: str, timeout: float = REGISTRY_WAIT_SECONDS) -> ray.actor.ActorHandle:
    """The registry the control replica started, once it exists (a router process may start first)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return ray.get_actor(REGISTRY_NAME, namespace=namespace)
        except ValueError:  # not created yet
            if time.monotonic() > deadline:
                raise RuntimeError(f"no registry in namespace {namespace!r} after {timeout:.0f} s: the control "
                                   f"deployment did not start (see its replica's log)") from None
            time.sleep(REGISTRY_POLL_SECONDS)
