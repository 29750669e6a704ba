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
from collections.abc import Sequence

import ray

from specserve.router.canary import ArmSums, CanaryConfig, CanaryStatus
from specserve.router.metrics import CanaryMetrics
from specserve.workers.logs import log_to_stderr
from specserve.workers.registry import REGISTRY_NAME, Registration, start_registry

from .canary import Canaries
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
        self.canaries = Canaries(self.pool, models.tasks, CanaryMetrics())
        # The pool's supervision and autoscaling run on a loop of their own: Serve's replica loop
        # is for the calls Serve makes.
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name="draft-pool", daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self.pool.run())

    async def swap_draft(self, name: str, source: str, timeout: float = 300.0) -> list[str]:  # commands/swap_draft.py's
        """The draft pool serves the draft (or EAGLE-3 head) at ``source`` as draft ``name`` from now
        on (see ``DraftPool.swap_draft``); called through Serve: the control deployment's handle."""
        return await self._on_pool(self.pool.swap_draft(name, source), timeout)

    async def start_canary(self, draft: str, source: str, version: str = "", tasks: Sequence[str] = (),
                           config: CanaryConfig = CanaryConfig(), timeout: float = 300.0) -> CanaryStatus:
        """Serve the draft at ``source`` as a canary of ``draft`` (``Canaries.start``); returns once it
        runs (loaded on every worker)."""
        return await self._on_pool(self.canaries.start(draft, source, version, tasks, config), timeout)

    async def end_canary(self, draft: str, decision: str) -> CanaryStatus:
        """An operator's promote or roll back of ``draft``'s running canary."""
        return await self._on_pool(_now(self.canaries.end, draft, decision))

    async def canary_report(self, router_id: str, counts: dict[str, tuple[ArmSums, ArmSums]]) -> tuple[CanaryStatus, ...]:
        """A router's canary arms in; every canary's status out (cluster/ingress.py, every REPORT_SECONDS)."""
        return await self._on_pool(_now(self.canaries.report, router_id, counts))

    async def canary_statuses(self) -> tuple[CanaryStatus, ...]:
        """Every canary, running and lately finished (``specserve canary --wait`` follows one)."""
        return await self._on_pool(_now(lambda: tuple(self.canaries.statuses.values())))

    async def _on_pool(self, work, timeout: float = 30.0):
        # The pool and its canaries are changed on the pool's loop only; Serve's loop waits, free.
        # A caller's timeout leaves the work going (shielded): a swap or a canary's load cancelled
        # halfway would leave the pool between two states.
        done = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))
        return await asyncio.wait_for(asyncio.shield(done), timeout)

    def check_health(self) -> None:
        if not self._thread.is_alive():
            raise RuntimeError("the draft pool's supervision stopped")

    def __del__(self) -> None:
        pool = getattr(self, "pool", None)
        if pool is not None:
            pool.stop()


async def _now(call, *args):
    return call(*args)


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
