"""A target replica's pass time by width, timed once at start-up.

The router prices a step under load by what a pass of that many tokens costs on the replica
(router/cost_model.py). Until requests have run, it has timed no pass, so the first burst of traffic
was priced as if the replica were idle: every request of a burst of 64 got the k of a single one.
The replica times a pass of each width here, once, before it registers (a fraction of a second on
the demo zoo; the widest pass dominates), and says so in its registration; the router starts from
these and its own timings of real passes take over as they come.

A pass here is one session's tokens of that width, each with its logits (as a verify or decode
pass wants them: the output head is a large share of a small model's pass); under load the same
width is spread over several sessions, which on a CPU costs a little more (attention runs per
session), and on CUDA decode passes replay graphs (workers/graphs.py), which these eager passes do
not: a prior the real passes correct, not a substitute for them.
"""

from __future__ import annotations

import logging
import time

import torch

from .batching import Scheduler
from .ragged_pass import Segment, run_pass
from .sim_device import PassShape

log = logging.getLogger("specserve.workers")
WIDTHS = (1, 2, 4, 8, 16, 32, 64, 128)  # tokens per pass: up to 8 sessions of k = 15, or 32 of k = 3
TIMED = 2  # passes timed per width; the fastest is kept (the others met the machine's noise)


def time_pass_widths(scheduler: Scheduler) -> tuple[tuple[int, float], ...]:
    """(tokens, seconds) of a pass of each width that fits the scheduler's passes. On the device thread."""
    widths = [w for w in WIDTHS if w <= scheduler.config.max_tokens_per_pass]
    if scheduler.timing is not None:  # a simulated device: what its curve gives a session's pass
        return tuple((width, scheduler.timing.seconds(PassShape(width, 1, width))) for width in widths)
    region = scheduler.pool.take(max(widths))
    cuda = scheduler.pool.shape.device.type == "cuda"

    def one(width: int) -> float:
        start = time.perf_counter()
        run_pass(scheduler.model, scheduler.pool, [Segment(region, 0, [0] * width, width)])
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter() - start

    try:
        one(widths[-1])  # first-call costs (allocations, kernel choice) stay out of the timings
        return tuple((width, min(one(width) for _ in range(TIMED))) for width in widths)
    finally:
        scheduler.pool.give_back(region)


def widest_within(pass_times: tuple[tuple[int, float], ...], seconds: float) -> int:
    """The widest timed pass (tokens) that takes at most ``seconds``; 1 when none does (a replica
    always holds at least one session)."""
    return max((width for width, taken in pass_times if taken <= seconds), default=1)
