"""Cache-aware picking: open a session on the worker likeliest to hold the longest prefix of its
prompt in its prefix cache (workers/prefix_cache.py), unless that worker is much busier.

The router does not ask the workers what they hold: it remembers, per worker, the prompt blocks it
opened sessions with there lately (chain hashes of whole 32-token blocks, as the workers key their
caches), an approximation as SGLang's cache-aware router keeps one. A worker may have evicted some,
and another router process may have filled it: a wrong guess costs a prefill, never a wrong token.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

from specserve.workers.prefix_cache import block_hashes, shareable_blocks
from specserve.workers.registry import Endpoint

# Prompt blocks remembered per worker (~4 MiB of keys over a few workers): about what a worker's
# cache holds of regions kept for their prefixes, more than that is guessing.
BLOCKS_PER_WORKER = 65536
PREFIX = "prefix"  # the pick's reason: it holds the longest prefix of the prompt among the near-least loaded
LOAD = "load"  # ...the least loaded (no near-least-loaded one holds any of it)


def prompt_blocks(prompt_ids: Sequence[int]) -> list[int]:
    """The chain hashes of the prompt's shareable blocks, as a worker's prefix cache keys them."""
    return block_hashes(prompt_ids, shareable_blocks(len(prompt_ids)))


class PrefixMemory:
    """Which prompt blocks this router sent to each worker lately, least recently sent first out."""

    def __init__(self, capacity: int = BLOCKS_PER_WORKER) -> None:
        self.capacity = capacity
        self.sent: dict[str, OrderedDict[int, None]] = {}

    def remember(self, worker_id: str, blocks: Sequence[int]) -> None:
        sent = self.sent.setdefault(worker_id, OrderedDict())
        for block in blocks:
            sent[block] = None
            sent.move_to_end(block)
        while len(sent) > self.capacity:
            sent.popitem(last=False)

    def matched(self, worker_id: str, blocks: Sequence[int]) -> int:
        """How many of the prompt's leading blocks were sent to ``worker_id`` (a chain hash stands
        for its whole prefix: the deepest one sent is the match)."""
        sent = self.sent.get(worker_id)
        if not sent:
            return 0
        return next((depth for depth in range(len(blocks), 0, -1) if blocks[depth - 1] in sent), 0)

    def forget(self, worker_id: str) -> None:
        """A worker gone (or back as a new process): what it held went with it."""
        self.sent.pop(worker_id, None)


def choose(candidates: Sequence[Endpoint], load: Counter[str], matched: dict[str, int],
           slack: int) -> tuple[Endpoint, str]:
    """Among the workers within ``slack`` sessions of the least loaded, the one with the longest
    match (the least loaded of those); else the least loaded of all."""
    least = min(load[e.worker_id] for e in candidates)
    near = [e for e in candidates if load[e.worker_id] <= least + slack]
    best = max(near, key=lambda e: (matched.get(e.worker_id, 0), -load[e.worker_id]))
    if matched.get(best.worker_id, 0) > 0:
        return best, PREFIX
    return min(candidates, key=lambda e: (load[e.worker_id], e.worker_id)), LOAD
