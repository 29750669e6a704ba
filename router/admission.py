"""Admission: how many requests the router runs at once, and how many may wait for a turn.

Beyond the queue a request is refused at once (RESOURCE_EXHAUSTED) rather than left to wait
without bound: the client backs off or tries another router, and the router's memory stays bounded.
A queued request waits in arrival order, and leaves the queue if its client goes away or its
deadline passes. Used on one event loop only, so the counts need no lock.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Overloaded(Exception):
    """The router runs its limit of requests and its queue is full."""


class Admission:
    def __init__(self, limit: int, queue: int, on_change: Callable[[Admission], None] = lambda _: None) -> None:
        self.limit = limit
        self.queue = queue
        self.running = 0
        self.waiting = 0
        self.refused = 0
        self._turns = asyncio.Semaphore(limit)  # wakes waiters in arrival order
        self._on_change = on_change  # metrics

    async def enter(self) -> None:
        """Wait for a turn; Overloaded when the limit runs and the queue is full."""
        if self.running + self.waiting >= self.limit + self.queue:
            self.refused += 1
            raise Overloaded(f"the router is serving its limit of {self.limit} concurrent requests with "
                             f"{self.waiting} more queued (the queue holds {self.queue}); retry with backoff")
        self.waiting += 1
        self._on_change(self)
        try:
            await self._turns.acquire()
        finally:
            self.waiting -= 1
            self._on_change(self)
        self.running += 1
        self._on_change(self)

    def leave(self) -> None:
        self.running -= 1
        self._turns.release()
        self._on_change(self)
