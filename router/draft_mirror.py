"""The router's view of a request's draft session: which of its tokens stand, in absolute lengths.

A draft session holds tokens of two kinds: committed ones, and its last proposal (drafted past
them). Its steps speak in absolute lengths (``DraftStep``: keep this many tokens of what you hold,
append these, then propose), so a step is correct whatever the session's last proposal was. The
mirror tracks what the router knows, and each method returns what the next step sends:

  committed  tokens the session holds that the request has committed
  offset     where the proposal under verification starts, past ``committed`` (1 after a lookahead
             hit: the session's first drafted token was its guess of the target's, now committed)
  pending    committed tokens the session does not hold yet: the verdicts' target tokens (and, in
             a token tree, the accepted tokens of another proposer's branch)
"""

from __future__ import annotations

from collections.abc import Sequence

from specserve.proto.v1 import internal_pb2 as pb


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

    def step(self, k: int, min_confidence: float) -> pb.DraftStep:
        """Bring the session up to what is committed, and draft ``k`` tokens from there."""
        step = pb.DraftStep(keep=self.committed, append=self.pending, k=k, min_confidence=min_confidence,
                            adopt=self.adopt)
        self.committed, self.offset, self.pending = self.committed + len(self.pending), 0, []
        self.adopt = False
        return step

    def ahead(self, proposed: int, k: int, min_confidence: float) -> pb.DraftStep:
        """Draft past a proposal of ``proposed`` tokens under verification, as if all will be
        accepted: first a guess of the target's token, then at least one token after it."""
        keep = self.committed + self.offset + proposed
        step = pb.DraftStep(keep=keep, k=k, min_confidence=min_confidence, min_tokens=2, guess=True, adopt=self.adopt)
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
