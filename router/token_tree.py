"""Several proposers at once: their proposals merged into one token tree, verified in one pass.

Each member (the task's draft model, prompt lookup, suffix decoding) proposes its chain as it
would alone; the chains are merged into a trie, so a token two of them agree on is one node, and
the target verifies the whole tree in one pass (workers/ragged_pass.py: a tree attention mask) and
keeps its longest accepted path (greedy) or the path recursive rejection walks (sampling:
workers/acceptance.py ``verify_tree``). Every member then learns what was committed: how much of its
own chain, and which tokens followed.

Merging is lossless only between candidates drawn independently of each other: deterministic ones
(one-hot q: the draft-free proposers, and a greedy draft model) merge with each other; a sampled
draft's tokens never merge, each keeps its own node (recursive rejection handles a sibling that
repeats a token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specserve.proto.v1 import internal_pb2 as pb

from .model_draft import ModelDraft
from .proposers import DRAFT_FREE, TREE, DraftFree, Proposer, ProposerGone

if TYPE_CHECKING:
    from .session import Session


def proposal_depth(proposal: pb.Proposal) -> int:
    """The longest path a proposal offers: its length (a chain), or its tree's depth."""
    depths: list[int] = []
    for parent in proposal.parents:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return max(depths, default=0) if proposal.parents else len(proposal.ids)


def accepted_ids(proposal: pb.Proposal, verdict: pb.Verdict) -> list[int]:
    """The proposal's tokens the verdict kept, in order."""
    if verdict.path:
        return [proposal.ids[node] for node in verdict.path]
    return list(proposal.ids[: verdict.num_accepted])


@dataclass
class MergedTree:
    proposal: pb.Proposal  # ids, parents (empty when the tree is one chain), q (rows only when sampling)
    nodes: list[list[int]]  # per chain, its tokens' nodes in the tree


def merge(chains: Sequence[pb.Proposal], greedy: bool, max_tokens: int) -> MergedTree:
    """One tree of the chains, the first chain's tokens first, at most ``max_tokens`` nodes (a chain
    is cut where the tree is full). A chain with q rows (a sampled draft's) shares no node."""
    ids: list[int] = []
    parents: list[int] = []
    rows: list[pb.SparseRow] = []
    shared: dict[tuple[int, int], int] = {}  # (parent node, token) -> node, among deterministic ones
    nodes: list[list[int]] = []
    for chain in chains:
        deterministic = greedy or not chain.q
        parent, mine = -1, []
        for i, token in enumerate(chain.ids):
            node = shared.get((parent, token)) if deterministic else None
            if node is None:
                if len(ids) == max_tokens:
                    break
                node = len(ids)
                ids.append(token)
                parents.append(parent)
                rows.append(chain.q[i] if chain.q else pb.SparseRow(ids=[token], probs=[1.0]))
                if deterministic:
                    shared[(parent, token)] = node
            mine.append(node)
            parent = node
        nodes.append(mine)
    one_chain = parents == list(range(-1, len(ids) - 1))
    proposal = pb.Proposal(ids=ids, parents=[] if one_chain else parents, q=[] if greedy else rows)
    return MergedTree(proposal, nodes)


class TreeProposer(Proposer):
    """Its members' proposals as one tree; a member that is gone (its draft worker lost) is dropped."""

    name = TREE

    def __init__(self, session: Session, members: list[Proposer], max_tokens: int) -> None:
        self.session = session
        self.members = members
        self.max_tokens = max_tokens
        self.chains: dict[int, pb.Proposal] = {}  # id(member) -> its last chain
        self.tree: MergedTree | None = None
        self.proposing: list[Proposer] = []  # the members of the last tree, in its order

    @property
    def reopens(self) -> int:
        return sum(member.reopens for member in self.members)

    @property
    def misses(self) -> int:
        return sum(member.misses for member in self.members)

    async def open(self) -> None:
        for member in list(self.members):
            try:
                await member.open()
            except ProposerGone as exc:
                self._drop(member, exc)

    async def propose(self, k: int) -> pb.Proposal:
        chains = []
        for member in list(self.members):
            try:
                chains.append((member, await member.propose(k)))
            except ProposerGone as exc:
                self._drop(member, exc)
        self.proposing = [member for member, _ in chains]
        self.chains = {id(member): chain for member, chain in chains}
        self.tree = merge([chain for _, chain in chains], self.session.params.sampling.greedy, self.max_tokens)
        return self.tree.proposal

    def draft_ahead(self, proposal: pb.Proposal) -> None:
        for member in self.members:
            member.draft_ahead(self.chains.get(id(member), pb.Proposal()))

    def commit(self, proposal: pb.Proposal, verdict: pb.Verdict) -> None:
        """Each member: the part of the accepted path that is its own chain, then the rest."""
        path = list(verdict.path) if verdict.path else list(range(verdict.num_accepted))
        committed = accepted_ids(proposal, verdict) + [verdict.token]
        for member, nodes in zip(self.proposing, self.tree.nodes if self.tree else [], strict=True):
            own = 0
            while own < min(len(nodes), len(path)) and nodes[own] == path[own]:
                own += 1
            member.follow(own, committed[own:])

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


@dataclass
class Proposers:
    """How a session gets the proposer its route names: a draft model, a draft-free proposer, or
    the tree of a task's proposers (``trees``: task -> its members, its draft first)."""

    draft_free: DraftFree
    trees: dict[str, tuple[str, ...]]
    tree_max_tokens: int = 24

    def make(self, name: str, session: Session) -> Proposer:
        if name in DRAFT_FREE:
            return self.draft_free.proposer(name, session)
        if name == TREE:
            members = self.trees.get(session.task.task) or ()
            if len(members) < 2:
                raise ProposerGone(f"task {session.task.task!r} has no tree of proposers (its members: {members})")
            return TreeProposer(session, [self.make(m, session) for m in members], self.tree_max_tokens)
        return ModelDraft(session, name)
