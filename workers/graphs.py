"""Passes replayed from CUDA graphs, captured per bucket of sessions, rows a session and key length.

Eager PyTorch launches a forward's hundreds of small kernels one by one from Python, and on a GPU
that is most of a decode step. The first H100 run (bench/results/20261126-174539-gpu) timed one
token's forward eager against the replay of a captured graph:

| model | eager | graph |
| --- | --- | --- |
| the demo target | 3.2 ms | 0.39 ms |
| a SmolLM2-135M shape | 17.4 ms | 3.0 ms |

A graph replays fixed kernels on fixed memory, so the pass must have fixed shapes. A pass of S
sessions, each adding at most q tokens (1 for a *decode pass*; k + 1 for a verify step; a token
tree's nodes), over at most L keys, runs at the smallest bucket (S', q', L') that holds it:
- a session's extra rows repeat its last row's token, position and mask, and write their keys and
  values to a scratch slot, not the session's;
- the extra sessions' rows decode token 0 at the scratch slot, attending to it alone;
- the extra keys are masked off;
- all of them are dropped unread.

What changes between replays (the tokens, the positions, where each session's keys sit, each row's
mask) lives in input buffers, copied into before each replay. vLLM and SGLang capture their decode
steps per batch width the same way, and SGLang its verify steps at k + 1 rows a request. The second
GPU run (an H200, bench/results/20261127-061900-gpu) measured one eager pass of the demo target at
4.9-5.4 ms for 1-16 sessions of 1-16 tokens, against 0.38 ms for one token's graph: a verify step
left eager costs ten decode steps.

Passes of other shapes run eagerly: prompt chunks longer than the largest row bucket, a head's
hidden states, sessions outside the pool's first arena, and passes past MAX_BUCKET_ROWS (wide
enough that launches no longer dominate). Only captures take rows past one a session (``max_rows``):
on a CPU a padded row costs its whole compute, while launches cost nothing. On a CPU the same
buffers run eagerly (``capture=False``): the tests check the bucketing, the padding, the masks and
the buffers there against the eager pass, at every row count, and the GPU suite checks the capture.

**Compiled** (``compiled=True``, where nothing is captured: a CPU): the buckets' forward runs through
``torch.compile``, which fuses a layer's small operations and drops the per-operation dispatch that
dominates a small model's pass. On the 2-core host (one thread, float32, one session) a decode pass
of the demo zoo's drafts took 0.46 ms compiled against 1.01 ms eager; the 8.7M demo target gained
nothing (its pass is its weights' reading, ~6 ms, 83% in its matrix products). Shapes are compiled
at start-up (``warm_up``): one graph for one session, one for 2-3 and one for 4 or more (the CPU's
linear layers branch at MATRIX_ROWS rows), each with the key length symbolic, so a new bucket later
compiles nothing. Models of one architecture share them (the
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
from .loading import MATRIX_ROWS
from .ragged_pass import (NO_MASK, GatheredGroup, PassLayout, Segment, host_rows, padded_key_index,
                          require_pooled_attention, segment_mask)

log = logging.getLogger("specserve.graphs")

SESSION_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# Rows a session: 1 (decode), every k + 1 up to MAX_K = 8 exactly (a verify step pads nothing), then
# token trees and short prompt chunks.
ROW_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16)
KEY_BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)
# Sessions x rows a bucket may hold: each bucket's graph keeps its own logits ([rows, V]: 100 MB for
# SmolLM2 in bf16 at 1,024 rows), and a pass this wide is no longer launch-bound.
MAX_BUCKET_ROWS = 1024
# The buckets compiled at start-up, in this order: torch.compile specialises a pass's first shape, then
# makes each dimension that changes symbolic. After these five a compiled model has a graph for one
# session, one for 2-3 and one for 4 or more, each over any key length: dynamo specialises sizes of 1,
# and on a CPU every linear layer branches at MATRIX_ROWS rows (workers/loading.py: fewer are padded),
# so a pass of 2-3 rows and one of 4+ are two graphs. Without the last bucket the first pass of 3-4
# sessions compiled under load (4-10 s on the 2-core host): its worker missed step deadlines.
WARM_UP_BUCKETS = ((1, 1, 64), (2, 1, 64), (2, 1, 128), (1, 1, 128), (MATRIX_ROWS, 1, 64))  # (sessions, rows, keys)
# Graphs compiled per code object before dynamo gives up and runs it eagerly: every model of a
# process shares the model class's forward, and each architecture takes the five above.
RECOMPILE_LIMIT = 64


def bucket(n: int, sizes: Sequence[int]) -> int | None:
    """The smallest size that holds ``n``, or None when none does."""
    return next((size for size in sizes if size >= n), None)


@dataclass
class _Bucket:
    """One captured shape: its input buffers, its layout over them, and (on CUDA) its graph."""

    ids: torch.Tensor  # [1, S * q]
    positions: torch.Tensor  # [1, S * q]
    keep: torch.Tensor  # [S * q]: every row's logits
    layout: PassLayout
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # [S * q, V]: the graph's output, rewritten by each replay

    @property
    def group(self) -> GatheredGroup:
        return self.layout.gathered[0]

    @property
    def rows(self) -> int:
        """Rows a session (q)."""
        return self.group.mask.shape[2]

    def fill(self, segments: Sequence[Segment], scratch: Region) -> None:
        """Copy the pass's inputs into the buffers (the module's docstring says what padding does).
        Each row sees what ``run_pass``'s mask gives it: a chain's row the slots up to its own, a
        tree's node what precedes the tree and its ancestors, a branch's row (``Segment.fork``) the
        slots before the fork and the branch's own."""
        q, width = self.rows, self.group.keys.shape[1]
        pad = self.ids.shape[1] // q - len(segments)
        counts = torch.tensor([len(s.tokens) for s in segments] + [1] * pad)
        starts = torch.tensor([s.start for s in segments] + [0] * pad)
        bases = torch.tensor([s.region.start for s in segments] + [scratch.start] * pad)
        ids, positions = [], []
        for segment in segments:
            tokens, places, extra = list(segment.tokens), segment.positions(), q - len(segment.tokens)
            ids += tokens + tokens[-1:] * extra
            positions += places + places[-1:] * extra
        ids += [0] * (pad * q)
        positions += [0] * (pad * q)
        # Row j of a session is its row min(j, count - 1): the padded rows repeat the last.
        row = torch.minimum(torch.arange(q)[None, :], counts[:, None] - 1)  # [S, q]
        real_row = torch.arange(q)[None, :] < counts[:, None]
        slots = torch.where(real_row, bases[:, None] + starts[:, None] + row, scratch.start)
        index, _ = padded_key_index(bases, starts + counts, width)
        mask = torch.arange(width)[None, None, :] < (starts[:, None] + row + 1)[:, :, None]  # chains: causal
        for n, segment in enumerate(segments):
            if segment.parents is not None or segment.fork is not None:
                own = segment_mask(segment)  # [count, start + count]
                mask[n] = False
                mask[n, :, : own.shape[1]] = own[row[n]]
        for buffer, values in ((self.ids[0], torch.tensor(ids)), (self.positions[0], torch.tensor(positions)),
                               (self.group.slots, slots.flatten()), (self.group.keys, index),
                               (self.group.mask[:, 0], mask)):
            buffer.copy_(values)

    def wanted(self, logits: torch.Tensor, segments: Sequence[Segment]) -> list[torch.Tensor]:
        """Each segment's wanted rows of the bucket's [S * q, V] logits, on the host as ``run_pass`` gives them."""
        q = self.rows
        if all(s.logits == len(s.tokens) == q for s in segments):  # every row wanted (decode, uniform verify):
            return host_rows(logits[: len(segments) * q], segments)  # a slice, no index copied over
        rows = [n * q + len(s.tokens) - s.logits + i for n, s in enumerate(segments) for i in range(s.logits)]
        return host_rows(logits[torch.tensor(rows, dtype=torch.long, device=logits.device)], segments)

    def forward(self, model) -> torch.Tensor:  # the model, or its compiled forward
        return model(input_ids=self.ids, position_ids=self.positions, attention_mask=NO_MASK, use_cache=False,
                     logits_to_keep=self.keep, ragged_layout=self.layout).logits[0]


