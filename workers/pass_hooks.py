"""What a proposer needs of the verify pass, served by the target's session through one hook.

A proposer declares what it needs besides the verdict (``proposing.VerifyNeeds``); the target's
session is opened with the hook that serves it, and knows no more of it than this interface: which
of the target's layers a pass keeps of a segment's rows (``layers``), what to do with them once the
segment ran (``passed``), what the verify reply carries since the last one (``take``, under ``key``
in ``Verified.extras``; on the wire, ``wire.extras_message``), and the work the pass's sessions share,
done once they all advanced (``after_pass``). So the loop, the scheduler and the verifier name no
proposer kind. The hooks:

    HiddenKeeper   the hidden states of every committed position, for a head drafting elsewhere (an
                   EAGLE-3 head or MTP module on a draft worker, or in process): ``AUX_HIDDEN``
    DraftsHere     drafting the next proposal where the target verifies (``VERIFIER_NEXT``): Medusa
                   heads guessing it in the pass (heads/medusa_draft.py ``MedusaGuesser``), a head fed
                   by hidden states drafting it after the pass (heads/fed_guess.py ``FedGuesser``)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import torch

from .drafting import DraftTokens
from .proposing import AUX_HIDDEN, VERIFIER_NEXT, HiddenRows, windowed


class PassHook(ABC):
    key: str  # what it takes is returned under this key of ``Verified.extras``
    # It drafts the next proposal after each verdict: a session decoding in runs (target-only, no
    # proposal to come) drops it.
    drafts = False

    @property
    def after_pass(self) -> Callable[[], None] | None:
        """Work the pass's sessions share, once every step of the pass advanced (None: none)."""
        return None

    @abstractmethod
    def layers(self, segment) -> tuple[int, ...]:
        """The target layers whose hidden states the pass keeps of the segment's rows."""

    @abstractmethod
    def passed(self, session, segment, proposed: int, kept: Sequence[int]) -> None:
        """``segment`` of ``session`` ran: its committed rows are all but its last ``proposed`` (a
        proposal), then the proposal's rows ``kept`` (what the verdict accepted); a prefill chunk's
        (no logits) proposes nothing."""

    @abstractmethod
    def take(self) -> object | None:
        """What the verify reply carries since the last one (None: nothing)."""


def committed_rows(segment, proposed: int, kept: Sequence[int]) -> list[torch.Tensor]:
    """The kept hidden states of a segment's committed rows, in position order."""
    fixed = len(segment.tokens) - proposed
    rows = [segment.aux[:fixed]]
    if kept:  # in node order: a chain's accepted tokens, a tree's path
        rows.append(segment.aux[fixed + torch.tensor(kept, dtype=torch.long)])
    return rows


class HiddenKeeper(PassHook):
    """The hidden states (of ``layers``) of every position the session commits, handed out once each,
    in position order, from ``start``: a prompt prefix from the prefix cache was computed by another
    session, so its rows are nobody's here, and the head starts after it, as it starts after a long
    prompt's window (``proposing.windowed``)."""

    key = AUX_HIDDEN

    def __init__(self, layers: tuple[int, ...], start: int = 0) -> None:
        self.aux_layers = layers
        self.start = start  # the position of the first row not handed out
        self.rows: list[torch.Tensor] = []

    def layers(self, segment) -> tuple[int, ...]:
        return self.aux_layers

    def passed(self, session, segment, proposed: int, kept: Sequence[int]) -> None:
        if segment.aux is not None:
            self.rows += committed_rows(segment, proposed, kept)

    def take(self) -> HiddenRows:
        """The committed positions' hidden states not handed out yet, [n, layers * H]."""
        rows, self.rows = self.rows, []
        taken = HiddenRows(self.start, torch.cat(rows) if rows else torch.zeros(0, 0))
        self.start = taken.stop
        return windowed(taken)


class DraftsHere(PassHook):
    """A hook that drafts the request's next proposal where the target verifies, after each verdict,
    for every session of the pass at once (``batch.flush``): Medusa heads' and a fed head's."""

    key = VERIFIER_NEXT
    drafts = True
    batch: object  # what the pass's sessions share: ``flush`` drafts what they owe
    next: DraftTokens | None = None  # the proposal after the last verdict, until taken (None: none)

    @property
    def after_pass(self) -> Callable[[], None]:
        return self.batch.flush

    def take(self) -> DraftTokens | None:
        """The proposal after the last verdict, once (None: no pass since, or drafting failed)."""
        taken, self.next = self.next, None
        return taken
