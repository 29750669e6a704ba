"""What a request's collaborators (its target link, its proposer) are built from: one context.

They get this, not the request object: its id, task and parameters, its committed tokens (the
router's truth, read to open a worker's session on them), where its workers are, how long to wait
for them, and the client's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.decoding import Decoding
from specserve.workers.drafting import NO_CASCADE, Cascade
from specserve.workers.request import GenerationParams
from specserve.workers.seeds import replacement_seed
from specserve.workers.wire import processing_message, sampling_message

from .config import TimeoutsConfig
from .directory import WorkerDirectory

# The router gives up waiting this long before the client's deadline, so the client hears why
# (UNAVAILABLE, with the reason) rather than a bare DEADLINE_EXCEEDED.
DEADLINE_MARGIN_SECONDS = 0.25


@dataclass(frozen=True)
class RequestContext:
    request_id: str
    task: str
    params: GenerationParams
    history: Decoding  # the committed tokens, the output and the statistics
    directory: WorkerDirectory
    timeouts: TimeoutsConfig
    deadline: float | None = None  # time.monotonic(), the client's; None: none
    lookahead: bool = False  # a remote draft drafts ahead while the target verifies
    # Target-only, the target decodes in runs of up to this many tokens granted ahead, so the request
    # stays in every batched pass of its replica rather than sitting out a round trip per token.
    decode_run: int = 1
    # With ``lookahead``, a remote draft drafts ahead unless the lookahead budget holds this request
    # back (router/lookahead_budget.py); its first step is target-only either way, so a seed gives
    # one output whatever the budget decided.
    ahead: bool = True
    # A lookahead drafts beside it for the likeliest rejection, where the draft gives it these odds
    # (router.lookahead_branch_min_odds); None: no branches.
    branch_odds: float | None = None
    # A decode run's tokens come from the replica in groups of this many (router.stream_interval_tokens,
    # at most half a run: SessionOpen.decode_group).
    decode_group: int = 1

    def opening(self, model: str = "", replaced: int = 0, aux_layers: tuple[int, ...] = (),
                medusa: str = "", medusa_depth: int = 0, cascade: Cascade = NO_CASCADE) -> pb.SessionOpen:
        """The open message of a worker's session holding every committed token: the target's
        (with the hidden states an EAGLE-3 head reads, ``aux_layers``, or the heads that guess in
        or after its passes, ``medusa``, and the tokens a fed one drafts, ``medusa_depth``), or the draft ``model``'s (with prompt lookup under it,
        ``cascade``).
        A worker replacing ``replaced`` failed ones draws from a seed of its own (fresh draws keep
        the target's distribution), so a replay with the same seed and the same faults gives the
        same output."""
        seed = replacement_seed(self.history.stats.seed, "draft" if model else "target", replaced)
        return pb.SessionOpen(session_id=self.request_id, prompt_ids=self.history.committed_ids(), model=model,
                              sampling=sampling_message(self.params.sampling, seed),
                              max_new_tokens=self.history.remaining, task=self.task, aux_layers=aux_layers,
                              medusa=medusa, medusa_depth=medusa_depth, cascade=cascade.guesses, cascade_min_p=cascade.min_p,
                              decode_group=0 if model else self.decode_group,
                              logprobs=not model and self.params.logprobs is not None,
                              top_logprobs=0 if model else self.params.logprobs or 0,
                              processing=None if model or not self.params.processing.active else
                              processing_message(self.params.processing, len(self.history.prompt_ids)),
                              grammar=None if self.params.grammar is None else
                              pb.Grammar(compiled=self.params.grammar.compiled(),
                                         output_start=len(self.history.prompt_ids)))

    def before_deadline(self, give_up: float) -> float:
        """When to stop waiting: at ``give_up``, or just before the client's deadline if sooner."""
        return give_up if self.deadline is None else min(give_up, self.deadline - DEADLINE_MARGIN_SECONDS)
