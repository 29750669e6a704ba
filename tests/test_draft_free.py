"""The draft-free proposers' algorithms, without models: prompt lookup (n-gram index) and suffix
decoding (bounded-depth suffix tries, adaptive length, a memory-bounded global trie per task)."""

from __future__ import annotations

import random

import pytest

from specserve.workers.lookup import DraftFree
from specserve.workers.ngram import NgramConfig, NgramIndex
from specserve.workers.suffix_tree import GrowingTrie, SuffixConfig, SuffixProposer, SuffixTrie, TaskOutputs


def test_ngram_proposes_what_followed_the_longest_matching_ending():
    tokens = [1, 2, 3, 9, 9, 2, 3, 4, 5, 1, 2, 3]
    index = NgramIndex(tokens, NgramConfig(min_n=1, max_n=3))
    # [1, 2, 3] occurred at 0..2, followed by 9; [2, 3] last occurred at 5..6, followed by 4: longest wins.
    assert index.match() == (3, 3) and index.propose(3) == [9, 9, 2]
    assert NgramIndex(tokens, NgramConfig(min_n=1, max_n=2)).propose(2) == [4, 5]  # the latest [2, 3]
    assert NgramIndex([1, 2, 3, 4], NgramConfig(min_n=2, max_n=3)).propose(4) == []  # nothing repeats
    assert index.propose(0) == []


def test_ngram_continues_a_periodic_text_past_its_end():
    assert NgramIndex([7, 8, 7, 8]).propose(5) == [7, 8, 7, 8, 7]


def test_ngram_index_grown_token_by_token_equals_one_built_at_once():
    rng = random.Random(0)
    tokens = [rng.randrange(6) for _ in range(300)]
    grown = NgramIndex()
    for i, token in enumerate(tokens):
        grown.extend([token])
        assert grown.propose(4) == NgramIndex(tokens[: i + 1]).propose(4) == _brute_ngram(tokens[: i + 1], 2, 4, 4)


def _brute_ngram(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    """The plain search: longest ending n-gram, latest earlier occurrence, what followed it."""
    for n in range(min(max_n, len(tokens)), min_n - 1, -1):
        ending = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == ending:
                extended = list(tokens)
                for j in range(k):
                    extended.append(extended[start + n + j])
                return extended[len(tokens) :]
    return []


def test_suffix_trie_counts_every_substring_up_to_its_depth():
    trie = SuffixTrie(depth=3)
    trie.add([1, 2, 1, 2])
    one_two = trie.root.children[1].children[2]
    assert trie.root.children[1].count == 2 and one_two.count == 2 and one_two.children[1].count == 1
    assert 2 not in one_two.children[1].children  # depth 3: [1, 2, 1, 2] itself is not held
    grown = GrowingTrie(3, [1, 2, 1, 2])
    assert _shape(grown.root) == _shape(trie.root) and grown.nodes == trie.nodes


def _shape(node) -> dict:
    return {token: (child.count, _shape(child)) for token, child in node.children.items()}


def test_suffix_finds_the_longest_match_and_guesses_as_far_as_it_earns():
    config = SuffixConfig(spec_factor=1.0, min_probability=0.0)
    outputs = TaskOutputs(config)
    outputs.add([5, 6, 7, 8, 9, 10, 11])
    # The context ends in [6, 7]: a match of 2 earns a guess of 2 tokens (spec_factor 1).
    assert SuffixProposer([1, 6, 7], outputs, config).propose(8) == [8, 9]
    assert SuffixProposer([5, 6, 7], outputs, config).propose(8) == [8, 9, 10]  # matched 3: 3 tokens
    assert SuffixProposer([5, 6, 7], outputs, config).propose(2) == [8, 9]  # never past k
    assert SuffixProposer([42], outputs, config).propose(8) == []  # no match


def test_suffix_follows_the_most_frequent_branch_while_it_is_probable():
    config = SuffixConfig(spec_factor=4.0, min_probability=0.5)
    outputs = TaskOutputs(config)
    for tail in ([3, 4], [3, 4], [3, 9]):
        outputs.add([1, 2, *tail])
    # After [1, 2]: 3 always (p 1), then 4 two times in three (p 2/3, path 2/3), then nothing more.
    assert SuffixProposer([1, 2], outputs, config).propose(8) == [3, 4]
    assert SuffixProposer([1, 2], outputs, SuffixConfig(spec_factor=4.0, min_probability=0.7)).propose(8) == [3]


def test_suffix_prefers_the_requests_own_text_when_it_scores_higher():
    config = SuffixConfig(min_probability=0.0)
    outputs = TaskOutputs(config)
    outputs.add([1, 2, 3, 50])
    own = SuffixProposer([1, 2, 3, 60, 61, 62, 0, 1, 2, 3], outputs, config)
    assert own.propose(3) == [60, 61, 62]  # its own [1, 2, 3] was followed by 60 61 62


def test_the_global_trie_stays_within_its_token_budget_and_forgets_exactly():
    config = SuffixConfig(depth=8, global_tokens=100)
    outputs = TaskOutputs(config)
    rng = random.Random(1)
    for _ in range(50):
        outputs.add([rng.randrange(20) for _ in range(rng.randrange(10, 40))])
        assert outputs.tokens <= 100 and outputs.trie.nodes <= 100 * config.depth
    fresh = SuffixTrie(config.depth)  # what it holds equals a trie of the outputs it still holds
    for output in outputs.held:
        fresh.add(output)
    assert _shape(outputs.trie.root) == _shape(fresh.root) and outputs.trie.nodes == fresh.nodes
    outputs.add([1] * 500)  # longer than the budget: its last 100 tokens, alone
    assert outputs.tokens == 100 and len(outputs.held) == 1


def test_configs_refuse_nonsense():
    with pytest.raises(ValueError, match="min_n"):
        NgramConfig(min_n=5, max_n=2)
    with pytest.raises(ValueError):
        SuffixConfig(depth=1)


def test_scoring_counts_a_position_without_a_proposal_as_a_miss():
    draft_free = DraftFree(ngram=NgramConfig(min_n=1, max_n=2))
    # Prompt [1, 2]; output 1 2 1 2: nothing has followed a 2 yet (a miss), then each guess is right.
    assert draft_free.score("ngram", "t", [1, 2], [1, 2, 1, 2]) == (4, 3, 3)
    assert draft_free.score("ngram", "t", [1, 2], [3, 4]) == (2, 0, 0)
    assert draft_free.score("ngram", "t", [1, 2, 1], [5]) == (1, 1, 0)  # proposed 2, wrong
    with pytest.raises(ValueError, match="not a draft-free proposer"):
        draft_free.score("nope", "t", [1], [2])


def test_both_ways_of_finding_the_longest_match_agree():
    """A request's own trie finds the context's ending from the nodes it keeps (O(depth)); any trie
    by bisection over the ending's length (O(depth log depth)); a plain walk of every length is the
    reference."""
    rng = random.Random(3)
    for depth in (2, 4, 9):
        own = GrowingTrie(depth)
        for _ in range(200):
            own.extend([rng.randrange(4)])
            reference = next(((length, node) for length in range(min(depth - 1, len(own.tokens)), 0, -1)
                              if (node := own._node(own.tokens[-length:])) is not None and node.children), (0, None))
            assert own.find(own.tokens)[::-1] == reference
            assert SuffixTrie.find(own, list(own.tokens))[::-1] == reference
