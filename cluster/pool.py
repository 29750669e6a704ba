"""The draft-worker pool: named Ray actors (not Serve deployments) on the draft devices.

The router creates the pool when it starts and owns it: the workers live as long as the router
replica. Their names carry a generation of their own, so a router started while the old one is
still stopping (a Serve rolling update) starts its own pool instead of adopting the old router's,
which goes with it.

The pool keeps its size. A worker whose process dies is restarted by Ray (``max_restarts``) with
its models and its name; one that is gone for good (killed without restart, its restarts used up)
is replaced by a new worker, found by the router's ``supervise`` loop. Requests that were drafting
on it carry on meanwhile (router/remote_draft.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

import ray
from ray.exceptions import ActorDiedError, RayActorError

from specserve.workers.draft_worker import DraftWorker
from specserve.workers.registry import Registration

from .config import ServiceConfig
from .models import ModelSet
from .placement import place

log = logging.getLogger("specserve.pool")
SUPERVISE_SECONDS = 2.0  # how often the pool checks that its workers are alive
PING_TIMEOUT_SECONDS = 10.0  # a busy worker answers a ping within this; a stuck one is the router's problem
SHORT_LIVED_SECONDS = 60.0  # a replacement gone sooner than this doubles its slot's wait
MAX_BACKOFF_SECONDS = 300.0


class DraftPool:
    def __init__(self, config: ServiceConfig, models: ModelSet) -> None:
        pool = config.draft_pool
        names = pool.drafts or tuple(models.drafts)
        unknown = [name for name in names if name not in models.drafts]
        if unknown:
            raise ValueError(f"draft_pool.drafts names unknown drafts {unknown}; known: {', '.join(models.drafts)}")
        self.config = config
        self.specs = {name: models.spec(models.drafts[name], pool.threads) for name in names}
        self.target = models.spec(models.target, pool.threads)  # what its EAGLE-3 heads (if any) are checked against
        self.options = place(pool)
        self.generation = uuid.uuid4().hex[:6]
        # No drafts (a target served with the draft-free proposers alone): no workers to start.
        self.workers = [self._start(i) for i in range(pool.workers if names else 0)]
        self.replaced = 0
        log.info("draft pool: %d workers serving %s, each with %s", len(self.workers), ", ".join(names) or "no drafts",
                 self.options)

    def _start(self, slot: int, replacement: bool = False) -> ray.actor.ActorHandle:
        worker_id = f"draft-worker-{slot}-{self.generation}"
        if replacement:  # a name of its own: routers pass over the failed one's for a while
            worker_id += f"-{uuid.uuid4().hex[:4]}"
        actor = ray.remote(DraftWorker).options(name=worker_id, namespace=self.config.namespace, max_concurrency=4,
                                                max_restarts=-1, **self.options)
        registration = Registration(self.config.namespace, self.config.router.heartbeat_seconds)
        return actor.remote(worker_id, self.specs, self.config.draft_pool, registration, self.target)

    async def supervise(self) -> None:
        """Forever: replace each worker that is gone for good. A slot whose replacements keep dying
        soon (a model that fails to load, say) is retried ever more rarely, up to every 5 minutes."""
        wait = [SUPERVISE_SECONDS] * len(self.workers)  # per slot: before the next replacement
        last = [float("-inf")] * len(self.workers)  # per slot: when it was last replaced
        while True:
            await asyncio.sleep(SUPERVISE_SECONDS)
            for slot, worker in enumerate(self.workers):
                try:
                    if not await _gone(worker) or time.monotonic() - last[slot] < wait[slot]:
                        continue
                    short_lived = time.monotonic() - last[slot] < SHORT_LIVED_SECONDS
                    wait[slot] = min(2 * wait[slot], MAX_BACKOFF_SECONDS) if short_lived else SUPERVISE_SECONDS
                    self.workers[slot] = self._start(slot, replacement=True)
                    last[slot] = time.monotonic()
                    self.replaced += 1
                    log.warning("draft pool: the worker in slot %d is gone; started a replacement", slot)
                except Exception:  # supervision must outlive any one failure
                    log.exception("draft pool: supervising slot %d failed; trying again", slot)

    def stop(self) -> None:
        for worker in self.workers:
            ray.kill(worker)


async def _gone(worker: ray.actor.ActorHandle) -> bool:
    try:
        async with asyncio.timeout(PING_TIMEOUT_SECONDS):
            await asyncio.wrap_future(worker.ping.remote().future())
    except ActorDiedError:  # dead for good: Ray will not restart it
        return True
    except (RayActorError, TimeoutError):  # restarting, or busy loading its models
        pass
    return False
