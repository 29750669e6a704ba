"""A head fed by the target's hidden states (an MTP module, an EAGLE-3 head) drafting where the target
verifies: on the target replica, after each verify pass, with no trip to a draft worker.

``FedGuesser`` is a target session's side (``TargetSession.guesser``, as Medusa heads' is): every
pass of the session leaves the head the hidden states of the positions it committed, and after a
verdict the session owes its next proposal. ``FedGuessBatch`` drafts what the pass's sessions owe
together once its verdicts are in (the steps' ``after_pass``): one pass of the head over every
session's newly committed positions, then one per drafted token, each shared by all of them
(``FedHead.step_many``), as vLLM runs its MTP and EAGLE drafters after the target's forward.

What it proposes is what the same head drafts in process or on a draft worker (``HeadState``,
``HeadRun``): the same draws, keyed by the request's seed, the head's name and the position; the
reply carries ``depth`` tokens and the request's proposer cuts them to its k (a run's first tokens
do not depend on how many follow). The router relays them as it relays Medusa heads' guesses
(``VerifyReply.next``). Before the first verdict there is nothing to draft from: the first step is
target-only, as a head's is anywhere.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from ..proposing import HiddenRows, ProposerGone
from .eagle3 import FedHead
from .proposer import HeadRun, HeadState

log = logging.getLogger("specserve.workers")
# A run's rows at most in one pass (its first feeds every position committed since the last run).
PASS_ROWS = 2**31


class FedGuessBatch:
    """The proposals one head owes the sessions a pass verified, drafted together (``flush``)."""

    def __init__(self, head: FedHead) -> None:
        self.head = head
        self.pending: list[tuple[FedGuesser, object]] = []

    def owe(self, guesser: FedGuesser, owner) -> None:
        """``owner.next`` gets the head's proposal after the committed tokens ``guesser`` holds."""
        self.pending.append((guesser, owner))

    @torch.inference_mode()
    def flush(self) -> None:
        pending, self.pending = self.pending, []
        runs = []
        for guesser, owner in pending:
            try:
                runs.append((owner, HeadRun(guesser.state, guesser.depth)))
            except ProposerGone as exc:  # no hidden states for some position: target-only from here
                log.warning("a head on the target replica cannot draft for a session (%s); it goes target-only", exc)
        active = [run for _, run in runs if run.result is None]
        try:
            while active:
                segments = [run.plan(PASS_ROWS) for run in active]
                for run, output in zip(active, self.head.step_many([s.run_on(self.head) for s in segments]),
                                       strict=True):
                    run.advance(output)
                active = [run for run in active if run.result is None]
        except Exception:  # noqa: BLE001 - no proposal is a target-only step, never another output
            log.exception("a head on the target replica failed to draft for %d sessions; their next steps go "
                          "target-only", len(active))
            return
        for owner, run in runs:
            owner.next = run.result


class FedGuesser:
    """One session's side of a head drafting here: its tokens and hidden states (``state``), and the
    tokens it proposes after each verdict (``depth``)."""

    def __init__(self, batch: FedGuessBatch, state: HeadState, depth: int, start: int = 0) -> None:
        self.batch = batch
        self.state = state
        self.depth = depth
        self.start = start  # the position of the next hidden state the session keeps

    def layers(self, segment) -> tuple[int, ...]:
        """The target layers a pass keeps of the segment's rows: every committed position feeds the head."""
        return self.batch.head.config.aux_layers

    def owe(self, owner, segment, proposed: int, kept: Sequence[int]) -> None:
        """Take the hidden states of the segment's committed rows (all but its last ``proposed``, then
        the proposal's ``kept``) and the session's committed tokens; after a verdict (a segment with
        logits), owe the next proposal."""
        fixed = len(segment.tokens) - proposed
        rows = segment.aux[:fixed]
        if kept:  # a chain's accepted tokens: the positions after the fixed ones
            rows = torch.cat([rows, segment.aux[fixed + torch.tensor(kept, dtype=torch.long)]])
        self.state.add(HiddenRows(self.start, rows))
        self.start += len(rows)
        committed = owner.sequence.committed
        self.state.commit(committed[len(self.state.committed) :])
        if segment.logits:
            self.batch.owe(self, owner)
