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
from specserve.workers.proposing import NEEDS_NOTHING, VerifyNeeds
from specserve.workers.request import GenerationParams
from specserve.workers.seeds import replacement_seed
from specserve.workers.wire import processing_message, sampling_message

from .config import TimeoutsConfig
from .directory import WorkerDirectory

# The router gives up waiting this long before the client's deadline, so the client hears why
# (UNAVAILABLE, with the reason) rather than a bare DEADLINE_EXCEEDED. A second, not a moment: the
# reply has to leave a router whose event loop may lag behind a loaded host (0.25 s was missed so).
DEADLINE_MARGIN_SECONDS = 1.0


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
    # at most half a run: TargetOpen.decode_group).
    decode_group: int = 1

    def target_opening(self, replaced: int = 0, needs: VerifyNeeds = NEEDS_NOTHING) -> pb.SessionOpen:
        """The open message of a target replica's session holding every committed token, serving
        what the proposer ``needs`` of its passes (the hidden states a head on a draft worker reads,
        or the heads that draft in or after its passes and the tokens a fed one drafts)."""
        opened = self._opening("target", replaced)
        processing = self.params.processing
        opened.target.CopyFrom(pb.TargetOpen(
            aux_layers=needs.hidden_layers, decode_group=self.decode_group, logprobs=self.params.logprobs is not None,
            top_logprobs=self.params.logprobs or 0,
            processing=processing_message(processing, len(self.history.prompt_ids)) if processing.active else None,
            on_verifier=needs.on_verifier, on_verifier_depth=needs.depth))
        return opened

    def draft_opening(self, model: str, replaced: int = 0, cascade: Cascade = NO_CASCADE,
                      alternatives: bool = False) -> pb.SessionOpen:
        """The open message of draft ``model``'s session on a draft worker holding every committed
        token (with prompt lookup under it, ``cascade``; its alternatives with each proposal)."""
        opened = self._opening("draft", replaced)
        opened.draft.CopyFrom(pb.DraftOpen(model=model, alternatives=alternatives, cascade=cascade.guesses,
                                           cascade_min_p=cascade.min_p))
        return opened

    def _opening(self, role: str, replaced: int) -> pb.SessionOpen:
        """What every session's open says. A worker replacing ``replaced`` failed ones draws from a
        seed of its own (fresh draws keep the target's distribution), so a replay with the same seed
        and the same faults gives the same output."""
        seed = replacement_seed(self.history.stats.seed, role, replaced)
        grammar = self.params.grammar
        return pb.SessionOpen(session_id=self.request_id, prompt_ids=self.history.committed_ids(),
                              sampling=sampling_message(self.params.sampling, seed),
                              max_new_tokens=self.history.remaining, task=self.task,
                              grammar=None if grammar is None else
                              pb.Grammar(compiled=grammar.compiled(), output_start=len(self.history.prompt_ids)))

    def before_deadline(self, give_up: float) -> float:
        """When to stop waiting: at ``give_up``, or just before the client's deadline if sooner."""
        return give_up if self.deadline is None else min(give_up, self.deadline - DEADLINE_MARGIN_SECONDS)
