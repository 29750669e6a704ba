"""Token trees on a target replica's session, without Ray: the tree pass, its KV, its verdict.

A tree proposal runs in one pass; each node must get the logits a chain along its path gets, the
accepted path's keys and values must end up where a chain would have put them, and the session
must go on decoding exactly as if it had decoded those tokens one by one.
"""

from __future__ import annotations

import pytest
import torch

from specserve.workers.acceptance import one_hot
from specserve.workers.sampling import SamplingParams
from specserve.workers.drafting import DraftTokens
from specserve.workers.kv_pool import Budget, KVPool, KVShape
from specserve.workers.ragged_pass import PooledSequence, Segment, run_pass, tree_depths
from specserve.workers.steps import private_sequence, run_alone
from specserve.workers.verifying import TargetSession

from cached_lm import CachedLM

PROMPT = list(range(5, 30))
GREEDY = SamplingParams()


@pytest.fixture(scope="module")
def target(tiny_engine):
    return tiny_engine.target


def target_only(model, prompt: list[int], tokens: int) -> list[int]:
    pool, sequence = private_sequence(model, prompt, 256)
    session = TargetSession(sequence, GREEDY, torch.Generator())
    return [run_alone(model, pool, session.step(DraftTokens.empty())).token for _ in range(tokens)]


def test_each_node_of_a_tree_pass_gets_the_logits_of_its_path_as_a_chain(target):
    tokens, parents = [40, 41, 42, 43, 44, 45], [-1, 0, 0, -1, 3, 4]  # 40->{41, 42}; 43->44->45
    pool = KVPool(KVShape.of(target), Budget(2**26))
    region = pool.take(64)
    (logits,) = run_pass(target, pool, [Segment(region, 0, PROMPT + tokens, len(tokens) + 1, parents)])
    for node in range(len(tokens)):
        path, at = [], node
        while at >= 0:
            path.insert(0, tokens[at])
            at = parents[at]
        chain = CachedLM(target).extend(PROMPT + path, 1)[0]
        assert torch.allclose(logits[node + 1], chain, atol=1e-4), node
    assert torch.allclose(logits[0], CachedLM(target).extend(PROMPT, 1)[0], atol=1e-4)
    assert tree_depths(parents) == [0, 1, 1, 0, 1, 2]


@pytest.mark.parametrize("branch", [0, 1], ids=["first branch", "second branch"])
def test_a_greedy_tree_commits_its_right_branch_and_decoding_goes_on_as_target_only(target, branch):
    """Two branches of three: one is the target's own continuation, the other goes wrong at once.
    Whichever comes first, the session keeps the right one (its keys moved into place when it is
    the second) and every later token is target-only decoding's."""
    expected = target_only(target, PROMPT, 12)
    wrong = [(t + 1) % target.config.vocab_size for t in expected[:3]]
    right = expected[:3]
    first, second = (right, wrong) if branch == 0 else (wrong, right)
    tokens, parents = first + second, [-1, 0, 1, -1, 3, 4]
    pool, sequence = private_sequence(target, PROMPT, 256)
    session = TargetSession(sequence, GREEDY, torch.Generator())
    verdict = run_alone(target, pool, session.step(DraftTokens(tokens, one_hot(torch.tensor(tokens)), parents)))
    assert verdict.num_accepted == 3 and verdict.path == ((0, 1, 2) if branch == 0 else (3, 4, 5))
    assert verdict.token == expected[3]
    after = [run_alone(target, pool, session.step(DraftTokens.empty())).token for _ in range(8)]
    assert [*right, verdict.token, *after] == expected


def test_a_sampled_tree_verdict_follows_the_sessions_own_generator(target):
    sampled = SamplingParams(temperature=0.9)
    tokens, parents = [40, 41, 42], [-1, -1, 1]
    verdicts = []
    for _ in range(2):
        pool, sequence = private_sequence(target, PROMPT, 256)
        session = TargetSession(sequence, sampled, torch.Generator().manual_seed(3))
        verdicts.append(run_alone(target, pool, session.step(DraftTokens(tokens, one_hot(torch.tensor(tokens)), parents))))
    assert verdicts[0] == verdicts[1] and all(n in (0, 1, 2) for n in verdicts[0].path)


def test_a_malformed_tree_is_refused_before_it_runs(target):
    pool, sequence = private_sequence(target, PROMPT, 256)
    session = TargetSession(sequence, GREEDY, torch.Generator())
    with pytest.raises(ValueError, match="earlier node"):
        session.step(DraftTokens([1, 2], one_hot(torch.tensor([1, 2])), [1, -1]))
    with pytest.raises(ValueError, match="as many parents"):
        session.step(DraftTokens([1, 2], one_hot(torch.tensor([1, 2])), [-1]))


def test_the_pool_moves_slots_in_every_layer(target):
    pool = KVPool(KVShape.of(target), Budget(2**26))
    region = pool.take(16)
    sequence = PooledSequence(region, [])
    for layer in range(pool.shape.layers):
        pool.keys(region, layer).copy_(torch.arange(16.0).view(1, 16, 1).expand_as(pool.keys(region, layer)))
    pool.move(region, [(5, 2), (9, 3)])
    assert pool.keys(region, 0)[0, :5, 0].tolist() == [0, 1, 5, 9, 4]
    assert sequence.pool is None
