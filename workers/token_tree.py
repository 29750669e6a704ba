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

from collections.abc import Sequence
from dataclasses import dataclass

from .acceptance import SparseDist
from .drafting import DraftTokens, stack_rows
from .proposer_kinds import TREE
from .proposing import NEEDS_NOTHING, Committed, Proposer, ProposerGone, VerifyNeeds

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
        self.tree: MergedTree | None = None
        self.proposing: list[Proposer] = []  # the members of the last tree, in its order

    @property
    def needs(self) -> VerifyNeeds:
        needs = NEEDS_NOTHING
        for member in self.members:
            needs = needs.with_(member.needs)
        return needs

    async def propose(self, k: int) -> DraftTokens:
        chains = []
        for member in list(self.members):
            try:
                chains.append((member, await member.propose(k)))
            except ProposerGone as exc:
                self._drop(member, exc)
        self.proposing = [member for member, _ in chains]
        self.tree = merge([(chain, member.deterministic) for member, chain in chains], self.max_tokens)
        return self.tree.proposal

    def commit(self, step: Committed) -> None:
        """Each member: the part of the accepted path that is its own chain, then the rest."""
        committed = step.ids(self.tree.proposal) if self.tree else list(step.appended)
        for member, nodes in zip(self.proposing, self.tree.nodes if self.tree else [], strict=True):
            own = 0
            while own < min(len(nodes), len(step.kept)) and nodes[own] == step.kept[own]:
                own += 1
            member.commit(Committed(tuple(range(own)), tuple(committed[own:]), step.extras))

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
