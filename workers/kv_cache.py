"""How many KV positions a session reserves (``session_capacity``): its prompt, what it may commit
and the step in flight. The positions live in the worker's pool (``kv_pool.py``); the
single-sequence cache the batched pass is checked against is a test's (``tests/cached_lm.py``).
"""

from __future__ import annotations

from .request import MAX_K

# Beyond its committed tokens a cache holds the step in flight: a proposal under verification and,
# on a draft, the lookahead drafted past it (k + 1 tokens each at most) and, past those, a branch
# drafted for another verdict (workers/drafting.py BranchRun: its first token and up to MAX_K - 1
# drafted after it are written, the last one drafted never is).
BRANCH_ROOM = MAX_K + 1
STEP_ROOM = 2 * (MAX_K + 1) + BRANCH_ROOM


def session_capacity(prompt_tokens: int, max_new_tokens: int, context_window: int) -> int:
    """Positions a session's cache may need: its prompt, every token it may commit (unknown, 0:
    up to the context window) and the step in flight."""
    committed = prompt_tokens + max_new_tokens if max_new_tokens else max(prompt_tokens, context_window)
    return committed + STEP_ROOM
