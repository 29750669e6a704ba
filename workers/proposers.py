"""The proposer a name stands for, built in one place for the in-process engine and the router.

A name is read once (``kind_of``, workers/lookup.py). Prompt lookup and suffix decoding are built
here wherever the loop runs, and so is a token tree of a task's proposers, each member once. Only a
model's draft (a draft model, an EAGLE-3 head, Medusa heads; a draft model under a cascade) is
built by where it runs, through the caller's ``ModelDraft``: in this process (workers/engine.py) or
on a draft worker (router/proposers.py).
"""

from __future__ import annotations

from collections.abc import Container, Sequence
from dataclasses import dataclass
from typing import Protocol

from .drafting import NO_CASCADE, Cascade
from .lookup import DraftFree
from .proposer_kinds import ProposerKind, kind_of
from .proposing import Proposer, ProposerGone, StepRecorder
from .request import CASCADE_GUESSES, CASCADE_MIN_P
from .token_tree import TREE_MAX_TOKENS, TreeProposer


class ModelDraft(Protocol):
    """Builds one request's proposer for a model's draft (``kind``: DRAFT, HEAD or ON_VERIFIER) where it runs.
    ``in_tree``: it is a tree's member, whose lookahead drafts no branch (the k the loop asks after a
    verdict follows the tree's path, not the member's chain, so a branch would not be its fresh draft).
    ``cascade``: prompt lookup under a draft model, which it verifies as it drafts (workers/drafting.py)."""

    def __call__(self, name: str, kind: ProposerKind, in_tree: bool, cascade: Cascade = NO_CASCADE) -> Proposer: ...


@dataclass
class Proposers:
    """What every request's proposer is built from: the draft-free proposers (and their tasks'
    outputs), the names of the drafts that are heads (drafting on draft workers or in process) and of
    those that draft where the target verifies, a tree's size and a cascade's guesses."""

    draft_free: DraftFree
    heads: Container[str] = ()
    tree_max_tokens: int = TREE_MAX_TOKENS
    on_verifier: Container[str] = ()
    cascade: Cascade = Cascade(CASCADE_GUESSES, CASCADE_MIN_P)

    def build(self, name: str, task: str, committed: Sequence[int], recorder: StepRecorder, model_draft: ModelDraft,
              members: Sequence[str] = ()) -> Proposer:
        """The proposer ``name`` stands for, for a request of ``task`` that has ``committed`` these
        tokens; ``members``: a tree's, its draft first, where ``name`` is the tree; a cascade's
        draft model, where it is the cascade."""
        return self._build(name, task, committed, recorder, model_draft, members, in_tree=False)

    def _build(self, name: str, task: str, committed: Sequence[int], recorder: StepRecorder, model_draft: ModelDraft,
               members: Sequence[str], in_tree: bool) -> Proposer:
        kind = kind_of(name, self.heads, self.on_verifier)
        if kind is ProposerKind.DRAFT_FREE:
            return self.draft_free.proposer(name, task, recorder, committed)
        if kind is ProposerKind.TREE:
            # Each member once: two of one draft would draw the same tokens (a draft's draws are keyed
            # by its name and position, workers/seeds.py), and a tree's siblings must be independent.
            members = tuple(dict.fromkeys(members))
            if in_tree or len(members) < 2:
                raise ProposerGone(f"task {task!r} has no tree of two or more proposers (its members: {members})")
            return TreeProposer([self._build(m, task, committed, recorder, model_draft, (), in_tree=True)
                                 for m in members], self.tree_max_tokens)
        if kind is ProposerKind.CASCADE:
            # A draft model only: heads draft from the target's hidden states, in passes of their own.
            if len(members) != 1 or kind_of(members[0], self.heads, self.on_verifier) is not ProposerKind.DRAFT:
                raise ProposerGone(f"task {task!r} has no draft model to cascade (got {list(members)})")
            return model_draft(members[0], ProposerKind.DRAFT, in_tree, self.cascade)
        return model_draft(name, kind, in_tree)
