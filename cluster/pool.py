"""The draft-worker pool: named Ray actors (not Serve deployments) on the draft devices.

The router creates the pool when it starts and owns it: the workers live as long as the router
replica. Their names carry a generation of their own, so a router started while the old one is
still stopping (a Serve rolling update) starts its own pool instead of adopting the old router's,
which goes with it.
"""

from __future__ import annotations

import logging
import uuid

import ray

from specserve.workers.draft_worker import DraftWorker

from .config import ServiceConfig
from .models import ModelSet
from .placement import place

log = logging.getLogger("specserve.pool")


def start_draft_pool(config: ServiceConfig, models: ModelSet) -> list[ray.actor.ActorHandle]:
    pool = config.draft_pool
    names = pool.drafts or tuple(models.drafts)
    unknown = [name for name in names if name not in models.drafts]
    if unknown:
        raise ValueError(f"draft_pool.drafts names unknown drafts {unknown}; known: {', '.join(models.drafts)}")
    specs = {name: models.spec(models.drafts[name], pool.threads) for name in names}
    options = place(pool)
    actor = ray.remote(DraftWorker)
    workers, generation = [], uuid.uuid4().hex[:6]
    for i in range(pool.workers):
        worker_id = f"draft-worker-{i}-{generation}"
        workers.append(actor.options(name=worker_id, namespace=config.namespace, max_concurrency=4, **options)
                       .remote(worker_id, specs, pool, config.namespace, config.router.heartbeat_seconds))
    log.info("draft pool: %d workers serving %s, each with %s", pool.workers, ", ".join(names), options)
    return workers
