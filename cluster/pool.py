"""The draft-worker pool: named Ray actors (not Serve deployments) on the draft devices.

The control deployment (cluster/control.py) creates the pool when it starts and owns it: the
workers live as long as its replica, whatever happens to the router processes. Their names carry a
generation of their own, so a control replica started while the old one is still stopping (a Serve
rolling update) starts its own pool instead of adopting the old one's, which goes with it.

Without ``draft_pool.autoscaling`` the pool keeps its size; with it, the pool follows its load
within the bounds (``autoscale``: policy in cluster/autoscaling.py). A worker whose process dies is restarted by Ray (``max_restarts``) with
its models and its name; one that is gone for good (killed without restart, its restarts used up)
is replaced by a new worker, found by the router's ``supervise`` loop. Requests that were drafting
on it carry on meanwhile (router/remote_draft.py).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import replace
from pathlib import Path

import ray
from ray.exceptions import ActorDiedError, RayActorError

from specserve.router.metrics import PoolMetrics
from specserve.workers.draft_worker import DraftWorker, check_version_tokenizer
from specserve.workers.heads.format import is_head
from specserve.workers.heads.medusa import is_medusa
from specserve.workers.proposer_kinds import VERSION_MARK, base_draft
from specserve.workers.model_host import DRAIN_SECONDS, HostLoad
from specserve.workers.registry import Registration

from .autoscaling import Hysteresis, pool_load, pool_wanted
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
        names = served_drafts(config, models)
        unknown = [name for name in names if name not in models.drafts]
        if unknown:
            raise ValueError(f"draft_pool.drafts names unknown drafts {unknown}; known: {', '.join(models.drafts)}")
        if theirs := sorted(set(names) & models.on_verifier):
            raise ValueError(f"draft_pool.drafts names {theirs}, which the target replicas serve (Medusa heads, "
                             f"models.on_replica): take them out of one of the two")
        self.config = config
        self.scaling = pool.autoscaling if names else None  # no drafts: nothing to scale
        self.specs = {name: models.draft_spec(name, pool.threads) for name in names}
        self.target = models.spec(models.target, pool.threads)  # what its EAGLE-3 heads (if any) are checked against
        self.options = place(pool)
        self.generation = uuid.uuid4().hex[:6]
        size = initial_size(config, models)
        self.workers: dict[int, ray.actor.ActorHandle] = {slot: self._start(slot) for slot in range(size)}
        self.next_slot = size
        # Workers being removed, letting their sessions end (the task doing it -> the worker).
        self.draining: dict[asyncio.Task, ray.actor.ActorHandle] = {}
        self.replaced = 0
        # Heads swapped, and versions added or retired, since the pool started (their state now is
        # self.specs'). Ray restarts a crashed worker with the arguments it was first started with;
        # supervision puts such a worker right (_keep_current).
        self.changed: set[str] = set()
        self._changing = asyncio.Lock()  # swaps, versions added and retired: one at a time
        self.metrics: PoolMetrics | None = None  # set by ``run``, in the process that runs the pool
        bounds = (f", autoscaling within {self.scaling.min_workers}-{self.scaling.max_workers}"
                  if self.scaling else "")
        log.info("draft pool: %d workers serving %s, each with %s%s", size, ", ".join(names) or "no drafts",
                 self.options, bounds)

    async def swap_draft(self, name: str, source: str) -> list[str]:
        """Serve the draft at ``source`` (a model directory; a head directory for an EAGLE-3 head) as
        draft ``name`` on every worker, without a restart (workers/draft_worker.py ``swap_draft``:
        sessions open on the old one finish on it), and on every worker started from now on. Returns
        the workers swapped. A worker that fails to load it undoes the swap: the ones already
        swapped go back to the one before, and the error is raised."""
        if name not in self.specs or base_draft(name) != name:
            raise ValueError(f"the draft pool serves no draft {name!r}; it serves {', '.join(self.specs) or 'none'}")
        await asyncio.to_thread(self.check_source, name, source)
        before = self.specs[name].source
        swapped = await self._everywhere(name, source, lambda w: w.swap_draft.remote(name, source),
                                         undo=lambda w: w.swap_draft.remote(name, before))
        log.info("draft pool: draft %s is now the one at %s on %s", name, source, ", ".join(swapped))
        return swapped

    async def add_version(self, name: str, source: str) -> list[str]:
        """Serve the draft at ``source`` beside its draft as ``name`` (``draft@version``) on every
        worker, and on every worker started from now on; undone everywhere if one fails to load it."""
        base = base_draft(name)
        if base == name or base not in self.specs or name in self.specs:
            raise ValueError(f"{name!r} is not a new version of a draft the pool serves ({', '.join(self.specs)}): "
                             f"name it <draft>{VERSION_MARK}<version>, a version not served yet")
        await asyncio.to_thread(self.check_source, base, source)
        added = await self._everywhere(name, source, lambda w: w.add_version.remote(name, source),
                                       undo=lambda w: w.retire_version.remote(name))
        log.info("draft pool: serving the draft at %s as %s beside %s on %s", source, name, base, ", ".join(added))
        return added

    def check_source(self, name: str, source: str) -> None:
        """What a worker would find wrong in the draft at ``source`` as a new version of ``name``, said
        before any worker loads it, where this process can read it (else the workers check as they
        load): a model for a model and a head for a head, and a model's tokenizer the target's."""
        if not Path(source).exists():
            log.info("draft pool: %s is not readable here; the workers check it as they load it", source)
            return
        if is_medusa(source):
            raise ValueError(f"{source} holds Medusa heads: the target replicas serve those (models.drafts, a "
                             f"restart), not the draft pool")
        head = is_head(self.specs[name].source)
        if is_head(source) != head:
            what = "a head (EAGLE-3's, or an MTP module)" if head else "a draft model"
            raise ValueError(f"draft {name!r} is {what}; {source} is not: a new version must be {what} too "
                             f"(`specserve distill --method {'eagle3' if head else 'draft'}` writes one)")
        if not head:
            check_version_tokenizer(self.target.source, source, name)

    async def retire_version(self, name: str) -> list[str]:
        """Stop serving version ``name`` on every worker (their sessions on it finish on it)."""
        if base_draft(name) == name or name not in self.specs:
            return []
        retired = await self._everywhere(name, None, lambda w: w.retire_version.remote(name), undo=None)
        log.info("draft pool: version %s retired on %s", name, ", ".join(retired))
        return retired

    async def _everywhere(self, name: str, source: str | None, call, undo) -> list[str]:
        """Make draft ``name`` the one at ``source`` (None: not served) on every worker through
        ``call`` (a worker -> its Ray call), and in what a worker started from now loads. Returns the
        ids of the workers it was done on.

        Workers started while it runs (supervision, autoscaling) start with the new state and get the
        call too (harmless), until none is left; one that Ray is restarting is left to supervision,
        which puts it right once it is back (``_keep_current``). A worker that fails raises the error,
        after ``undo`` on the workers done and the pool's state put back."""
        async with self._changing:  # one change at a time: each puts back only its own on failure
            return await self._change_everywhere(name, source, call, undo)

    async def _change_everywhere(self, name: str, source: str | None, call, undo) -> list[str]:
        before, was_changed = self.specs.get(name), name in self.changed
        self.specs = {n: spec for n, spec in self.specs.items() if n != name}
        if source is not None:
            self.specs[name] = replace(before or self.specs[base_draft(name)], source=source)
        self.changed.add(name)
        done: dict[int, tuple[ray.actor.ActorHandle, str]] = {}  # id(handle) -> (handle, worker id)
        away: set[int] = set()  # workers restarting: supervision puts them right once back
        try:
            while pending := [w for w in self.workers.values() if id(w) not in done and id(w) not in away]:
                answers = await asyncio.gather(*(call(w) for w in pending), return_exceptions=True)
                for worker, answer in zip(pending, answers, strict=True):
                    if isinstance(answer, RayActorError):
                        away.add(id(worker))
                    elif isinstance(answer, BaseException):
                        raise answer
                    else:
                        done[id(worker)] = (worker, answer)
        except Exception:
            self.specs = {n: spec for n, spec in self.specs.items() if n != name} | ({name: before} if before else {})
            if not was_changed:
                self.changed.discard(name)
            back = [w for w, _ in done.values() if w in self.workers.values()]
            if undo is not None:
                await asyncio.gather(*(undo(w) for w in back), return_exceptions=True)
            log.warning("draft pool: %s could not be made the one at %s; %d worker(s) put back", name, source,
                        len(back))
            raise
        return [worker_id for _, worker_id in done.values()]

    def _start(self, slot: int, replacement: bool = False) -> ray.actor.ActorHandle:
        worker_id = f"draft-worker-{slot}-{self.generation}"
        if replacement:  # a name of its own: routers pass over the failed one's for a while
            worker_id += f"-{uuid.uuid4().hex[:4]}"
        actor = ray.remote(DraftWorker).options(name=worker_id, namespace=self.config.namespace, max_concurrency=4,
                                                max_restarts=-1, **self.options)
        registration = Registration(self.config.namespace, self.config.router.heartbeat_seconds)
        return actor.remote(worker_id, self.specs, self.config.draft_pool, registration, self.target)

    async def run(self) -> None:
        """Forever: keep the workers alive and, with autoscaling, the pool sized to its load."""
        self.metrics = PoolMetrics()
        self._report()
        await asyncio.gather(self.supervise(), self.autoscale())

    async def supervise(self) -> None:
        """Forever: replace each worker that is gone for good. A slot whose replacements keep dying
        soon (a model that fails to load, say) is retried ever more rarely, up to every 5 minutes."""
        wait: dict[int, float] = {}  # per slot: before the next replacement
        last: dict[int, float] = {}  # per slot: when it was last replaced
        while True:
            await asyncio.sleep(SUPERVISE_SECONDS)
            for slot, worker in list(self.workers.items()):
                try:
                    since = time.monotonic() - last.get(slot, float("-inf"))
                    if not await _gone(worker):
                        await self._keep_current(worker)
                        continue
                    if self.workers.get(slot) is not worker or since < wait.get(slot, SUPERVISE_SECONDS):
                        continue  # removed meanwhile, or replaced too recently
                    short_lived = since < SHORT_LIVED_SECONDS
                    wait[slot] = min(2 * wait.get(slot, SUPERVISE_SECONDS), MAX_BACKOFF_SECONDS) if short_lived \
                        else SUPERVISE_SECONDS
                    self.workers[slot] = self._start(slot, replacement=True)
                    last[slot] = time.monotonic()
                    self.replaced += 1
                    log.warning("draft pool: the worker in slot %d is gone; started a replacement", slot)
                except Exception:  # supervision must outlive any one failure
                    log.exception("draft pool: supervising slot %d failed; trying again", slot)
            self._report()

    async def _keep_current(self, worker: ray.actor.ActorHandle) -> None:
        """Put a worker right where it serves another version of a draft swapped, or added or
        retired as a version, since the pool started (Ray restarted it with its first arguments).
        Sessions opened on it meanwhile drafted with the version before: slower, never other output."""
        if not self.changed:
            return
        try:
            sources = await asyncio.wait_for(worker.sources.remote(), PING_TIMEOUT_SECONDS)
        except (asyncio.TimeoutError, RayActorError):  # restarting, or gone: the next round sees it
            return
        for name in tuple(self.changed):  # a change may add to it meanwhile
            spec, served = self.specs.get(name), sources.get(name)  # the pool's now (set first by one in progress)
            if spec is None and served is not None:
                worker_id = await worker.retire_version.remote(name)
            elif spec is not None and served != spec.source and (served is not None or base_draft(name) != name):
                call = worker.swap_draft if base_draft(name) == name else worker.add_version
                worker_id = await call.remote(name, spec.source)
            else:  # as the pool serves it
                continue
            log.warning("draft pool: %s came back with draft %s as it first served it (restarted); put it right "
                        "(%s)", worker_id, name, spec.source if spec else "retired")

    async def autoscale(self) -> None:
        """Forever, with ``draft_pool.autoscaling``: read the workers' load every metrics interval and
        add or remove workers as ``cluster/autoscaling.py`` decides. A new worker registers when its
        models are loaded and takes new sessions (the router picks the least loaded); a removed one
        first stops taking sessions and lets its live ones end (``DraftWorker.drain``), and the
        router reopens any left then on another worker from its history (router/remote_draft.py)."""
        if self.scaling is None:
            return
        decision = Hysteresis(self.scaling)
        before: dict[int, HostLoad] = {}
        while True:
            await asyncio.sleep(self.scaling.metrics_interval_s)
            try:
                now = await self._loads()
                load = pool_load(before, now)
                before = now
                wanted = pool_wanted(load, len(self.workers), self.scaling)
                size = decision.decide(time.monotonic(), len(self.workers), wanted)
                if size != len(self.workers):
                    log.info("draft pool: %d sessions, steps waiting %.1f ms for a pass: %d -> %d workers",
                             load.sessions, load.mean_wait_s * 1000, len(self.workers), size)
                    self._resize(size, now)
                self._report(wanted)
            except Exception:  # scaling must outlive any one failure (a worker dying mid-reading)
                log.exception("draft pool: autoscaling failed this round; trying again")

    async def _loads(self) -> dict[int, HostLoad]:
        """Slot -> load of each worker that answers in time (a starting one does not)."""
        async def read(slot: int, worker) -> tuple[int, HostLoad | None]:
            try:
                async with asyncio.timeout(PING_TIMEOUT_SECONDS):
                    return slot, await asyncio.wrap_future(worker.load.remote().future())
            except (RayActorError, TimeoutError):
                return slot, None
        readings = await asyncio.gather(*(read(slot, w) for slot, w in list(self.workers.items())))
        return {slot: load for slot, load in readings if load is not None}

    def _resize(self, size: int, loads: dict[int, HostLoad]) -> None:
        while len(self.workers) < size:
            self.workers[self.next_slot] = self._start(self.next_slot)
            self.next_slot += 1
        if len(self.workers) > size:  # the least busy go (a starting one, with no reading, first)
            by_sessions = sorted(self.workers, key=lambda s: (loads[s].sessions if s in loads else -1, -s))
            for slot in by_sessions[:len(self.workers) - size]:
                worker = self.workers.pop(slot)
                task = asyncio.create_task(self._remove(slot, worker))
                self.draining[task] = worker
                task.add_done_callback(self.draining.pop)

    async def _remove(self, slot: int, worker: ray.actor.ActorHandle) -> None:
        try:
            async with asyncio.timeout(DRAIN_SECONDS + PING_TIMEOUT_SECONDS):
                left = await asyncio.wrap_future(worker.drain.remote().future())
            log.info("draft pool: removed the worker in slot %d (%d sessions left to reopen elsewhere)", slot, left)
        except (RayActorError, TimeoutError) as exc:
            log.warning("draft pool: the worker in slot %d did not drain (%s); removed it", slot, exc)
        ray.kill(worker, no_restart=True)

    def _report(self, wanted: int | None = None) -> None:
        if self.metrics is not None:
            self.metrics.draft_workers.set(len(self.workers), {"state": "serving"})
            self.metrics.draft_workers.set(len(self.draining), {"state": "draining"})
            if wanted is not None:
                self.metrics.draft_workers.set(wanted, {"state": "wanted"})

    def stop(self) -> None:
        for task, worker in list(self.draining.items()):
            task.cancel()
            ray.kill(worker)
        for worker in self.workers.values():
            ray.kill(worker)


