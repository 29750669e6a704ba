"""The speculative loop alone (workers/loop.py): no model, no Ray, no gRPC.

A scripted verifier answers as a target whose greedy continuation is known, so the loop's own
work is what is tested: what it asks for, what it commits and emits, what every proposer is told,
how it goes on target-only when its proposer is gone, and that it frees both sides on cancel.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from specserve.workers.acceptance import Outcome
from specserve.workers.decoding import Decoding
from specserve.workers.draft_length import DraftLength
from specserve.workers.drafting import DraftTokens
from specserve.workers.loop import SpeculativeLoop, run_now
from specserve.workers.proposing import (AUX_HIDDEN, NEEDS_NOTHING, NO_EXTRAS, Committed, Proposer, ProposerGone, Verified,
                                        VerifyNeeds)
from specserve.workers.recording import StatsRecorder
from specserve.workers.request import GenerationParams

PROMPT = [1, 2, 3]
TRUTH = list(range(100, 140))  # the target's greedy continuation


class Tokens:
    """Just enough of a tokenizer for the output assembler."""

    eos_token_id = None

    def decode(self, ids, **_):
        return "".join(f"<{i}>" for i in ids)


class ScriptedVerifier:
    """A greedy target whose output is TRUTH: keeps the proposal's agreeing prefix, then its token."""

    def __init__(self, extras: Mapping[str, object] = NO_EXTRAS) -> None:
        self.committed = 0
        self.asked: list[tuple[list[int], bool, VerifyNeeds]] = []
        self.extras = extras
        self.opened = self.closed = self.abandoned = False

    async def open(self) -> None:
        self.opened = True

    async def verify(self, proposal: DraftTokens, alone: bool, needs: VerifyNeeds) -> Verified:
        self.asked.append((list(proposal.ids), alone, needs))
        accepted = 0
        while accepted < len(proposal.ids) and proposal.ids[accepted] == TRUTH[self.committed + accepted]:
            accepted += 1
        token = TRUTH[self.committed + accepted]
        self.committed += accepted + 1
        return Verified(Outcome(accepted, token), 0.001, self.extras)

    def arrived(self) -> Verified | None:
        return None

    async def close(self) -> None:
        self.closed = True

    def abandon(self) -> None:
        self.abandoned = True


class Scripted(Proposer):
    """Proposes TRUTH where it stands, wrong from position ``wrong_at`` on; gone after ``gone_after`` steps."""

    name = "scripted"

    def __init__(self, wrong_at: int = 99, gone_after: int = 99, needs: VerifyNeeds = NEEDS_NOTHING) -> None:
        self.wrong_at, self.gone_after, self.needs = wrong_at, gone_after, needs
        self.at = 0  # output tokens it has been told are committed
        self.told: list[tuple[int, int, Mapping[str, object]]] = []  # (proposed, accepted, extras) per step
        self.proposed = 0  # its last proposal's length
        self.abandoned = False

    async def propose(self, k: int) -> DraftTokens:
        if len(self.told) >= self.gone_after:
            raise ProposerGone("scripted to go")
        ids = [t if i < self.wrong_at else 0 for i, t in enumerate(TRUTH[self.at : self.at + k])]
        self.proposed = len(ids)
        return DraftTokens.of_ids(ids)

    def commit(self, step: Committed) -> None:
        self.told.append((self.proposed, step.accepted, step.extras))
        self.at += step.accepted + len(step.appended)

    def abandon(self) -> None:
        self.abandoned = True


def make_loop(proposer: Proposer | None, verifier: ScriptedVerifier, max_tokens: int = 20, k: int = 4):
    decoding = Decoding(Tokens(), PROMPT, GenerationParams(max_tokens=max_tokens, k=k), seed=0)
    lost: list[str] = []
    loop = SpeculativeLoop(decoding, verifier, proposer, DraftLength("fixed", k, k), StatsRecorder(decoding.stats),
                           lost=lost.append)
    return loop, decoding, lost


