"""How a request gets the proposer its route names, in the router: what workers/proposers.py builds
(a draft-free proposer, or the tree of a task's proposers), with a draft model on a draft worker
(router/remote_draft.py) where the name is a model's, and Medusa heads on the target replica (their
guesses come with each verdict). Every one of them speaks the workers' proposer interface
(workers/proposing.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.workers.draft_length import DraftLength
from specserve.workers.verifier_draft import VerifierDraft
from specserve.workers.lookup import DraftFree
from specserve.workers.proposer_kinds import CASCADE, ProposerKind, base_draft
from specserve.workers.proposers import Proposers
from specserve.workers.proposing import Proposer, StepRecorder
from specserve.workers.drafting import NO_CASCADE, Cascade
from specserve.workers.request import CASCADE_GUESSES, CASCADE_MIN_P
from specserve.workers.token_tree import TREE_MAX_TOKENS

from .context import RequestContext
from .remote_draft import RemoteDraft


@dataclass
class ProposerFactory:
    """``trees``: task -> the members of its tree, its draft first; ``cascades``: task -> the draft
    model its cascade runs; ``heads``: the drafts that are EAGLE-3 heads -> the target hidden states
    they read (served by draft workers); ``on_verifier``: the drafts the target replicas serve,
    their proposals coming with each verdict (Medusa heads, and heads ``models.on_replica`` names)."""

    draft_free: DraftFree
    trees: dict[str, tuple[str, ...]]
    tree_max_tokens: int = TREE_MAX_TOKENS
    heads: dict[str, tuple[int, ...]] = field(default_factory=dict)
    on_verifier: frozenset[str] = frozenset()
    cascades: dict[str, str] = field(default_factory=dict)
    cascade: Cascade = Cascade(CASCADE_GUESSES, CASCADE_MIN_P)

    def __post_init__(self) -> None:
        self.proposers = Proposers(self.draft_free, self.heads, self.tree_max_tokens, self.on_verifier, self.cascade)

    def make(self, name: str, context: RequestContext, length: DraftLength, recorder: StepRecorder) -> Proposer:
        def on_a_draft_worker(draft: str, kind: ProposerKind, in_tree: bool, cascade: Cascade = NO_CASCADE) -> Proposer:
            if kind is ProposerKind.ON_VERIFIER:  # on the target replica, in or after its verify passes
                return VerifierDraft(draft, context.params.sampling, recorder, length.most)
            return RemoteDraft(draft, context, length, recorder, self.heads.get(base_draft(draft), ()),
                               branch=not in_tree, cascade=cascade)
        task = context.task
        members = (self.cascades[task],) if name == CASCADE and task in self.cascades else self.trees.get(task, ())
        return self.proposers.build(name, task, context.history.committed_ids(), recorder, on_a_draft_worker,
                                    members)
