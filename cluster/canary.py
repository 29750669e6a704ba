"""A draft's canaries, run by the control deployment (cluster/control.py), on the draft pool's loop.

``start`` loads the new version (a draft model, or an EAGLE-3 head: the draft's kind) on every
draft worker beside the draft (``draft@version``), then
marks it running: each router, reporting every REPORT_SECONDS (cluster/ingress.py), learns it and
routes a share of the draft's requests of its tasks to it (router/canary.py says how, and how the
arms are tested). The routers' counts are summed here and tested at each look; the first decision
(or an operator's, ``end``) settles it (its state, arms and z also in the ``specserve_canary_*``
gauges):

    promoted     the draft becomes the new version (the pool swaps it: sessions open on the old
                 one finish on it), then the version's own name is retired
    rolled back  the version's name is retired; the draft never changed

A version is retired RETIRE_AFTER_SECONDS after its decision (after the swap, for a promotion),
once every router has read that it is no longer running and opens no session on it; its open
sessions finish on it (the workers keep it while a stream holds it). A promotion serves what the
version's directory holds then (a head loaded again; a draft model as loaded for the canary): one
changed since the canary started (re-distilled to the same ``--out``, say) is not promoted. Every
step is logged, and every router's ``stats`` shows it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from specserve.router.canary import (FAILED, FINISHED, PROMOTE, PROMOTED, PROMOTING, ROLLED_BACK,
                                     ROLLING_BACK, RUNNING, ArmSums, CanaryConfig, CanaryStatus, decide)
from specserve.router.metrics import CanaryMetrics
from specserve.workers.proposer_kinds import VERSION_MARK, base_draft

from .pool import DraftPool

log = logging.getLogger("specserve.canary")
REPORT_SECONDS = 1.0  # how often each router reports its arms and reads the canaries' states
RETIRE_AFTER_SECONDS = 5 * REPORT_SECONDS  # every router has read the decision by then (one late report aside)
KEEP_FINISHED = 8  # finished canaries kept for stats


class Canaries:
    """``tasks``: task -> the drafts allowed to serve it (a canary's tasks are its draft's)."""

    def __init__(self, pool: DraftPool, tasks: Mapping[str, Sequence[str]],
                 metrics: CanaryMetrics | None = None) -> None:
        self.pool = pool
        self.metrics = metrics  # None: no gauges (tests without Ray)
        self.tasks = {task: tuple(names) for task, names in tasks.items()}
        self.statuses: dict[str, CanaryStatus] = {}  # canary id -> its status, in the order started
        self.reports: dict[str, dict[str, tuple[ArmSums, ArmSums]]] = {}  # canary id -> router id -> its arms
        self._settling: set[asyncio.Task] = set()
        self.fingerprints: dict[str, tuple | None] = {}  # canary id -> its directory's files when it started

    async def start(self, draft: str, source: str, version: str = "", tasks: Sequence[str] = (),
                    config: CanaryConfig = CanaryConfig()) -> CanaryStatus:
        """Serve the draft at ``source`` as a canary of ``draft`` on a share of ``tasks``' traffic
        (default: every task the draft serves). Raises ValueError saying what to fix."""
        drafts = [name for name in self.pool.specs if base_draft(name) == name]
        if draft not in drafts:
            raise ValueError(f"no draft {draft!r} in the draft pool to canary; it serves {', '.join(drafts) or 'none'}")
        if busy := [s for s in self.statuses.values() if s.draft == draft and s.state not in FINISHED]:
            then = (f"end it (`specserve canary --draft {draft} --roll-back`)" if busy[0].state == RUNNING
                    else "wait a few seconds for it to finish")
            raise ValueError(f"draft {draft!r} has a canary {busy[0].state} ({busy[0].version}): wait for its "
                             f"decision, or {then}")
        serving = [task for task, names in self.tasks.items() if draft in names]
        if not serving:
            raise ValueError(f"draft {draft!r} serves no task (router.tasks): a canary of it would see no traffic")
        if unknown := sorted(set(tasks) - set(serving)):
            raise ValueError(f"tasks {unknown} are not served by draft {draft!r}; its tasks: {', '.join(serving)}")
        version = f"{draft}{VERSION_MARK}{version_tag(version or Path(source).name)}"
        if version in self.pool.specs:
            raise ValueError(f"version {version} is served already; give the canary another --version")
        status = CanaryStatus(uuid.uuid4().hex[:8], draft, version, source, tuple(tasks or serving), config,
                              started=time.time())
        self.statuses[status.canary_id] = status
        self.fingerprints[status.canary_id] = fingerprint(source)
        log.info("canary %s: loading the draft at %s as %s on the draft pool", status.canary_id, source, version)
        try:
            await self.pool.add_version(version, source)
        except BaseException as exc:  # cancelled too: never left loading
            self._set(status.canary_id, state=FAILED, reason=f"it did not load: {exc}", finished=time.time())
            raise
        log.info("canary %s: %s serving %.0f%% of draft %s's requests of %s; a look every %d requests per arm, up "
                 "to %d; promoted at z >= %.2f (confidence %.2f over %d looks), rolled back at z <= -%.2f or "
                 "undecided at the last look", status.canary_id, version, 100 * config.share, draft, ", ".join(status.tasks),
                 config.min_requests, config.max_requests, config.z_needed, config.confidence, config.looks,
                 config.z_needed)
        return self._set(status.canary_id, state=RUNNING)

    def report(self, router_id: str, counts: Mapping[str, tuple[ArmSums, ArmSums]]) -> tuple[CanaryStatus, ...]:
        """A router's arms since each canary began (cumulative: the latest replaces its last); each
        running canary is tested on every router's sum. Returns every canary's status."""
        for canary_id, arms in counts.items():
            if canary_id in self.statuses:
                self.reports.setdefault(canary_id, {})[router_id] = arms
        for status in list(self.statuses.values()):
            if status.state == RUNNING:
                self._look(status)
        return tuple(self.statuses.values())

    def end(self, draft: str, decision: str) -> CanaryStatus:
        """An operator's decision on ``draft``'s running canary, taken as a look's would be."""
        running = [s for s in self.statuses.values() if s.draft == draft and s.state == RUNNING]
        if not running:
            raise ValueError(f"draft {draft!r} has no canary running; `specserve stats` lists the canaries")
        return self._decide(running[0], decision, f"{decision} by an operator")

    def _look(self, status: CanaryStatus) -> None:
        arms = self.reports.get(status.canary_id, {}).values()
        base = sum((b for b, _ in arms), ArmSums())
        canary = sum((c for _, c in arms), ArmSums())
        decision, looks = decide(base, canary, status.config, status.looks)
        looked = looks > status.looks
        status = self._set(status.canary_id, base=base, canary=canary, looks=looks)
        if looked:
            log.info("canary %s look %d/%d: alpha %.3f on %d requests (%s) vs %.3f on %d (%s): z %.2f, needed %.2f%s",
                     status.canary_id, looks, status.config.looks, canary.alpha, canary.requests, status.version,
                     base.alpha, base.requests, status.draft, status.z, status.config.z_needed,
                     f": {decision}" if decision else "")
        if decision:
            self._decide(status, decision, f"look {looks}: z {status.z:.2f}, needed {status.config.z_needed:.2f}")

    def _decide(self, status: CanaryStatus, decision: str, reason: str) -> CanaryStatus:
        status = self._set(status.canary_id, state=PROMOTING if decision == PROMOTE else ROLLING_BACK, reason=reason)
        log.info("canary %s: %s (%s)", status.canary_id, status.state, reason)
        task = asyncio.get_running_loop().create_task(self._settle(status, decision))
        self._settling.add(task)
        task.add_done_callback(self._settling.discard)
        return status

    async def _settle(self, status: CanaryStatus, decision: str) -> None:
        """Promote (swap the draft to the version now: new sessions of the draft draft with it) or
        not, then retire the version's name once no router routes to it, whatever the swap did."""
        state, reason = (PROMOTED if decision == PROMOTE else ROLLED_BACK), status.reason
        if decision == PROMOTE:
            try:
                if fingerprint(status.source) != self.fingerprints.get(status.canary_id):
                    raise ValueError(f"the draft at {status.source} changed since the canary started: the version "
                                     f"promoted would not be the one measured")
                await self.pool.swap_draft(status.draft, status.source)
            except Exception as exc:  # the pool put every worker back: the draft serves what it served before
                log.exception("canary %s: the promotion failed", status.canary_id)
                state, reason = FAILED, f"{reason}; the promotion failed, the draft unchanged: {exc}"
        await asyncio.sleep(RETIRE_AFTER_SECONDS)
        try:
            await self.pool.retire_version(status.version)
        except Exception as exc:  # still served beside the draft: a later retirement (a restart) clears it
            log.exception("canary %s: retiring %s failed", status.canary_id, status.version)
            reason = f"{reason}; retiring {status.version} failed: {exc}"
        done = self._set(status.canary_id, state=state, reason=reason, finished=time.time())
        log.info("canary %s: %s; draft %s serves the one at %s", done.canary_id, done.state, done.draft,
                 self.pool.specs[done.draft].source)
        self._forget_finished()

    def _set(self, canary_id: str, **changes) -> CanaryStatus:
        self.statuses[canary_id] = replace(self.statuses[canary_id], **changes)
        if self.metrics is not None:
            self.metrics.record(self.statuses[canary_id])
        return self.statuses[canary_id]

    def _forget_finished(self) -> None:
        finished = [i for i, s in self.statuses.items() if s.state in FINISHED]
        for canary_id in finished[:-KEEP_FINISHED]:
            del self.statuses[canary_id]
            self.reports.pop(canary_id, None)
            self.fingerprints.pop(canary_id, None)


def fingerprint(source: str) -> tuple | None:
    """A draft's directory's files as (name, size, modified): what a promotion checks is unchanged.
    None where this process cannot read it (the draft workers' nodes can: a shared volume)."""
    try:
        return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in Path(source).iterdir()
                            if f.is_file()))
    except OSError:
        return None


def version_tag(text: str) -> str:
    """A version's tag from free text (a directory's name): letters, digits, '.', '_' and '-'."""
    tag = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-")
    if not tag:
        raise ValueError(f"no version tag in {text!r}: give --version (letters, digits, '.', '_', '-')")
    return tag