def drain(loop: SpeculativeLoop) -> list[int]:
    async def go():
        return [t async for chunk in loop.run() for t in chunk.token_ids]
    return asyncio.run(go())


@pytest.mark.parametrize("wrong_at", [0, 1, 2, 4])
def test_the_loop_commits_exactly_what_the_verifier_keeps(wrong_at):
    verifier, proposer = ScriptedVerifier(), Scripted(wrong_at=wrong_at)
    loop, decoding, _ = make_loop(proposer, verifier)
    assert drain(loop) == TRUTH[:20]
    # Each step commits the accepted prefix plus one token: (accepted + 1) per pass, k never past the budget.
    per_step = min(wrong_at, 4) + 1
    assert decoding.stats.target_passes == -(-20 // per_step)
    assert all(len(ids) <= 4 and not alone for ids, alone, _ in verifier.asked)
    assert sum(len(ids) for ids, _, _ in verifier.asked) == decoding.stats.proposed
    assert [accepted for _, accepted, _ in proposer.told] == [min(wrong_at, n) for n, _, _ in proposer.told]
    assert verifier.opened and verifier.closed and not verifier.abandoned


def test_proposals_never_draft_past_max_tokens():
    verifier = ScriptedVerifier()
    loop, _, _ = make_loop(Scripted(), verifier, max_tokens=7, k=4)
    assert drain(loop) == TRUTH[:7]
    assert [len(ids) for ids, _, _ in verifier.asked] == [4, 1]  # 5 committed, then 2 left: k = 1


def test_a_proposer_that_is_gone_leaves_the_request_target_only():
    verifier, proposer = ScriptedVerifier(), Scripted(wrong_at=1, gone_after=3)
    loop, _, lost = make_loop(proposer, verifier)
    assert drain(loop) == TRUTH[:20]
    assert lost == ["scripted to go"] and proposer.abandoned and loop.proposer is None
    # From then on every step is target-only, and says so: the verifier may decode ahead.
    assert [alone for _, alone, _ in verifier.asked[3:]] == [True] * (len(verifier.asked) - 3)
    assert not any(ids for ids, _, _ in verifier.asked[3:])


def test_what_a_proposer_needs_is_asked_of_the_verifier_and_handed_back():
    hidden = {AUX_HIDDEN: "the target's states of the committed positions"}
    verifier, proposer = ScriptedVerifier(extras=hidden), Scripted(needs=VerifyNeeds((1, 2)))
    loop, _, _ = make_loop(proposer, verifier)
    drain(loop)
    assert {needs for _, _, needs in verifier.asked} == {VerifyNeeds((1, 2))}
    assert all(extras == hidden for _, _, extras in proposer.told)


def test_a_cancelled_loop_abandons_both_sides():
    verifier, proposer = ScriptedVerifier(), Scripted()

    async def first_chunk():
        loop, _, _ = make_loop(proposer, verifier)
        chunks = loop.run()
        await chunks.__anext__()
        await chunks.aclose()

    asyncio.run(first_chunk())
    assert verifier.abandoned and proposer.abandoned and not verifier.closed


def test_run_now_refuses_a_step_that_waits():
    class Pending:  # what awaiting an I/O future does: hand control to an event loop
        def __await__(self):
            yield "waiting"

    async def waits():
        await Pending()

    with pytest.raises(RuntimeError, match="waited on something"):
        run_now(waits())

    async def returns():
        return 5

    assert run_now(returns()) == 5


def test_merge_shares_deterministic_nodes_and_keeps_sampled_ones_apart():
    from specserve.workers.token_tree import merge

    a, b = DraftTokens.of_ids([5, 6, 7]), DraftTokens.of_ids([5, 6, 9])
    tree = merge([(a, True), (b, True)], max_tokens=24)
    assert tree.proposal.ids == [5, 6, 7, 9] and tree.proposal.parents == [-1, 0, 1, 1]
    assert tree.nodes == [[0, 1, 2], [0, 1, 3]]
    apart = merge([(a, True), (b, False)], max_tokens=24)
    assert apart.proposal.ids == [5, 6, 7, 5, 6, 9] and apart.nodes[1] == [3, 4, 5]
    cut = merge([(a, True), (b, False)], max_tokens=4)
    assert len(cut.proposal.ids) == 4 and cut.nodes[1] == [3]
    one = merge([(a, True), (a, True)], max_tokens=24)
    assert one.proposal.parents is None and one.proposal.ids == [5, 6, 7]  # one chain: no tree


class Told(Proposer):
    """Proposes a fixed chain and keeps what it is told."""

    def __init__(self, name: str, chain: list[int], deterministic: bool = True) -> None:
        self.name, self.chain, self.deterministic = name, chain, deterministic
        self.told: list[Committed] = []

    async def propose(self, k: int) -> DraftTokens:
        return DraftTokens.of_ids(self.chain[:k])

    def commit(self, step: Committed) -> None:
        self.told.append(step)


def test_each_member_of_a_tree_is_told_its_own_part_of_the_path_then_the_rest():
    from specserve.workers.token_tree import TreeProposer

    a, b = Told("a", [5, 6, 7]), Told("b", [5, 8])
    tree = TreeProposer([a, b], max_tokens=24)
    proposal = run_now(tree.propose(3))
    assert proposal.ids == [5, 6, 7, 8] and proposal.parents == [-1, 0, 1, 0]
    tree.commit(Committed((0, 3), (4,), {"x": 1}))  # the path 5, 8, then the target's 4
    assert (a.told[-1].kept, a.told[-1].appended) == ((0,), (8, 4))  # its 5, then b's 8 and the 4
    assert (b.told[-1].kept, b.told[-1].appended) == ((0, 1), (4,))
    assert a.told[-1].extras == {"x": 1} == b.told[-1].extras


def test_a_name_is_built_into_its_proposer_in_one_place():
    from specserve.workers.lookup import DraftFree, LookupProposer
    from specserve.workers.proposer_kinds import ProposerKind
    from specserve.workers.drafting import NO_CASCADE, Cascade
    from specserve.workers.proposers import Proposers
    from specserve.workers.token_tree import TreeProposer

    built: list[tuple[str, ProposerKind, bool, Cascade]] = []

    def model_draft(name: str, kind: ProposerKind, in_tree: bool, cascade: Cascade = NO_CASCADE) -> Proposer:
        built.append((name, kind, in_tree, cascade))
        return Told(name, [1, 2])

    proposers = Proposers(DraftFree(), heads={"h"}, cascade=Cascade(6, 0.2))
    recorder = StatsRecorder(Decoding(Tokens(), PROMPT, GenerationParams(), seed=0).stats)
    lookup = proposers.build("ngram", "t", PROMPT + [9], recorder, model_draft)
    assert isinstance(lookup, LookupProposer) and list(lookup.source.tokens) == PROMPT + [9]
    assert proposers.build("h", "t", PROMPT, recorder, model_draft).name == "h"
    assert built == [("h", ProposerKind.HEAD, False, NO_CASCADE)]
    tree = proposers.build("tree", "t", PROMPT, recorder, model_draft, members=("d", "ngram", "d"))
    assert isinstance(tree, TreeProposer) and [m.name for m in tree.members] == ["d", "ngram"]  # each once
    assert built[-1] == ("d", ProposerKind.DRAFT, True, NO_CASCADE)  # a member: its lookahead drafts no branch
    with pytest.raises(ProposerGone, match="no tree of two or more"):
        proposers.build("tree", "t", PROMPT, recorder, model_draft, members=("d", "d"))
    # A cascade: its draft model, verifying prompt lookup's guesses as it drafts; heads draft otherwise.
    assert proposers.build("cascade", "t", PROMPT, recorder, model_draft, members=("d",)).name == "d"
    assert built[-1] == ("d", ProposerKind.DRAFT, False, Cascade(6, 0.2))
    for members in (("h",), ("ngram",), (), ("d", "e")):
        with pytest.raises(ProposerGone, match="no draft model to cascade"):
            proposers.build("cascade", "t", PROMPT, recorder, model_draft, members=members)
