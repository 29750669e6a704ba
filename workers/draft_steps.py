"""What a draft session is told each step, and the proposer's side that tells it.

A draft session (workers/drafters.py: a draft model's, a bridged draft's, a head's) holds tokens of
two kinds: committed ones, and its last proposal (drafted past them). A step speaks in absolute
lengths (keep this many tokens of what you hold, append these, then propose up to k), so it is
correct whatever the session's last proposal was, and rollback is bookkeeping. The same steps
drive a session in this process (workers/session_proposer.py) and on a draft worker, where the
router sends them over a stream (router/remote_draft.py; ``wire.step_message``).

``DraftMirror`` is the proposer's view of the session, and each method returns what the next step
says:

  committed  tokens the session holds that the request has committed
  offset     where the proposal under verification starts, past ``committed`` (1 after a lookahead
             hit: the session's first drafted token was its guess of the target's, now committed)
  pending    committed tokens the session does not hold yet: the verdicts' target tokens (and, in
             a token tree, the accepted tokens of another proposer's branch)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .proposing import HiddenRows


@dataclass(frozen=True)
class Fork:
    """A branch drafted beside a lookahead (SSD, workers/drafting.py ``BranchRun``): it forks after
    ``keep`` of the session's tokens, assuming the target's ``token`` there (its first token), and
    holds ``k`` tokens, that one included."""

    keep: int
    token: int
    k: int


@dataclass(frozen=True)
class DraftStep:
    """One step of a draft session: keep the first ``keep`` tokens it holds, append ``append``,
    then propose up to ``k``.

    min_confidence  stop after a token the draft gave less probability than this (0: never), but
                    not before ``min_tokens``: the draft's own draws decide, so q stays exact
    guess           the first token drafted is the draft's guess of the target's own (a lookahead)
    adopt           the session holds its last step's branch from now on (the router used it)
    fork            a branch to draft beside this step's proposal, in the same passes
    hidden          the target's hidden states of the positions committed since the last step (a
                    head's session)
    drop_previous   the step before this one is stale: stop it at the next pass boundary
    """

    keep: int
    append: tuple[int, ...] = ()
    k: int = 0
    min_confidence: float = 0.0
    min_tokens: int = 1
    guess: bool = False
    adopt: bool = False
    fork: Fork | None = None
    hidden: HiddenRows | None = None
    drop_previous: bool = False


class DraftMirror:
    def __init__(self, committed: int) -> None:
        self.reopen(committed)

    def reopen(self, committed: int) -> None:
        """A session (re)opened holding ``committed`` tokens, all of them committed."""
        self.committed, self.offset, self.pending = committed, 0, []
        self.adopt = False  # the next step says the session adopts its last branch

    def verdict(self, num_accepted: int, appended: Sequence[int]) -> None:
        """The request committed a verdict: the accepted prefix of the proposal, then ``appended``
        (the target's token, after another branch's accepted tokens when the proposal was a tree)."""
        if self.pending:  # the session drafted nothing since its last verdict: nothing was accepted
            self.pending.extend(appended)
            return
        self.committed += self.offset + num_accepted
        self.offset, self.pending = 0, list(appended)

    def step(self, k: int, min_confidence: float) -> DraftStep:
        """Bring the session up to what is committed, and draft ``k`` tokens from there."""
        step = DraftStep(self.committed, tuple(self.pending), k, min_confidence, adopt=self.adopt)
        self.committed, self.offset, self.pending = self.committed + len(self.pending), 0, []
        self.adopt = False
        return step

    def ahead(self, proposed: int, k: int, min_confidence: float) -> DraftStep:
        """Draft past a proposal of ``proposed`` tokens under verification, as if all will be
        accepted: first a guess of the target's token, then at least one token after it."""
        keep = self.committed + self.offset + proposed
        step = DraftStep(keep, (), k, min_confidence, min_tokens=2, guess=True, adopt=self.adopt)
        self.adopt = False
        return step

    def branch_hit(self) -> None:
        """The verdict rejected the proposal where the lookahead's branch forked, and the target's
        token there was the one the branch assumed: the session adopts the branch (the next step
        says so), whose first token is that one, now committed, and its proposal after it the next."""
        self.pending, self.offset, self.adopt = [], 1, True

    def lookahead_hit(self) -> None:
        """The verdict accepted every token the lookahead assumed, and its guess was the target's
        token: the session already holds that token; its proposal after it is the next one."""
        self.pending, self.offset = [], 1
