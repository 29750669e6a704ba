"""The draft-worker pool: named Ray actors (not Serve deployments) on the draft devices.

The router creates the pool when it starts and owns it: the workers live as long as the router
replica, and a restarted router finds the ones still running by name.
"""

from __future__ import annotations

import logging

import ray

from specserve.workers.draft_worker import DraftWorker

from .config import ServiceConfig
from .models import ModelSet
from .placement import actor_options, cluster_gpus

log = logging.getLogger("specserve.pool")


def start_draft_pool(config: ServiceConfig, models: ModelSet) -> list[ray.actor.ActorHandle]:
    pool = config.draft_pool
    names = pool.drafts or tuple(models.drafts)
    unknown = [name for name in names if name not in models.drafts]
    if unknown:
        raise ValueError(f"draft_pool.drafts names unknown drafts {unknown}; known: {', '.join(models.drafts)}")
    specs = {name: models.spec(models.drafts[name], pool.threads) for name in names}
    options = actor_options(pool, cluster_gpus())
    actor = ray.remote(DraftWorker)
    workers = []
    for i in range(pool.workers):
        worker_id = f"draft-worker-{i}"
        workers.append(actor.options(name=worker_id, namespace=config.namespace, get_if_exists=True,
                                     max_concurrency=4, **options)
                       .remote(worker_id, specs, pool, config.namespace, config.router.heartbeat_seconds))
    log.info("draft pool: %d workers serving %s, each with %s", pool.workers, ", ".join(names), options)
    return workers
