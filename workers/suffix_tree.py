"""Suffix decoding (SuffixDecoding, Oliaro et al., NeurIPS 2025; Arctic Inference): drafting from
counts of what followed the context's ending, in this request and in recent outputs of its task.

Glossary
    trie          every substring of up to ``depth`` tokens of the texts it holds, one path each,
                  with a count per node: how many times that substring occurs (a bounded-depth
                  suffix tree, kept in Python dicts)
    match         the longest ending of the request's tokens that the trie holds (its length: the
                  match length); longer matches are surer
    speculation   from the matched node, the most frequent child while its empirical probability
                  (child count / parent count, multiplied along the path) stays above
                  ``min_probability``, for at most ``ceil(spec_factor * match length)`` tokens: the
                  adaptive length (a short match earns a short guess)
    request trie  the request's own prompt and output, grown as tokens are committed
    global trie   the outputs of the task's recent requests, at most ``global_tokens`` tokens of
                  them: the oldest output is taken out (its counts decremented, empty nodes
                  dropped) when a new one would exceed the bound, so memory stays bounded

A speculation is a deterministic function of the committed tokens and of the trie's state when it
is asked, which no draw of this request influenced: its q is one-hot, and acceptance stays exact.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import Field

from .config import FrozenConfig


class SuffixConfig(FrozenConfig):
    """Suffix decoding: how deep its tries go, how far it speculates, how much it remembers."""

    depth: int = Field(24, ge=2, le=256)  # longest substring the tries hold (Arctic Inference's max_tree_depth)
    spec_factor: float = Field(1.0, gt=0)  # a speculation is at most this many tokens per matched token
    min_probability: float = Field(0.1, ge=0, lt=1)  # stop once the path's empirical probability falls below
    # Per task: output tokens the global trie holds. Each adds at most `depth` nodes (~100 bytes
    # each in Python): 32k tokens stay under ~80 MiB per task even with nothing shared.
    global_tokens: int = Field(32_768, ge=0)


@dataclass(eq=False)
class Node:
    count: int = 0
    children: dict[int, Node] = field(default_factory=dict)


class SuffixTrie:
    """Counts of every substring of up to ``depth`` tokens of the sequences added to it."""

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.root = Node()
        self.nodes = 0

    def add(self, tokens: Sequence[int], delta: int = 1) -> None:
        """Count (``delta`` 1) or uncount (-1) every substring of ``tokens`` up to ``depth`` long."""
        for start in range(len(tokens)):
            self._walk(tokens[start : start + self.depth], delta)

    def _walk(self, path: Sequence[int], delta: int) -> None:
        node = self.root
        for token in path:
            child = node.children.get(token)
            if child is None:
                if delta < 0:
                    raise ValueError("uncounting a substring the trie does not hold")
                child = node.children[token] = Node()
                self.nodes += 1
            child.count += delta
            if child.count == 0:  # only an uncount gets here: the whole subtree counted this path alone
                self.nodes -= _size(child)
                del node.children[token]
                return
            node = child

    def find(self, context: Sequence[int]) -> tuple[Node | None, int]:
        """The node of the longest ending of ``context`` (at most ``depth - 1`` tokens, so it can
        have a child) that the trie holds with a follower, and that ending's length; (None, 0) when none.

        The trie holds every substring of what it holds, so if an ending is held, so is every
        shorter one: the longest held ending is found by bisection, O(depth log depth).
        """
        low, high = 0, min(self.depth - 1, len(context))  # the ending of length `low` is held (0: the root)
        while low < high:
            mid = (low + high + 1) // 2
            if self._node(context[len(context) - mid :]) is None:
                high = mid - 1
            else:
                low = mid
        for length in range(low, 0, -1):  # held, but perhaps only at the very end of a text: no follower
            node = self._node(context[len(context) - length :])
            if node.children:
                return node, length
        return None, 0

    def _node(self, path: Sequence[int]) -> Node | None:
        node = self.root
        for token in path:
            node = node.children.get(token)
            if node is None:
                return None
        return node


def _size(node: Node) -> int:
    return 1 + sum(_size(child) for child in node.children.values())


class GrowingTrie(SuffixTrie):
    """A request's trie, grown one committed token at a time: each new token extends the paths of
    the substrings that end just before it (at most ``depth`` of them), O(depth) per token."""

    def __init__(self, depth: int, tokens: Sequence[int] = ()) -> None:
        super().__init__(depth)
        self.tokens: list[int] = []
        self._open: list[Node] = []  # nodes of the substrings ending at the last token, shortest first
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            grown = []
            for node in [self.root, *self._open[: self.depth - 1]]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = Node()
                    self.nodes += 1
                child.count += 1
                grown.append(child)
            self._open = grown
            self.tokens.append(token)

    def find(self, context: Sequence[int]) -> tuple[Node | None, int]:
        """As ``SuffixTrie.find``, for the trie's own tokens as the context: the node of every
        ending is at hand (``_open``), O(depth)."""
        if context is not self.tokens:
            return super().find(context)
        for length in range(min(self.depth - 1, len(self._open)), 0, -1):
            if self._open[length - 1].children:  # it occurred before, and something followed it there
                return self._open[length - 1], length
        return None, 0


def speculate(node: Node, match_length: int, k: int, config: SuffixConfig) -> tuple[list[int], float]:
    """The most frequent path below ``node``, at most ``k`` tokens and the adaptive length, while
    its probability stays above ``min_probability``; with that probability (the path's score)."""
    limit = min(k, math.ceil(config.spec_factor * match_length))
    out, probability = [], 1.0
    while len(out) < limit and node.children:
        token, child = max(node.children.items(), key=lambda item: item[1].count)
        # Over the children's counts, not the node's: the request's own trie counts the context's
        # ending where it ends the request too, where nothing has followed it yet.
        p = child.count / sum(c.count for c in node.children.values())
        if probability * p < config.min_probability:
            break
        probability *= p
        out.append(token)
        node = child
    return out, probability


class TaskOutputs:
    """The global trie of one task: its recent requests' outputs, bounded in tokens."""

    def __init__(self, config: SuffixConfig) -> None:
        self.config = config
        self.trie = SuffixTrie(config.depth)
        self.held: deque[tuple[int, ...]] = deque()
        self.tokens = 0

    def add(self, output: Sequence[int]) -> None:
        """Hold a finished request's output, taking out the oldest ones beyond the bound."""
        output = tuple(output[-self.config.global_tokens :]) if self.config.global_tokens else ()
        if not output:
            return
        while self.held and self.tokens + len(output) > self.config.global_tokens:
            old = self.held.popleft()
            self.trie.add(old, -1)
            self.tokens -= len(old)
        self.trie.add(output)
        self.held.append(output)
        self.tokens += len(output)


class SuffixProposer:
    """Suffix decoding for one request: its own trie, and its task's global one."""

    def __init__(self, tokens: Sequence[int], outputs: TaskOutputs | None, config: SuffixConfig) -> None:
        self.config = config
        self.own = GrowingTrie(config.depth, tokens)
        self.outputs = outputs

    @property
    def tokens(self) -> list[int]:
        return self.own.tokens

    def extend(self, tokens: Sequence[int]) -> None:
        self.own.extend(tokens)

    def propose(self, k: int) -> list[int]:
        """The better-scored speculation of the request's trie and the task's (score: the path's
        probability times its length, the expected tokens it adds)."""
        best: tuple[float, list[int]] = (0.0, [])
        context = self.own.tokens
        for trie in (self.own, self.outputs.trie if self.outputs else None):
            if trie is None or k < 1:
                continue
            node, length = trie.find(context)
            if node is None:
                continue
            tokens, probability = speculate(node, length, k, self.config)
            if tokens and probability * len(tokens) > best[0]:
                best = (probability * len(tokens), tokens)
        return best[1]