class PassGraphs:
    """The passes of one model's pool, each run at a bucketed shape: replayed from a CUDA graph
    captured on first use, or (``capture=False``, a CPU) the same buffers run eagerly, or
    (``compiled``, where nothing is captured) through the model compiled. ``max_rows``: the most
    rows a session may add to a bucketed pass (None: ROW_BUCKETS' largest where passes are
    captured, else 1, decode passes alone)."""

    def __init__(self, model: PreTrainedModel, pool: KVPool, capture: bool | None = None,
                 compiled: bool = False, max_rows: int | None = None) -> None:
        require_pooled_attention(model)
        self.model = model
        self.pool = pool
        self.capture = model.device.type == "cuda" if capture is None else capture
        self.max_rows = (ROW_BUCKETS[-1] if self.capture else 1) if max_rows is None else max_rows
        # A capture records the eager forward's kernels: compiling them too is for a GPU to measure.
        self.forward = compile_model(model) if compiled and not self.capture else model
        self.buckets: dict[tuple[int, int, int], _Bucket] = {}  # (sessions, rows, keys)
        self.scratch: Region | None = None  # one slot of the first arena that padded rows write to
        self.disabled: str | None = None  # why passes run eagerly from now on
        self._memory = None  # the graphs' shared memory pool

    @property
    def compiled(self) -> bool:
        """Its passes run the compiled forward (not when none was asked for, or the compiler failed)."""
        return self.forward is not self.model

    def shape(self, segments: Sequence[Segment]) -> tuple[int, int, int] | None:
        """The bucket (sessions, rows, keys) a pass runs at, or None when it must run eagerly."""
        if self.disabled is not None or not segments:
            return None
        if not all(len(s.tokens) <= self.max_rows and not s.aux_layers and s.region.arena == 0 for s in segments):
            return None
        sessions = bucket(len(segments), SESSION_BUCKETS)
        rows = bucket(max(len(s.tokens) for s in segments), ROW_BUCKETS)
        keys = bucket(max(s.start + len(s.tokens) for s in segments), KEY_BUCKETS)
        if sessions is None or rows is None or keys is None or sessions * rows > MAX_BUCKET_ROWS:
            return None
        return sessions, rows, keys

    @torch.inference_mode()
    def run(self, segments: Sequence[Segment]) -> list[torch.Tensor] | None:
        """Each segment's wanted rows, on the host as ``run_pass`` gives them (``host_rows``), or None
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
        return held.wanted(logits, segments)

    def _forward(self, held: _Bucket) -> torch.Tensor:
        """The bucket's pass, compiled where it is; a compiler that fails (no C++ compiler on the
        host, an operation it cannot lower) leaves this and every later pass to the eager model,
        which rewrites the same slots with the same keys and values."""
        if not self.compiled:
            return held.forward(self.model)
        try:
            return held.forward(self.forward)
        except Exception as exc:  # noqa: BLE001 - the eager pass is always right
            log.warning("compiling a pass failed (%s: %s): passes run uncompiled from now on",
                        type(exc).__name__, exc)
            self.forward = self.model
            return held.forward(self.model)

    def warm_up(self) -> float:
        """Run a pass at each of WARM_UP_BUCKETS, so that a compiled forward compiles now, not
        under a request. Writes only slots of a region taken for it and given back. Seconds taken."""
        started = time.perf_counter()
        sessions = max(s for s, _, _ in WARM_UP_BUCKETS)
        try:
            regions = [_take(self.pool, max(k for _, _, k in WARM_UP_BUCKETS)) for _ in range(sessions)]
        except PoolFull:
            return 0.0  # no room: the first passes compile instead
        try:
            for count, rows, keys in WARM_UP_BUCKETS:
                if all(r.arena == 0 for r in regions[:count]):
                    self.run([Segment(r, keys - rows, [0] * rows, rows) for r in regions[:count]])
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

    def _bucket(self, sessions: int, rows: int, keys: int) -> _Bucket:
        device, total = self.model.device, sessions * rows
        group = GatheredGroup(0, torch.arange(total, device=device), torch.zeros(total, dtype=torch.long, device=device),
                              torch.zeros(sessions, keys, dtype=torch.long, device=device),
                              torch.zeros(sessions, 1, rows, keys, dtype=torch.bool, device=device))
        held = _Bucket(torch.zeros(1, total, dtype=torch.long, device=device),
                       torch.zeros(1, total, dtype=torch.long, device=device),
                       torch.arange(total, device=device), PassLayout(self.pool, (), [], [], [], gathered=[group]))
        self.buckets[(sessions, rows, keys)] = held
        return held

    def _captured(self, held: _Bucket, shape: tuple[int, int, int]) -> bool:
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
            self.disabled = f"capturing a pass's graph failed ({type(exc).__name__}: {exc})"
            log.warning("%s: passes run eagerly from now on", self.disabled)
            return False
        self._memory = graph.pool()
        held.graph = graph
        log.info("captured a graph for %d sessions of %d rows over %d keys in %.0f ms", *shape,
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
