"""Prefix caching: a session starts with the keys and values of the longest prompt prefix another
session of the same model already computed, copied into its own region, and prefills the rest.

What is reused is exact, not approximate. A prompt is prefilled in attention blocks of
ATTENTION_BLOCK slots, each attending over the slots up to its end (workers/ragged_pass.py), with
row-invariant linear layers: the keys and values of a prompt's first ``b`` whole blocks are a
function of those ``b * ATTENTION_BLOCK`` tokens alone, whichever session computed them and
whatever shared its passes. So a block is shared only as a prompt block: never one holding a token
the session generated or verified (a decode row attends in a call of another shape, which rounds
differently), nor the prompt's last position (a draft's rewind may write it again as a decode row).
A block of a source whose tokens differ (a hash collision) is never copied: the tokens are compared.

Where the blocks live: in the regions of the sessions that computed them (workers/kv_pool.py). A
live session's prompt blocks are read in place once written; a finished session's region is kept
(*retained*) rather than given back while its blocks may serve, and retained regions are given back
least recently used first whenever a new session's region would not fit otherwise. The cache
therefore only ever holds memory no live session needs: it never refuses a session nor grows the
pool. Why copies and not shared pages: sessions own contiguous regions so that attention reads them
as views (kv_pool.py); a copy of the prefix costs a memory copy per layer, far less than the pass
that would compute it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .config import ATTENTION_BLOCK
from .kv_pool import KVPool, Region
from .ragged_pass import PooledSequence


def block_hashes(ids: Sequence[int], blocks: int) -> list[int]:
    """The chain hash of each of the first ``blocks`` whole blocks: hash i stands for ids[: (i + 1) * BLOCK]."""
    hashes, chain = [], 0
    for i in range(blocks):
        chain = hash((chain, tuple(ids[i * ATTENTION_BLOCK : (i + 1) * ATTENTION_BLOCK])))
        hashes.append(chain)
    return hashes


def shareable_blocks(prompt_length: int) -> int:
    """Whole blocks of a prompt that another session may reuse: all before its last position."""
    return max(prompt_length - 1, 0) // ATTENTION_BLOCK


@dataclass(eq=False)  # each holder is its own: found and removed by identity
class Holder:
    """A region whose prompt blocks may serve other sessions: a live session's, or a retained one's."""

    sequence: PooledSequence
    prompt: list[int]
    hashes: list[int]
    retained: bool = False

    def ready_blocks(self) -> int:
        """Its blocks written so far (all of them, once retained)."""
        return min(len(self.hashes), self.sequence.length // ATTENTION_BLOCK)


@dataclass
class PrefixStats:
    """Counters over the cache's life (WorkerState; the host-path and load benches read them)."""

    sessions: int = 0  # sessions opened with a prompt
    hits: int = 0  # of them, those that reused at least one block
    prompt_tokens: int = 0  # their prompts' tokens
    reused_tokens: int = 0  # of those, the ones copied rather than computed
    evictions: int = 0  # retained regions given back for room
    retained: int = 0  # regions retained now
    retained_positions: int = 0  # the positions they hold


class PrefixCache:
    """The prefix cache of one model's pool. Touched on the server's event loop only (sessions open
    and end there), so it needs no lock; the device thread only ever writes a holder's blocks before
    its length says they are there."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.holders: dict[int, Holder] = {}  # id(region) -> its holder
        self.index: dict[int, list[Holder]] = {}  # chain hash -> the holders of that prefix, latest last
        self.lru: OrderedDict[int, Holder] = OrderedDict()  # retained holders, least recently used first
        self.stats = PrefixStats()
        pool.reclaim = self.evict_one

    def open(self, sequence: PooledSequence, reuse: bool = True) -> int:
        """A new session's sequence (its region just taken, nothing written): copy the longest
        cached prefix of its prompt into its region (``reuse``), and offer its own prompt blocks to
        later sessions. The tokens it starts with already cached."""
        prompt = list(sequence.committed)
        hashes = block_hashes(prompt, shareable_blocks(len(prompt)))
        self.stats.sessions += 1
        self.stats.prompt_tokens += len(prompt)
        reused = self._reuse(sequence, prompt, hashes) if reuse else 0
        if hashes:
            holder = Holder(sequence, prompt, hashes)
            self.holders[id(sequence.region)] = holder
            for chain in hashes:
                self.index.setdefault(chain, []).append(holder)
        return reused

    def release(self, region: Region) -> bool:
        """A session ended: keep its region while its prompt blocks may serve (True: retained, not
        to be given back now)."""
        holder = self.holders.get(id(region))
        if holder is None or holder.sequence.region is not region:
            return False
        if holder.ready_blocks() == 0:
            self._forget(holder)
            return False
        holder.retained = True
        self.lru[id(region)] = holder
        self._count()
        return True

    def evict_one(self) -> bool:
        """Give back the least recently used retained region; False when none is left."""
        if not self.lru:
            return False
        _, holder = self.lru.popitem(last=False)
        self._forget(holder)
        self.stats.evictions += 1
        self._count()
        self.pool.give_back(holder.sequence.region)
        return True

    def clear(self) -> None:
        while self.evict_one():
            pass

    def _reuse(self, sequence: PooledSequence, prompt: list[int], hashes: list[int]) -> int:
        for depth in range(len(hashes), 0, -1):  # the deepest prefix some holder has written
            length = depth * ATTENTION_BLOCK
            holder = next((h for h in reversed(self.index.get(hashes[depth - 1], ()))
                           if h.ready_blocks() >= depth and h.prompt[:length] == prompt[:length]), None)
            if holder is None:  # none written that far yet, or a collision: never copy another prefix's keys
                continue
            self._copy(holder.sequence.region, sequence.region, length)
            sequence.length = sequence.reused = length
            if holder.retained:
                self.lru.move_to_end(id(holder.sequence.region))
            self.stats.hits += 1
            self.stats.reused_tokens += length
            return length
        return 0

    def _copy(self, source: Region, destination: Region, length: int) -> None:
        with torch.inference_mode():
            for layer in range(self.pool.shape.layers):
                self.pool.keys(destination, layer)[:, :length].copy_(self.pool.keys(source, layer)[:, :length])
                self.pool.values(destination, layer)[:, :length].copy_(self.pool.values(source, layer)[:, :length])

    def _count(self) -> None:
        self.stats.retained = len(self.lru)
        self.stats.retained_positions = sum(h.sequence.region.capacity for h in self.lru.values())

    def _forget(self, holder: Holder) -> None:
        self.holders.pop(id(holder.sequence.region), None)
        for chain in holder.hashes:
            holders = self.index.get(chain, [])
            if holder in holders:
                holders.remove(holder)
            if not holders:
                self.index.pop(chain, None)
