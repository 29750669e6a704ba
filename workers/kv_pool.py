"""One pool of KV cache memory per model in a process, shared by all its sessions.

Each session takes one contiguous *region* of positions when it opens (what its longest possible
sequence needs: ``kv_cache.session_capacity``) and gives it back when its stream ends. Its keys and
values live at the region's positions in every layer, so attention reads them as a view, with no
gather and no per-step copy; rollback after a rejection only moves the session's length.

Memory comes in *arenas*, one tensor per layer for keys and one for values, allocated when the
regions in use no longer fit and never past the budget (``kv_cache_mib``, shared by every pool of
the process). Freed regions merge with their free neighbours. A session whose region cannot be
found is refused (SessionLimit), never run out of memory.

Why regions and not pages: paged blocks (vLLM, transformers' ``PagedAttentionCache``) waste less
memory on sequences shorter than their reservation, but attention over pages needs a paged kernel
or a gather per layer per pass; on CPU, and in plain PyTorch on CUDA, that copy costs more than the
pass saves. Sessions here reserve their bound at open anyway (so admission is exact), which is what
regions need.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

# Positions per arena: big enough that most sessions share one, small enough that a little load
# allocates a little memory. A session that needs more gets an arena of its own size.
ARENA_POSITIONS = 4096


class PoolFull(Exception):
    """No region of the size asked for fits in the pool's budget."""


@dataclass
class Budget:
    """The KV bytes a process may allocate over all its pools (``kv_cache_mib``)."""

    limit_bytes: int
    allocated_bytes: int = 0
    # A draft worker loads a model's new version (and warms its passes) off the server's loop.
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def take(self, nbytes: int) -> bool:
        with self._lock:
            if self.allocated_bytes + nbytes > self.limit_bytes:
                return False
            self.allocated_bytes += nbytes
            return True

    def give(self, nbytes: int) -> None:
        with self._lock:
            self.allocated_bytes -= nbytes

    @property
    def left_bytes(self) -> int:
        return self.limit_bytes - self.allocated_bytes


def device_budget(kv_cache_mib: float, gpu_memory_utilization: float | None, gpus: float,
                  device: torch.device) -> Budget:
    """The KV budget of a process whose models are loaded on ``device``: ``kv_cache_mib`` on a CPU
    (or with no utilization given), else its share of the GPU's memory less what it already holds."""
    if device.type != "cuda" or gpu_memory_utilization is None:
        return Budget(int(kv_cache_mib * 2**20))
    free, total = torch.cuda.mem_get_info(device)
    share = gpu_memory_utilization * total * min(gpus, 1.0)
    held = torch.cuda.memory_reserved(device)  # the weights and whatever loading left cached
    if share <= held:
        raise PoolFull(f"the models take {held / 2**30:.2f} GiB of this process's {share / 2**30:.2f} GiB share of "
                       f"the GPU (gpu_memory_utilization {gpu_memory_utilization} x gpus {gpus}), leaving nothing "
                       f"for the KV cache: raise gpu_memory_utilization or gpus, or serve a smaller model")
    return Budget(int(min(share - held, free)))  # never more than is free: other processes share the card


