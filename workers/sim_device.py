"""A simulated device: an accelerator's timing, without the accelerator.

On a CPU the model's pass is the host's own compute: verifying k+1 tokens costs about k+1 times one
token, and nothing the host does can overlap the device. A GPU behaves otherwise (on the H200 a
graphed demo-zoo pass of 64 sessions x 5 tokens took 2.19 ms against 1.85 ms for 64 x 1), so
neither the host path's share of a step nor speculation at batch can be judged here from real passes.

A simulated device keeps the model's math real (the process still runs its model, a small one, so
every output is still checked against target-only) and then *holds* the device for the time a cost
model gives the pass, counted from when the pass began: the device thread sleeps (no CPU, the GIL
released), as the host does while a CUDA stream runs, so the process's other threads (its gRPC loop,
its scheduling) run meanwhile. Where the real math takes longer than the modelled time, the pass
takes the math's time and the difference is counted as an overrun: the simulation then reads slower
than the device it models, never faster.

It is a timing model, not a model of quality: what a draft accepts is still what its real model
accepts. The presets (``CURVES``, ``PRESETS``) and where their figures come from are in
docs/pages/simulated-devices.md.

Glossary:
    pass shape: rows (tokens run in the pass, all sessions), sessions (segments), positions (cached
        keys the pass attends over, all sessions: its KV reads).
    curve: a pass's time as a function of its shape,
        fixed + by_sessions(sessions) + max(weights, rows x per_row) + positions x per_position:
        a launch and synchronisation cost, a per-session cost (attention's gathers, per-sequence
        kernels), the roofline of reading the weights once against computing every row, and the
        KV cache's reading.
    stream: the device's queue; passes run on it one after another.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger("specserve.workers")
TARGET, DRAFT, HEAD = "target", "draft", "head"  # the roles a model plays on a device
ROLES = (TARGET, DRAFT, HEAD)
ANY_TASK = "*"  # in SimConfig.alignment: every task not named


@dataclass(frozen=True)
class PassShape:
    rows: int  # tokens the pass runs, over all its sessions
    sessions: int
    positions: int = 0  # cached positions it attends over, over all its sessions


@dataclass(frozen=True)
class PassCurve:
    """A pass's device time by its shape (the module's glossary); milliseconds throughout."""

    fixed_ms: float
    # (sessions, ms) points of the per-session cost, interpolated linearly between them and extended
    # past the last at its last slope; 0 at 0 sessions.
    by_sessions_ms: tuple[tuple[int, float], ...]
    per_row_ms: float
    weights_ms: float = 0.0  # reading the weights once: a floor under rows x per_row (the roofline)
    per_kilo_position_ms: float = 0.0  # reading 1,000 cached positions' keys and values
    source: str = ""  # where the figures come from

    def ms(self, shape: PassShape) -> float:
        return (self.fixed_ms + self._sessions_ms(shape.sessions) + max(self.weights_ms, shape.rows * self.per_row_ms)
                + shape.positions * self.per_kilo_position_ms / 1000)

    def seconds(self, shape: PassShape) -> float:
        return self.ms(shape) / 1000

    def _sessions_ms(self, sessions: int) -> float:
        points = ((0, 0.0), *self.by_sessions_ms)
        counts = [n for n, _ in points]
        i = min(max(bisect.bisect_right(counts, sessions), 1), len(points) - 1)
        (n0, t0), (n1, t1) = points[i - 1], points[i]
        return t0 + (sessions - n0) * (t1 - t0) / (n1 - n0)


# ---- the presets ---------------------------------------------------------------------------------
# The demo zoo on one H200 (bf16, CUDA graphs), fitted exactly to the graphed passes issue 58 names
# (the committed GPU checks in bench/results/20261127-*-gpu measured the same passes within 10-25%):
# target 0.96 ms at 1 session x 1 token, 1.17 at 16 x 1, 1.85 at 64 x 1, 2.19 at 64 x 5; draft 0.57,
# 0.83 and 1.25 at 1, 16 and 64 x 1 (its rows beyond one a session at 64 x 5 / 64 x 1 of the 09:20
# check, 1.274 / 0.981 ms). Launch-bound: the weights (60 MB) read in ~15 us, under every pass.
# KV: 6,144 bytes a position (the check's KV pool) read at ~4.8 TB/s.
_H200_DEMO_SOURCE = ("demo zoo on one H200, bf16, CUDA graphs: fitted to issue 58's graphed passes "
                     "(bench/results/20261127-092000-gpu)")
_ROW_MS = (2.19 - 1.85) / (64 * 4)  # 0.00133: a verify's rows beyond the first, from 64x5 against 64x1
_DRAFT_ROW_MS = (1.274 - 0.981) / (64 * 4)
H200_DEMO_TARGET = PassCurve(
    fixed_ms=0.96 - _ROW_MS,
    by_sessions_ms=((1, 0.0), (16, 1.17 - 0.96 - 15 * _ROW_MS), (64, 1.85 - 0.96 - 63 * _ROW_MS)),
    per_row_ms=_ROW_MS, per_kilo_position_ms=0.0013, source=_H200_DEMO_SOURCE)
H200_DEMO_DRAFT = PassCurve(
    fixed_ms=0.57 - _DRAFT_ROW_MS,
    by_sessions_ms=((1, 0.0), (16, 0.83 - 0.57 - 15 * _DRAFT_ROW_MS), (64, 1.25 - 0.57 - 63 * _DRAFT_ROW_MS)),
    per_row_ms=_DRAFT_ROW_MS, per_kilo_position_ms=0.0005, source=_H200_DEMO_SOURCE)
# An EAGLE-3 head (one decoder layer and a reduced vocabulary) was never timed on the GPU: half the
# draft's pass, as its graph launches about half the draft's kernels. An estimate, said so.
H200_DEMO_HEAD = PassCurve(
    fixed_ms=H200_DEMO_DRAFT.fixed_ms / 2, by_sessions_ms=tuple((n, t / 2) for n, t in H200_DEMO_DRAFT.by_sessions_ms),
    per_row_ms=_DRAFT_ROW_MS / 2, per_kilo_position_ms=0.0002,
    source="estimated: half the demo draft's H200 pass (never timed on a GPU)")

# A production pair on H100 SXM (NVIDIA's datasheet: 3.35 TB/s HBM3, 989 TFLOP/s dense bf16), by a
# roofline at 70% of the bandwidth and 60% of the FLOPs, the efficiencies graphed decode kernels reach:
# - target: a Llama-3-70B-class model in bf16, tensor-parallel over 4 GPUs: 35 GB of weights a GPU
#   read in 14.9 ms; a row's 35 GFLOP a GPU in 0.059 ms (the roofline turns at ~250 rows); 160
#   all-reduces a pass (2 a layer x 80) at ~8 us; KV 327,680 bytes a position (80 layers x 8 KV heads
#   x 128 x K,V x 2 bytes), a quarter a GPU. So ~16 ms a decode step at one session, which is what
#   serving engines report for such a pair (~60 tokens/s a stream for 70B on 4 H100s).
# - draft: a Llama-3.2-1B-class model on one H100: 2.5 GB in 1.07 ms; KV 32,768 bytes a position.
#   c = 0.08 at one session.
# - head: an EAGLE-3 head for the 70B target: one decoder layer (~0.9 GB) and a 32k-row head over
#   the 8,192 hidden size (~0.5 GB) on one GPU: ~0.6 ms.
_H100_SOURCE = "roofline from the H100 SXM datasheet (70% of 3.35 TB/s, 60% of 989 TFLOP/s); see the module"
H100_70B_TARGET = PassCurve(fixed_ms=1.3, by_sessions_ms=((1, 0.0), (64, 0.32)), per_row_ms=0.059, weights_ms=14.9,
                            per_kilo_position_ms=82e3 / 2.35e12 * 1e3 * 1e3, source=_H100_SOURCE)
H100_1B_DRAFT = PassCurve(fixed_ms=0.15, by_sessions_ms=((1, 0.0), (64, 0.16)), per_row_ms=0.0042, weights_ms=1.07,
                          per_kilo_position_ms=32_768 / 2.35e12 * 1e3 * 1e3, source=_H100_SOURCE)
H100_70B_HEAD = PassCurve(fixed_ms=0.05, by_sessions_ms=((1, 0.0), (64, 0.08)), per_row_ms=0.0024, weights_ms=0.6,
                          per_kilo_position_ms=4_096 / 2.35e12 * 1e3 * 1e3, source=_H100_SOURCE)

CURVES: dict[str, PassCurve] = {
    "h200-demo-target": H200_DEMO_TARGET, "h200-demo-draft": H200_DEMO_DRAFT, "h200-demo-head": H200_DEMO_HEAD,
    "h100-70b-target": H100_70B_TARGET, "h100-1b-draft": H100_1B_DRAFT, "h100-70b-head": H100_70B_HEAD,
}
# A preset: the curve each role takes unless the config names one for the model.
PRESETS: dict[str, dict[str, str]] = {
    "h200-demo": {TARGET: "h200-demo-target", DRAFT: "h200-demo-draft", HEAD: "h200-demo-head"},
    "h100-70b": {TARGET: "h100-70b-target", DRAFT: "h100-1b-draft", HEAD: "h100-70b-head"},
}


class SimConfig(BaseModel):
    """The timing of a process's simulated device (read where its ``device`` is ``sim``). Frozen and
    strict as every config (workers/config.py's FrozenConfig, which composes this one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    preset: str = "h200-demo"  # the curve of each role: a key of PRESETS
    # By model name, the curve it takes instead of its role's (a key of CURVES): a draft the size of
    # another preset's, say.
    models: dict[str, str] = Field(default_factory=dict)
    # By draft model name, then task (ANY_TASK: every task not named), how often its drafted tokens
    # come from its own distribution (workers/drafting.py Misalignment): 1 (or unnamed), always;
    # 0.6, 60% of positions, the rest drafted from a shifted one. On the host-path zoo, whose drafts
    # are copies of the target, that is the draft's acceptance rate on the task: alpha per task as
    # a parameter, so the routing policy has real choices to make.
    alignment: dict[str, dict[str, float]] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _known(self) -> SimConfig:
        if self.preset not in PRESETS:
            raise ValueError(f"sim.preset must be one of {', '.join(PRESETS)}, got {self.preset!r}")
        unknown = {name: curve for name, curve in self.models.items() if curve not in CURVES}
        if unknown:
            raise ValueError(f"sim.models names curves {', '.join(sorted(set(unknown.values())))} for "
                             f"{', '.join(sorted(unknown))}; the curves: {', '.join(CURVES)}")
        wrong = [f"{draft}.{task}: {a}" for draft, tasks in self.alignment.items() for task, a in tasks.items()
                 if not 0.0 <= a <= 1.0]
        if wrong:
            raise ValueError(f"sim.alignment must be between 0 and 1 (the share of positions a draft drafts from "
                             f"its own distribution), got {', '.join(wrong)}")
        return self

    def curve(self, model: str, role: str) -> PassCurve:
        return CURVES[self.models.get(model) or PRESETS[self.preset][role]]

    def alignment_of(self, draft: str, task: str) -> float | None:
        """The alignment set for ``draft`` on ``task`` (None: none set, the draft's own)."""
        tasks = self.alignment.get(draft, {})
        return tasks.get(task, tasks.get(ANY_TASK))


class SimStream:
    """The simulated device's queue: each pass holds it for its modelled time from when it began
    (or from when the pass before it ends, if later: passes queue on it as kernels on a CUDA stream).
    Its counters say by how much the real math outran the model. Written from the process's one
    device thread; ``land`` calls back from a thread of its own."""

    def __init__(self) -> None:
        self.busy_until = 0.0  # time.perf_counter() when the last pass queued ends
        self.busy_seconds = 0.0  # in passes, summed
        self.overrun_seconds = 0.0  # the math's time beyond the modelled, summed over passes
        self.overrun_passes = 0
        self._landings: list[tuple[float, int, Callable[[], None]]] = []  # a heap by end
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._lander: threading.Thread | None = None

    def enqueue(self, seconds: float, started: float) -> tuple[float, float]:
        """A pass whose math began at ``started`` and has just ended, modelled at ``seconds``:
        (when it begins on the device, when it ends there)."""
        begin = max(started, self.busy_until)
        end, now = begin + seconds, time.perf_counter()
        if end < now:  # the real math took longer than the device would: the pass takes the math's time
            self.overrun_seconds += now - end
            self.overrun_passes += 1
            end = now
        self.busy_until = end
        self.busy_seconds += end - begin
        return begin, end

    def hold(self, seconds: float, started: float) -> float:
        """After a pass's math, which began at ``started``: wait out the rest of the pass's modelled
        ``seconds`` without CPU (the host's other threads run meanwhile, as while a synchronous CUDA
        call waits). Returns the seconds the device was busy with the pass."""
        begin, end = self.enqueue(seconds, started)
        wait = end - time.perf_counter()
        if wait > 0:
            time.sleep(wait)  # releases the GIL
        return end - begin

    def land(self, at: float, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the stream's own thread) once the device reaches ``at``, as a CUDA
        event's host callback: a pass's results are read when the device would have them, while the
        host plans and launches the next pass meanwhile."""
        with self._wake:
            heapq.heappush(self._landings, (at, next(self._order), callback))
            if self._lander is None:
                self._lander = threading.Thread(target=self._land_forever, name="sim-stream", daemon=True)
                self._lander.start()
            self._wake.notify()

    def _land_forever(self) -> None:
        while True:
            with self._wake:
                while not self._landings:
                    self._wake.wait()
                at = self._landings[0][0]
                wait = at - time.perf_counter()
                if wait > 0:
                    self._wake.wait(wait)  # woken early by a landing queued before this one: look again
                    continue
                _, _, callback = heapq.heappop(self._landings)
            try:
                callback()
            except Exception:  # its event loop gone (the scheduler's owner stopped): the next ones still land
                log.exception("a simulated pass's landing failed")


# A model's attribute (``simulate``): the stream and curve of the simulated device its passes run
# alone on (the in-process engine's passes; a scheduler's are timed by its Device instead).
SIMULATED = "specserve_simulated_device"


def simulate(model: object, stream: SimStream, curve: PassCurve) -> None:
    """Time ``model``'s passes run alone (workers/steps.py run_alone, a head's own passes) on
    ``stream`` by ``curve``."""
    setattr(model, SIMULATED, (stream, curve))


def held(model: object, started: float, segments: Sequence,
         shape: Callable[[Sequence], PassShape] | None = None) -> None:
    """After a pass of ``model`` run alone over ``segments``, begun at ``started``: on a simulated
    device (``simulate``), the rest of its modelled time waited out, by the pass's ``shape``
    (default: ``shape_of``); on a real one, nothing (and no shape is read)."""
    timed = getattr(model, SIMULATED, None)
    if timed is not None:
        stream, curve = timed
        stream.hold(curve.seconds((shape or shape_of)(segments)), started)


def shape_of(segments: Sequence) -> PassShape:
    """A ragged pass's shape (workers/ragged_pass.py Segment: ``start`` cached, ``tokens`` new)."""
    rows = sum(len(s.tokens) for s in segments)
    return PassShape(rows=rows, sessions=len(segments), positions=sum(s.start for s in segments) + rows)
