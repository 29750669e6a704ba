"""Whether the configured capacity is up, and what is still missing: what the router's health service,
its log and GetStats say, and why a request before it runs target-only.

Ready means a target replica, the draft pool (its floor: ``cluster/pool.ready_size``) and a worker
for every draft a task may use have registered: the port opens (and the router answers, target-only) while draft workers are still
loading and compiling their passes, which takes a minute on a cold 2-core machine.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from specserve.workers.registry import Endpoint


@dataclass
class Readiness:
    drafts: frozenset[str]  # the drafts the task table names (draft models: not the router's own proposers)
    pool_size: int  # draft workers the pool starts with
    ready: bool = False  # once true, stays: a worker lost later is a request's "lost", not a start-up
    waiting_for: str = "the registry"  # what is missing, in words ("" once ready)
    targets: int = 0  # target replicas registered at the last check (health follows them once ready)

    def check(self, endpoints: Iterable[Endpoint]) -> bool:
        """Look at the registered endpoints; True once everything is up (and from then on)."""
        endpoints = list(endpoints)
        self.targets = sum(e.kind == "target" for e in endpoints)
        if self.ready:
            return True
        drafts = [e for e in endpoints if e.kind == "draft"]
        unserved = sorted(self.drafts - {m for e in drafts for m in e.models})
        missing = []
        if not self.targets:
            missing.append("a target replica")
        if len(drafts) < self.pool_size:
            missing.append(f"{self.pool_size - len(drafts)} of {self.pool_size} draft workers "
                           "(loading models, compiling passes)")
        if unserved:
            missing.append(f"a worker for draft{'s' if len(unserved) > 1 else ''} {', '.join(unserved)}")
        self.waiting_for = "; ".join(missing)
        self.ready = not missing
        return self.ready

    def describe(self, endpoints: Iterable[Endpoint]) -> str:
        """What is up, for the log line that says the service is ready."""
        endpoints = list(endpoints)
        drafts = [e for e in endpoints if e.kind == "draft"]
        served = sorted({m for e in drafts for m in e.models})
        return (f"{self.targets} target replica{'s' if self.targets != 1 else ''}, {len(drafts)} draft "
                f"worker{'s' if len(drafts) != 1 else ''} serving {', '.join(served) or 'nothing'}")