def arena_positions(budget: Budget, shape: KVShape, pools: int) -> int:
    """Positions per arena for one of ``pools`` pools sharing ``budget``. On CUDA, each pool's whole
    share in one arena (allocated at its first session, as vLLM takes its KV memory up front), so
    every session sits in the first arena, where decode passes can replay CUDA graphs
    (workers/graphs.py). On a CPU, arenas of ARENA_POSITIONS grow with the load."""
    if shape.device.type != "cuda":
        return ARENA_POSITIONS
    return max(ARENA_POSITIONS, budget.limit_bytes // (max(pools, 1) * shape.bytes_per_position))


@dataclass(frozen=True)
class KVShape:
    """What one position holds in one layer: ``heads`` key and value vectors of ``head_dim``."""

    layers: int
    heads: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_position(self) -> int:
        return 2 * self.layers * self.heads * self.head_dim * self.dtype.itemsize

    @staticmethod
    def of(model: PreTrainedModel) -> KVShape:
        config = model.config.get_text_config()
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return KVShape(config.num_hidden_layers, heads, head_dim, model.dtype, model.device)


@dataclass
class Arena:
    """``keys[layer]`` and ``values[layer]``: [heads, positions, head_dim]."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    free: list[tuple[int, int]] = field(default_factory=list)  # (start, length), sorted by start

    @property
    def positions(self) -> int:
        return self.keys[0].shape[1]


@dataclass(frozen=True)
class Region:
    """A session's positions in the pool: ``arena``'s [start, start + capacity)."""

    arena: int
    start: int
    capacity: int


class KVPool:
    """The KV memory of one model's sessions in this process."""

    def __init__(self, shape: KVShape, budget: Budget, arena_positions: int = ARENA_POSITIONS) -> None:
        self.shape = shape
        self.budget = budget
        self.arena_positions = arena_positions
        self.arenas: list[Arena] = []
        self.in_use = 0  # positions held by regions taken and not given back
        # Frees a region kept only as a cache (the prefix cache's least recently used), True if it
        # did: ``take`` calls it before it grows the pool, so a cache never takes a session's room.
        self.reclaim: Callable[[], bool] | None = None

    @property
    def allocated_bytes(self) -> int:
        return sum(arena.positions for arena in self.arenas) * self.shape.bytes_per_position

    def take(self, capacity: int) -> Region:
        """A region of ``capacity`` positions: first fit in an arena (after reclaiming cached regions
        while it does not fit), else a new arena if the budget allows."""
        while True:
            for index, arena in enumerate(self.arenas):
                region = _first_fit(arena, index, capacity)
                if region is not None:
                    self.in_use += capacity
                    return region
            if self.reclaim is None or not self.reclaim():
                break
        arena = self._new_arena(max(capacity, self.arena_positions), capacity)
        self.arenas.append(arena)
        region = _first_fit(arena, len(self.arenas) - 1, capacity)
        self.in_use += capacity
        return region

    def give_back(self, region: Region) -> None:
        arena = self.arenas[region.arena]
        arena.free.append((region.start, region.capacity))
        arena.free[:] = _merged(sorted(arena.free))
        self.in_use -= region.capacity

    def close(self) -> None:
        """Give all its memory back to the budget (its model no longer served, no session left on it):
        another pool of the process, a new version's, may take it."""
        self.budget.give(self.allocated_bytes)
        self.arenas, self.in_use = [], 0

    def keys(self, region: Region, layer: int) -> torch.Tensor:
        """[heads, capacity, head_dim]: a view of the region's keys in ``layer``."""
        return self.arenas[region.arena].keys[layer][:, region.start : region.start + region.capacity]

    def values(self, region: Region, layer: int) -> torch.Tensor:
        return self.arenas[region.arena].values[layer][:, region.start : region.start + region.capacity]

    def move(self, region: Region, moves: list[tuple[int, int]]) -> None:
        """Copy the keys and values at each (source, destination) slot pair of ``region``, in every
        layer. Sources must not be an earlier pair's destination (a tree's path moves towards the
        front, so they never are)."""
        source = torch.tensor([s for s, _ in moves], device=self.shape.device)
        destination = torch.tensor([d for _, d in moves], device=self.shape.device)
        for layer in range(self.shape.layers):
            for tensor in (self.keys(region, layer), self.values(region, layer)):
                tensor.index_copy_(1, destination, tensor.index_select(1, source))

    def _new_arena(self, positions: int, needed: int) -> Arena:
        left = self.budget.left_bytes // self.shape.bytes_per_position
        positions = min(positions, left)  # the last arena takes what the budget has left
        if positions < needed or not self.budget.take(positions * self.shape.bytes_per_position):
            raise PoolFull(f"the session needs {needed} positions of KV cache "
                           f"({needed * self.shape.bytes_per_position / 2**20:.1f} MiB) and the pool has no room "
                           f"left in its {self.budget.limit_bytes / 2**20:.0f} MiB (kv_cache_mib; on a GPU, "
                           f"gpu_memory_utilization)")
        s = self.shape
        dims = (s.heads, positions, s.head_dim)
        return Arena([torch.zeros(dims, dtype=s.dtype, device=s.device) for _ in range(s.layers)],
                     [torch.zeros(dims, dtype=s.dtype, device=s.device) for _ in range(s.layers)],
                     [(0, positions)])


def _first_fit(arena: Arena, index: int, capacity: int) -> Region | None:
    for i, (start, length) in enumerate(arena.free):
        if length >= capacity:
            if length == capacity:
                del arena.free[i]
            else:
                arena.free[i] = (start + capacity, length - capacity)
            return Region(index, start, capacity)
    return None


def _merged(free: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent free ranges as one."""
    merged: list[tuple[int, int]] = []
    for start, length in free:
        if merged and merged[-1][0] + merged[-1][1] == start:
            merged[-1] = (merged[-1][0], merged[-1][1] + length)
        else:
            merged.append((start, length))
    return merged
