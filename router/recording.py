"""What a request's steps cost through the service: the workers' statistics, plus the waits and
batched passes the router prices steps with (the routing policy learns from them)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.recording import StatsRecorder
from specserve.workers.stats import SpecStats

from .cost_model import PassFit
from .passes import PassLog


@dataclass
class StepTimes:
    """What the router waited for per step, what the workers computed, and the batched passes the
    steps ran in, over one request (decode steps: a prefill's wait and pass are no step's price)."""

    draft_steps: list[float] = field(default_factory=list)  # waits for proposals (a lookahead hit: ~0)
    verify_steps: list[float] = field(default_factory=list)  # waits for verdicts on proposals
    plain_steps: list[float] = field(default_factory=list)  # waits for target-only passes
    verify_device: float = 0.0
    plain_device: float = 0.0
    target_passes: PassLog = field(default_factory=PassLog)  # the batch each verify step ran in
    draft_passes: PassLog = field(default_factory=PassLog)  # and each proposal (its last pass)
    pass_fit: PassFit = field(default_factory=PassFit)  # (tokens, device seconds) of those target passes

    def record(self, drafted: bool, wait: float, reply: pb.VerifyReply) -> None:
        if drafted:
            self.verify_steps.append(wait)
            self.verify_device += reply.seconds
        else:
            self.plain_steps.append(wait)
            self.plain_device += reply.seconds
        self.target_passes.add(reply.pass_info)
        self.pass_fit.add(reply.pass_info.tokens, reply.seconds, reply.pass_info.sessions)


class RequestRecorder(StatsRecorder):
    """The step recorder of a request in the service."""

    def __init__(self, stats: SpecStats) -> None:
        super().__init__(stats)
        self.times = StepTimes()

    def drafted(self, tokens: int, seconds: float, batch: pb.PassInfo | None = None) -> None:
        super().drafted(tokens, seconds)
        if batch is not None:
            self.times.draft_passes.add(batch)

    def waited(self, seconds: float) -> None:
        self.times.draft_steps.append(seconds)
