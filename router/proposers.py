"""How a request gets the proposer its route names, in the router: a draft model on a draft worker
(router/remote_draft.py), a draft-free one (workers/lookup.py), or the tree of a task's proposers
(workers/token_tree.py). Every one of them speaks the workers' proposer interface (workers/proposing.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from specserve.workers.draft_length import DraftLength
from specserve.workers.lookup import DraftFree, ProposerKind, kind_of
from specserve.workers.proposing import Proposer, ProposerGone, StepRecorder
from specserve.workers.token_tree import TREE_MAX_TOKENS, TreeProposer

from .context import RequestContext
from .remote_draft import RemoteDraft


@dataclass
class ProposerFactory:
    """``trees``: task -> the members of its tree, its draft first; ``heads``: the drafts that are
    EAGLE-3 heads -> the target hidden states they read."""

    draft_free: DraftFree
    trees: dict[str, tuple[str, ...]]
    tree_max_tokens: int = TREE_MAX_TOKENS
    heads: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def make(self, name: str, context: RequestContext, length: DraftLength, recorder: StepRecorder) -> Proposer:
        kind = kind_of(name, self.heads)
        if kind is ProposerKind.DRAFT_FREE:
            return self.draft_free.proposer(name, context.task, recorder)
        if kind is ProposerKind.TREE:
            # Each member once: two of one draft would draw the same tokens (a draft's draws are keyed
            # by its name and position, workers/seeds.py), and a tree's siblings must be independent.
            members = tuple(dict.fromkeys(self.trees.get(context.task) or ()))
            if len(members) < 2:
                raise ProposerGone(f"task {context.task!r} has no tree of proposers (its members: {members})")
            return TreeProposer([self.make(m, context, length, recorder) for m in members], self.tree_max_tokens)
        return RemoteDraft(name, context, length, recorder, self.heads.get(name, ()))
