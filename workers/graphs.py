"""Decode passes replayed from CUDA graphs, captured per bucket of sessions and key length.

Eager PyTorch launches a forward's hundreds of small kernels one by one from Python, and on a GPU
that is most of a decode step. The first H100 run (bench/results/20261126-174539-gpu) timed one
token's forward eager against the replay of a captured graph:

| model | eager | graph |
| --- | --- | --- |
| the demo target | 3.2 ms | 0.39 ms |
| a SmolLM2-135M shape | 17.4 ms | 3.0 ms |

A graph replays fixed kernels on fixed memory, so the pass must have fixed shapes. A *decode pass*
is one where every session adds one token and wants its logits. Such a pass of S sessions over at
most L keys runs at the smallest bucket (S', L') that holds it:
- the extra rows decode a dummy token into a scratch slot;
- the extra keys are masked off;
- both are dropped unread.

What changes between replays (the tokens, the positions, where each session's keys sit) lives in
input buffers, copied into before each replay. This is how vLLM and SGLang capture their decode
steps per batch width.

Passes of other shapes run eagerly: prompts, verify steps, token trees, a head's hidden states, and
sessions outside the pool's first arena. On a CPU the same buffers run eagerly (``capture=False``):
the tests check the bucketing, the padding and the buffers there against the eager pass, and the
GPU suite checks the capture.

**Compiled** (``compiled=True``, where nothing is captured: a CPU): the buckets' forward runs through
``torch.compile``, which fuses a layer's small operations and drops the per-operation dispatch that
dominates a small model's pass. On the 2-core host (one thread, float32, one session) a decode pass
of the demo zoo's drafts took 0.46 ms compiled against 1.01 ms eager; the 8.7M demo target gained
nothing (its pass is its weights' reading, ~6 ms, 83% in its matrix products). Shapes are compiled
at start-up (``warm_up``): one graph per session count of 1 and one for more, each with the key
length symbolic, so a new bucket later compiles nothing. Models of one architecture share them (the
weights are the graph's inputs): a draft worker's drafts compile once. Inductor caches what it
compiled on disk, so a process started again on the same machine takes seconds, not a minute.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .kv_pool import KVPool, PoolFull, Region
from .ragged_pass import NO_MASK, GatheredGroup, PassLayout, Segment, padded_key_index, require_pooled_attention

log = logging.getLogger("specserve.graphs")

SESSION_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
KEY_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)
# The buckets compiled at start-up, in this order: torch.compile specialises a pass's first shape, then
# makes each dimension that changes symbolic. After these four a compiled model has a graph for one
# session and one for several, both over any key length (a session count of 1 stays a graph of its own:
# dynamo specialises sizes of 1).
WARM_UP_BUCKETS = ((1, 64), (2, 64), (2, 128), (1, 128))
# Graphs compiled per code object before dynamo gives up and runs it eagerly: every model of a
# process shares the model class's forward, and each architecture takes the four above.
RECOMPILE_LIMIT = 64


def bucket(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size that holds ``n``, or None when none does."""
    return next((size for size in sizes if size >= n), None)


@dataclass
class _Bucket:
    """One captured shape: its input buffers, its layout over them, and (on CUDA) its graph."""

    ids: torch.Tensor  # [1, S]
    positions: torch.Tensor  # [1, S]
    keep: torch.Tensor  # [S]: every row's logits
    layout: PassLayout
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # [S, V]: the graph's output, rewritten by each replay

    @property
    def group(self) -> GatheredGroup:
        return self.layout.gathered[0]

    def fill(self, segments: Sequence[Segment], scratch: Region) -> None:
        """Copy the pass's inputs into the buffers; rows past the pass's sessions decode token 0
        at the scratch slot, attending to it alone. A branch's row (``Segment.fork``) sits at its
        chain's position and sees the slots before the fork and the branch's own, not the
        lookahead's between them."""
        padding = self.ids.shape[1] - len(segments)
        ids = torch.tensor([s.tokens[0] for s in segments] + [0] * padding)
        slots = torch.tensor([s.start for s in segments] + [0] * padding)  # in its region
        positions = torch.tensor([s.positions()[0] for s in segments] + [0] * padding)
        bases = torch.tensor([s.region.start for s in segments] + [scratch.start] * padding)
        index, real = padded_key_index(bases, slots + 1, self.group.keys.shape[1])
        forks = [(row, s.fork) for row, s in enumerate(segments) if s.fork is not None]
        if forks:
            columns = torch.arange(real.shape[1])
            for row, (seen, base) in forks:
                real[row] &= (columns < seen) | (columns >= base)
        for buffer, values in ((self.ids[0], ids), (self.positions[0], positions), (self.group.slots, bases + slots),
                               (self.group.keys, index), (self.group.mask[:, 0, 0], real)):
            buffer.copy_(values)

    def forward(self, model) -> torch.Tensor:  # the model, or its compiled forward
        return model(input_ids=self.ids, position_ids=self.positions, attention_mask=NO_MASK, use_cache=False,
                     logits_to_keep=self.keep, ragged_layout=self.layout).logits[0]


