"""The workers' batches as the router sees them: each step's reply says which forward pass it ran in
(tokens and sessions in that pass) and how long it queued for it. Pure: no I/O, no clock.

A session logs its steps' passes (PassLog, one per kind of worker); the service keeps the latest
steps of all sessions (PassWindow) for `specserve stats`; metrics observe each step once.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import MutableSequence
from dataclasses import dataclass, field
from typing import Protocol

WINDOW_STEPS = 4096  # steps kept per kind for stats: seconds to minutes of traffic


class PassInfo(Protocol):  # internal.proto's PassInfo
    tokens: int
    sessions: int
    queue_seconds: float


@dataclass
class PassLog:
    """One entry per step of one request on one kind of worker."""

    tokens: MutableSequence[int] = field(default_factory=list)  # in the pass, over all its sessions
    sessions: MutableSequence[int] = field(default_factory=list)  # in the pass
    queue_seconds: MutableSequence[float] = field(default_factory=list)  # before the step's first pass began

    def add(self, info: PassInfo) -> None:
        if info.sessions:  # a worker that reports no pass (it does not batch) leaves no entry
            self.tokens.append(info.tokens)
            self.sessions.append(info.sessions)
            self.queue_seconds.append(info.queue_seconds)


@dataclass(frozen=True)
class PassSummary:
    steps: int
    mean_sessions: float
    p50_sessions: float
    mean_tokens: float
    p50_tokens: float
    mean_queue_seconds: float
    p50_queue_seconds: float


class PassWindow:
    """The latest `size` steps' passes, over all requests, on one kind of worker."""

    def __init__(self, size: int = WINDOW_STEPS) -> None:
        self.log = PassLog(deque(maxlen=size), deque(maxlen=size), deque(maxlen=size))

    def add(self, log: PassLog) -> None:
        self.log.tokens.extend(log.tokens)
        self.log.sessions.extend(log.sessions)
        self.log.queue_seconds.extend(log.queue_seconds)

    def summary(self) -> PassSummary:
        log = self.log
        return PassSummary(len(log.sessions), *_mean_p50(log.sessions), *_mean_p50(log.tokens),
                           *_mean_p50(log.queue_seconds))


def _mean_p50(values) -> tuple[float, float]:
    return (statistics.fmean(values), statistics.median(values)) if values else (0.0, 0.0)