def ready_size(config: ServiceConfig, models: ModelSet) -> int:
    """The draft workers a router waits for before it says SERVING: the pool's floor (an autoscaled
    pool may drop to ``min_workers`` before its idle start-up workers register, and a router started
    later finds it there), and never more than it starts with."""
    size = initial_size(config, models)
    autoscaling = config.draft_pool.autoscaling
    return min(size, autoscaling.min_workers) if autoscaling is not None else size


def served_drafts(config: ServiceConfig, models: ModelSet) -> tuple[str, ...]:
    """The drafts the pool's workers serve (``draft_pool.drafts``; empty: every draft but those the
    target replicas serve: Medusa heads, and the heads ``models.on_replica`` names)."""
    return config.draft_pool.drafts or tuple(name for name in models.drafts if name not in models.on_verifier)


def initial_size(config: ServiceConfig, models: ModelSet) -> int:
    """The workers the pool starts with: ``draft_pool.workers`` within the autoscaling bounds; none
    where no draft is served (the draft-free proposers alone)."""
    pool = config.draft_pool
    if not (pool.drafts or models.drafts):
        return 0
    if pool.autoscaling is None:
        return pool.workers
    return min(max(pool.workers, pool.autoscaling.min_workers), pool.autoscaling.max_workers)


async def _gone(worker: ray.actor.ActorHandle) -> bool:
    try:
        async with asyncio.timeout(PING_TIMEOUT_SECONDS):
            await asyncio.wrap_future(worker.ping.remote().future())
    except ActorDiedError:  # dead for good: Ray will not restart it
        return True
    except (RayActorError, TimeoutError):  # restarting, or busy loading its models
        pass
    return False