class DecodeGraphs:
    """The decode passes of one model's pool, each run at a bucketed shape: replayed from a CUDA
    graph captured on first use, or (``capture=False``, a CPU) the same buffers run eagerly, or
    (``compiled``, where nothing is captured) through the model compiled."""

    def __init__(self, model: PreTrainedModel, pool: KVPool, capture: bool | None = None,
                 compiled: bool = False) -> None:
        require_pooled_attention(model)
        self.model = model
        self.pool = pool
        self.capture = model.device.type == "cuda" if capture is None else capture
        # A capture records the eager forward's kernels: compiling them too is for a GPU to measure.
        self.forward = compile_model(model) if compiled and not self.capture else model
        self.buckets: dict[tuple[int, int], _Bucket] = {}
        self.scratch: Region | None = None  # one slot of the first arena that padded rows write to
        self.disabled: str | None = None  # why passes run eagerly from now on
        self._memory = None  # the graphs' shared memory pool

    @property
    def compiled(self) -> bool:
        """Its passes run the compiled forward (not when none was asked for, or the compiler failed)."""
        return self.forward is not self.model

    def shape(self, segments: Sequence[Segment]) -> tuple[int, int] | None:
        """The bucket a pass runs at, or None when it must run eagerly."""
        if self.disabled is not None or not segments:
            return None
        if not all(len(s.tokens) == 1 and s.logits == 1 and s.parents is None and not s.aux_layers
                   and s.region.arena == 0 for s in segments):
            return None
        sessions = bucket(len(segments), SESSION_BUCKETS)
        keys = bucket(max(s.start + 1 for s in segments), KEY_BUCKETS)
        return None if sessions is None or keys is None else (sessions, keys)

    @torch.inference_mode()
    def run(self, segments: Sequence[Segment]) -> list[torch.Tensor] | None:
        """Each segment's logits ([1, V] float32, on the host) as ``run_pass`` gives them, or None
        when the pass must run eagerly (its shape, or a capture that failed)."""
        shape = self.shape(segments)
        if shape is None or not self._has_scratch():
            return None
        held = self.buckets.get(shape) or self._bucket(*shape)
        held.fill(segments, self.scratch)
        if self.capture and held.graph is None and not self._captured(held, shape):
            return None
        if held.graph is not None:
            held.graph.replay()
            logits = held.logits
        else:
            logits = self._forward(held)
        return list(logits[: len(segments)].float().cpu().split(1))

    def _forward(self, held: _Bucket) -> torch.Tensor:
        """The bucket's pass, compiled where it is; a compiler that fails (no C++ compiler on the
        host, an operation it cannot lower) leaves this and every later pass to the eager model,
        which rewrites the same slots with the same keys and values."""
        if not self.compiled:
            return held.forward(self.model)
        try:
            return held.forward(self.forward)
        except Exception as exc:  # noqa: BLE001 - the eager pass is always right
            log.warning("compiling a decode pass failed (%s: %s): decode passes run uncompiled from now on",
                        type(exc).__name__, exc)
            self.forward = self.model
            return held.forward(self.model)

    def warm_up(self) -> float:
        """Run a decode pass at each of WARM_UP_BUCKETS, so that a compiled forward compiles now, not
        under a request. Writes only slots of a region taken for it and given back. Seconds taken."""
        started = time.perf_counter()
        sessions = max(s for s, _ in WARM_UP_BUCKETS)
        try:
            regions = [_take(self.pool, max(k for _, k in WARM_UP_BUCKETS)) for _ in range(sessions)]
        except PoolFull:
            return 0.0  # no room: the first passes compile instead
        try:
            for count, keys in WARM_UP_BUCKETS:
                if all(r.arena == 0 for r in regions[:count]):
                    self.run([Segment(r, keys - 1, [0], 1) for r in regions[:count]])
        finally:
            for region in regions:
                self.pool.give_back(region)
        return time.perf_counter() - started

    def _has_scratch(self) -> bool:
        if self.scratch is None:
            try:
                self.scratch = _take(self.pool, 1)
            except PoolFull as exc:
                self.disabled = f"no room for the scratch slot ({exc})"
                return False
            if self.scratch.arena != 0:
                self.disabled = "the scratch slot is not in the pool's first arena"
                return False
        return True

    def _bucket(self, sessions: int, keys: int) -> _Bucket:
        device = self.model.device
        group = GatheredGroup(0, torch.arange(sessions, device=device), torch.zeros(sessions, dtype=torch.long, device=device),
                          torch.zeros(sessions, keys, dtype=torch.long, device=device),
                          torch.zeros(sessions, 1, 1, keys, dtype=torch.bool, device=device))
        held = _Bucket(torch.zeros(1, sessions, dtype=torch.long, device=device),
                       torch.zeros(1, sessions, dtype=torch.long, device=device),
                       torch.arange(sessions, device=device), PassLayout(self.pool, (), [], [], [group]))
        self.buckets[(sessions, keys)] = held
        return held

    def _captured(self, held: _Bucket, shape: tuple[int, int]) -> bool:
        """Capture ``held``'s graph (its buffers hold the pass: the warm-up passes write the same keys
        and values it will). False, and eager passes from now on, if the capture fails."""
        started = time.perf_counter()
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # kernels chosen and workspaces allocated outside the capture
                    held.forward(self.model)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self._memory):
                held.logits = held.forward(self.model)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the eager pass, which is always right
            self.disabled = f"capturing a decode graph failed ({type(exc).__name__}: {exc})"
            log.warning("%s: decode passes run eagerly from now on", self.disabled)
            return False
        self._memory = graph.pool()
        held.graph = graph
        log.info("captured a decode graph for %d sessions over %d keys in %.0f ms", *shape,
                 (time.perf_counter() - started) * 1000)
        return True


def _take(pool: KVPool, positions: int) -> Region:
    """A region taken outside inference mode: an arena it creates is an ordinary tensor, which the pool
    may later update in place outside it too (a branch's adoption moves keys, ``KVPool.move``)."""
    with torch.inference_mode(False):
        return pool.take(positions)


def compile_model(model: PreTrainedModel):
    """``model``'s forward under torch.compile, shapes specialised until they change (then symbolic)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(model)
