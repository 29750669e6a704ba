"""Several proposers at once: their proposals merged into one token tree, verified in one pass.

Each member (a draft model, prompt lookup, suffix decoding) proposes its chain as it would alone;
the chains are merged into a trie, so a token two of them agree on is one node, and the target
verifies the whole tree in one pass (ragged_pass.py: a tree attention mask) and keeps its longest
accepted path (greedy) or the path recursive rejection walks (sampling: acceptance.py
``verify_tree``). Every member then learns what was committed: how much of its own chain, and
which tokens followed.

Merging is lossless only between candidates drawn independently of each other: deterministic ones
(one-hot q: the draft-free proposers, and a greedy draft model) merge with each other; a sampled
draft's tokens never merge, each keeps its own node (recursive rejection handles a sibling that
repeats a token).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .acceptance import SparseDist, Outcome
from .drafting import DraftTokens, stack_rows
from .lookup import TREE
from .proposing import NEEDS_NOTHING, NO_EXTRAS, Proposer, ProposerGone, VerifyNeeds, accepted_ids

TREE_MAX_TOKENS = 24  # nodes per tree by default: a verify pass of ~k + 1 tokens per member


@dataclass
class MergedTree:
    proposal: DraftTokens  # ids, parents (None when the tree is one chain), q (a row per node)
    nodes: list[list[int]]  # per chain, its tokens' nodes in the tree


def merge(chains: Sequence[tuple[DraftTokens, bool]], max_tokens: int) -> MergedTree:
    """One tree of the (chain, deterministic) pairs, the first chain's tokens first, at most
    ``max_tokens`` nodes (a chain is cut where the tree is full). A chain drawn at random shares no node."""
    ids: list[int] = []
    parents: list[int] = []
    rows: list[SparseDist] = []  # each node's q row ([1, m])
    shared: dict[tuple[int, int], int] = {}  # (parent node, token) -> node, among deterministic ones
    nodes: list[list[int]] = []
    for chain, deterministic in chains:
        parent, mine = -1, []
        for i, token in enumerate(chain.ids):
            node = shared.get((parent, token)) if deterministic else None
            if node is None:
                if len(ids) == max_tokens:
                    break
                node = len(ids)
                ids.append(token)
                parents.append(parent)
                rows.append(SparseDist(chain.q.ids[i : i + 1], chain.q.probs[i : i + 1]))
                if deterministic:
                    shared[(parent, token)] = node
            mine.append(node)
            parent = node
        nodes.append(mine)
    one_chain = parents == list(range(-1, len(ids) - 1))
    proposal = DraftTokens(ids, stack_rows(rows), None if one_chain else parents) if ids else DraftTokens.empty()
    return MergedTree(proposal, nodes)


class TreeProposer(Proposer):
    """Its members' proposals as one tree; a member that is gone (its draft worker lost) is dropped."""

    name = TREE

    def __init__(self, members: list[Proposer], max_tokens: int) -> None:
        self.members = members
        self.max_tokens = max_tokens
        self.chains: dict[int, DraftTokens] = {}  # id(member) -> its last chain
        self.tree: MergedTree | None = None
        self.proposing: list[Proposer] = []  # the members of the last tree, in its order

    @property
    def needs(self) -> VerifyNeeds:
        needs = NEEDS_NOTHING
        for member in self.members:
            needs = needs.with_(member.needs)
        return needs

    async def open(self, committed: Sequence[int]) -> None:
        for member in list(self.members):
            try:
                await member.open(committed)
            except ProposerGone as exc:
                self._drop(member, exc)

    async def propose(self, k: int) -> DraftTokens:
        chains = []
        for member in list(self.members):
            try:
                chains.append((member, await member.propose(k)))
            except ProposerGone as exc:
                self._drop(member, exc)
        self.proposing = [member for member, _ in chains]
        self.chains = {id(member): chain for member, chain in chains}
        self.tree = merge([(chain, member.deterministic) for member, chain in chains], self.max_tokens)
        return self.tree.proposal

    def draft_ahead(self, proposal: DraftTokens, branch: bool = True) -> None:
        """Each member ahead of its own chain, without a branch: the k the loop asks after a verdict
        follows the tree's depth and path, not a member's chain, so a member's branch would not be
        the draft it drafts afresh."""
        for member in self.members:
            member.draft_ahead(self.chains.get(id(member), DraftTokens.empty()), branch=False)

    def commit(self, proposal: DraftTokens, verdict: Outcome, extras: Mapping[str, object] = NO_EXTRAS) -> None:
        """Each member: the part of the accepted path that is its own chain, then the rest."""
        path = list(verdict.path) if verdict.path else list(range(verdict.num_accepted))
        committed = accepted_ids(proposal, verdict) + [verdict.token]
        for member, nodes in zip(self.proposing, self.tree.nodes if self.tree else [], strict=True):
            own = 0
            while own < min(len(nodes), len(path)) and nodes[own] == path[own]:
                own += 1
            member.follow(own, committed[own:], extras)

    async def close(self) -> None:
        for member in self.members:
            await member.close()

    def abandon(self) -> None:
        for member in self.members:
            member.abandon()

    def _drop(self, member: Proposer, why: ProposerGone) -> None:
        member.abandon()
        self.members.remove(member)
        if not self.members:
            raise ProposerGone(f"every member of the tree is gone; the last: {why}")
