"""What a batch scheduler runs: a session's step, planned into passes one segment at a time.

A step (verify a proposal; draft k tokens) may take several passes: a prompt longer than a pass
has room for is run in chunks first, and a draft needs one pass per token it proposes. Between
passes the scheduler asks each live step for its next segment (``plan``) and hands it the logits of
the segment it ran (``advance``), until the step says it is done and holds its ``result``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

import torch
from transformers import PreTrainedModel

from .kv_pool import Budget, KVPool, KVShape
from .ragged_pass import PooledSequence, Segment, run_pass
from .sim_device import held


class Step(Protocol):
    result: object

    def plan(self, room: int) -> Segment | None:
        """The segment for the next pass, in at most ``room`` tokens (None: none fits)."""

    def advance(self, logits: torch.Tensor) -> bool:
        """The pass ran the planned segment; True when the step is done."""


def private_sequence(model: PreTrainedModel, prompt_ids: Sequence[int], capacity: int) -> tuple[KVPool, PooledSequence]:
    """A sequence in a pool of its own, for a session run alone (the in-process engine)."""
    shape = KVShape.of(model)
    pool = KVPool(shape, Budget(capacity * shape.bytes_per_position), arena_positions=capacity)
    return pool, PooledSequence(pool.take(capacity), prompt_ids, pool)


def run_alone(model: PreTrainedModel, pool: KVPool, step: Step) -> object:
    """Every pass of ``step`` on its own: a batch of one, with no limit on a pass's tokens."""
    while True:
        segment, started = step.plan(2**31), time.perf_counter()
        logits = run_pass(model, pool, [segment])[0]
        held(model, started, [segment])  # on a simulated device, the pass's modelled time
        done = step.advance(logits)
        if (after := getattr(step, "after_pass", None)) is not None:
            after()
        if done:
            return step.result
