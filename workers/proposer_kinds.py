"""What a proposer's name makes it: the names the service reserves and the kind each name is.

Plain names and one function, apart from the proposers themselves, so that the configs, the policy
and the command line read them without importing a model (``kind_of`` is the one place a name is
read so).
"""

from __future__ import annotations

from collections.abc import Container
from enum import Enum

NGRAM, SUFFIX = "ngram", "suffix"
DRAFT_FREE = (NGRAM, SUFFIX)
TREE = "tree"  # a task's draft and draft-free proposers at once, as one token tree (workers/token_tree.py)
CASCADE = "cascade"  # a task's draft model with prompt lookup under it (workers/drafting.py)
RESERVED = (*DRAFT_FREE, TREE, CASCADE)  # proposer names no draft model may take
# A version of a draft served beside it (a canary, cluster/canary.py) is named ``draft@version``:
# it drafts as the draft does (same kind, same target layers), from other weights.
VERSION_MARK = "@"


def base_draft(name: str) -> str:
    """The draft a name is a version of (``eagle3@v2`` -> ``eagle3``); a draft's own name is its own."""
    return name.split(VERSION_MARK, 1)[0]


class ProposerKind(Enum):
    DRAFT = "draft"  # a draft model: on a draft worker, or in process
    HEAD = "head"  # an EAGLE-3 head: a draft fed the target's hidden states (workers/heads/)
    # Drafting where the target verifies: Medusa heads guessing in its pass, a head fed by its hidden
    # states drafting after it on the replica (workers/verifier_draft.py)
    ON_VERIFIER = "on_verifier"
    DRAFT_FREE = "draft_free"  # prompt lookup or suffix decoding: no model, wherever the loop runs
    TREE = "tree"  # several of a task's proposers merged into one token tree (workers/token_tree.py)
    CASCADE = "cascade"  # a draft model verifying prompt lookup's guesses as it drafts (workers/drafting.py)


def kind_of(name: str, heads: Container[str] = (), on_verifier: Container[str] = ()) -> ProposerKind:
    """What a proposer's name makes it: the one place a name is read so (``heads``: the names of
    the served heads that draft on draft workers or in process; ``on_verifier``: of those that draft
    where the target verifies: Medusa heads, heads on the replica). The engine and the router build
    each kind their own way; the policy and the scorer price and score by kind."""
    if name in DRAFT_FREE:
        return ProposerKind.DRAFT_FREE
    if name == TREE:
        return ProposerKind.TREE
    if name == CASCADE:
        return ProposerKind.CASCADE
    if name in on_verifier:
        return ProposerKind.ON_VERIFIER
    return ProposerKind.HEAD if base_draft(name) in heads else ProposerKind.DRAFT
