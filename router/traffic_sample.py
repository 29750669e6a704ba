"""A sample of served requests, kept for re-distilling drafts from the traffic they serve.

Drafts go stale as traffic moves (the seeds' production lessons: acceptance falls from 0.75 to 0.45
until the draft is re-distilled from what is served now). With ``router.traffic_sample.dir`` set
(opt-in: it stores request text), each router keeps a share of its finished requests, per task: the
prompt and the output the target committed. The sample is bounded (the latest ``max_per_task`` per
task) and ages out: every ``flush_seconds`` a thread of its own drops the entries older than
``retention_hours`` and rewrites ``DIR/<task>/<router>.jsonl`` (one file per router process,
whole, atomically) where anything changed, and deletes the files of routers gone longer than the
retention (a restarted router has another id); it writes once more when the router stops.
`specserve distill --sample DIR --task TASK` reads every router's file as its corpus, oldest
first. Nothing of a request's text is ever logged; the log says how many were kept.
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from specserve.workers.config import FrozenConfig

log = logging.getLogger("specserve.router")
SUFFIX = ".jsonl"


class TrafficSampleConfig(FrozenConfig):
    # Where the sample is written; empty: no sample (the default: it stores request text).
    dir: str = ""
    # The share of finished requests kept (drawn at random, per request).
    share: float = Field(0.1, gt=0.0, le=1.0)
    # Requests kept per task (the latest), per router process.
    max_per_task: int = Field(1000, ge=1, le=1_000_000)
    # Requests older than this are dropped from the sample.
    retention_hours: float = Field(24.0, gt=0.0)
    # How often the files are brought up to date (kept requests added, expired ones dropped), and
    # once more when the router stops.
    flush_seconds: float = Field(30.0, gt=0.0)


@dataclass(frozen=True)
class Sampled:
    time: float  # when it finished (seconds since the epoch)
    prompt: str
    output: str

    def as_json(self) -> str:
        return json.dumps({"time": self.time, "prompt": self.prompt, "output": self.output})


class TrafficSample:
    """One router's sample. ``offer`` on the request path (a draw and an append); the files are
    written from a thread of their own (``start``), or by ``flush``."""

    def __init__(self, config: TrafficSampleConfig, router_id: str, rng: random.Random | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.root = Path(config.dir)
        self.router_id = router_id
        self.rng = rng or random.Random()
        self.clock = clock
        self.kept: dict[str, deque[Sampled]] = {}
        self._lock = threading.Lock()  # the kept requests
        self._writing = threading.Lock()  # one flush at a time: a later one finds the files written
        self._dirty: set[str] = set()
        self._stopped = threading.Event()
        log.info("traffic sample: keeping %.0f%% of finished requests, the latest %d per task for %.0f h, in %s "
                 "(for `specserve distill --sample`)", 100 * config.share, config.max_per_task,
                 config.retention_hours, self.root)

    def offer(self, task: str, prompt: str, output: str) -> bool:
        """A finished request: kept with probability ``share``. Returns whether it was."""
        if not output or self.rng.random() >= self.config.share:
            return False
        with self._lock:
            kept = self.kept.setdefault(task, deque(maxlen=self.config.max_per_task))
            kept.append(Sampled(self.clock(), prompt, output))
            self._dirty.add(task)
        return True

    def start(self) -> TrafficSample:
        """Flush every ``flush_seconds`` from a daemon thread until ``stop``."""
        def every() -> None:
            while not self._stopped.wait(self.config.flush_seconds):
                self.flush()
        threading.Thread(target=every, name="specserve-sample", daemon=True).start()
        return self

    def stop(self) -> None:
        """The router stops: write what is kept once more, and flush no more."""
        self._stopped.set()
        self.flush()

    def counts(self) -> dict[str, int]:
        """Requests kept now, per task (within retention)."""
        cutoff = self.clock() - self.config.retention_hours * 3600
        with self._lock:
            return {task: sum(entry.time >= cutoff for entry in kept) for task, kept in self.kept.items()}

    def flush(self) -> None:
        """Rewrite the files of the tasks that changed (each whole, atomically), without the expired."""
        with self._writing:
            self._flush()

    def _flush(self) -> None:
        cutoff = self.clock() - self.config.retention_hours * 3600
        with self._lock:
            tasks, self._dirty = self._dirty, set()
            for task, kept in self.kept.items():
                while kept and kept[0].time < cutoff:
                    kept.popleft()
                    tasks.add(task)
            snapshot = {task: list(self.kept[task]) for task in tasks}
        for task, entries in snapshot.items():
            path = self.root / task / f"{self.router_id}{SUFFIX}"
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".partial")
            partial.write_text("".join(entry.as_json() + "\n" for entry in entries))
            os.replace(partial, path)
        self._forget_gone_routers(cutoff)
        if snapshot:
            log.info("traffic sample: %s", ", ".join(f"{task} {len(e)} kept" for task, e in sorted(snapshot.items())))

    def _forget_gone_routers(self, cutoff: float) -> None:
        """Delete other routers' files not written since ``cutoff``: every entry in them is older
        than the retention (a router that stopped, or restarted under another id)."""
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                if path.stem != self.router_id and path.stat().st_mtime < cutoff:
                    path.unlink()
            except FileNotFoundError:  # another router deleted it first
                pass


def read_sample(root: Path, task: str, retention_hours: float | None = None,
                clock: Callable[[], float] = time.time) -> list[str]:
    """The documents a sample holds for ``task`` (each a kept request's prompt and output, as one
    text), from every router's file, oldest first; with ``retention_hours``, only those kept within it."""
    folder = Path(root) / task
    if not folder.is_dir():
        known = sorted(p.name for p in Path(root).iterdir() if p.is_dir()) if Path(root).is_dir() else []
        raise ValueError(f"the traffic sample at {root} has nothing for task {task!r}"
                         + (f"; it has: {', '.join(known)}" if known else
                            " (set router.traffic_sample.dir on the service and let it serve traffic first)"))
    cutoff = clock() - retention_hours * 3600 if retention_hours else float("-inf")
    entries = []
    for path in sorted(folder.glob(f"*{SUFFIX}")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                entry = json.loads(line)
                when, prompt, output = float(entry["time"]), str(entry["prompt"]), str(entry["output"])
            except (ValueError, KeyError, TypeError):
                raise ValueError(f"{path}:{number} is not a traffic sample entry (a JSON object with time, "
                                 f"prompt and output)") from None
            if when >= cutoff:
                entries.append((when, prompt + output))
    entries.sort(key=lambda entry: entry[0])  # the routers' files interleaved: the latest last, held out
    return [text for _, text in entries]
