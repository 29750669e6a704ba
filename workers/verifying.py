"""The target side of one session: verify a proposal in one pass and commit the verdict."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import torch

from .acceptance import (SparseDist, Outcome, children_of, verify, verify_greedy, verify_tree, verify_tree_greedy,
                         warp)
from .drafting import DraftTokens
from .grammar import GrammarState
from .logprobs import NO_LOGPROBS, TokenLogprobs, token_logprobs
from .processors import processed
from .pass_hooks import PassHook
from .proposing import NO_EXTRAS, accepted_ids
from .ragged_pass import PooledSequence, Segment
from .sampling import NO_PROCESSING, LogitsProcessing, SamplingParams

NO_PROPOSAL = DraftTokens.empty()
GRAMMAR_ENDED = "grammar"  # Verified.ended, VerifyReply.ended: the grammar could take no further token
log = logging.getLogger("specserve.workers")


class TargetSession:
    """Holds one request's target cache; a proposal of k tokens costs one target pass.

    An empty proposal is plain target-only decoding: the same pass, the same sampling rule.
    """

    def __init__(self, sequence: PooledSequence, sampling: SamplingParams, generator: torch.Generator,
                 hook: PassHook | None = None, logprobs: int | None = None,
                 processing: LogitsProcessing = NO_PROCESSING, output_start: int | None = None,
                 grammar: GrammarState | None = None) -> None:
        """``hook``: what the request's proposer needs of each pass besides the verdict
        (workers/pass_hooks.py: hidden states for a head drafting elsewhere, heads drafting here)."""
        self.sequence = sequence
        # Penalties and a logit bias (workers/processors.py), over the output: the committed tokens
        # from ``output_start`` on (the request's first output token; None: the prompt's end now).
        self.processing = processing
        self.processed = processing.active  # decided once: asked on every pass
        # Structured output (workers/grammar.py): the grammar masks each row after processing, and
        # has consumed the output so far.
        self.grammar = grammar
        # "grammar" once the grammar can take no further token (the text ends there; a reopened
        # session's may be so already).
        self.ended = GRAMMAR_ENDED if grammar is not None and grammar.stuck else ""
        # A greedy verdict reads the argmax alone, unless logprobs, processing or a grammar need the logits.
        self.ids_only = sampling.greedy and logprobs is None and not self.processed and grammar is None
        self.output_start = len(sequence.committed) if output_start is None else output_start
        # The committed tokens' logprobs with this many alternatives each (workers/logprobs.py),
        # handed out once each (``take_logprobs``); None: not asked for.
        self.logprobs = logprobs
        self.committed_logprobs = NO_LOGPROBS
        self.sampling = sampling
        self.generator = generator
        self.hook = hook

    def plan(self, segment: Segment | None) -> Segment | None:
        if segment is not None:
            segment.ids_only = self.ids_only
            segment.aux_layers = self.hook.layers(segment) if self.hook is not None else ()
        return segment

    def passed(self, segment: Segment, proposed: int, kept: Sequence[int]) -> None:
        """The segment ran: its committed rows are all but its last ``proposed``, then the
        proposal's rows ``kept``; the hook takes what it needs of them."""
        if self.hook is not None:
            self.hook.passed(self, segment, proposed, kept)

    def take_extras(self) -> Mapping[str, object]:
        """What the hook took of the passes since the last call (``Verified.extras``)."""
        if self.hook is None:
            return NO_EXTRAS
        return {self.hook.key: self.hook.take()}

    def take_logprobs(self) -> TokenLogprobs | None:
        """The logprobs of the tokens committed since the last call (None: not asked for)."""
        if self.logprobs is None:
            return None
        taken, self.committed_logprobs = self.committed_logprobs, NO_LOGPROBS
        return taken

    def _commit_grammar(self, tokens: list[int]) -> None:
        self.grammar.commit(tokens)
        if why := self.grammar.stuck:  # the next row would allow nothing: the text ends here
            self.ended = GRAMMAR_ENDED
            log.warning("a request's grammar can take no further token (%s): its output ends there", why)

    def _keep_logprobs(self, logits: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
        """The committed ``tokens``' logprobs, each from the logits row that predicted it."""
        if self.logprobs is not None:
            kept = token_logprobs(logits[rows], tokens, self.logprobs)
            self.committed_logprobs = self.committed_logprobs.followed_by(kept)

    def step(self, proposal: DraftTokens) -> VerifyStep:
        if self.grammar is not None and proposal.parents is None:
            # Cut just after the first token the grammar forbids: it is rejected there (p = 0), and
            # kept so that a sampled verdict draws from the residual of the q it came from.
            keep = self.grammar.allowed_prefix(proposal.ids) + 1
            if keep < len(proposal.ids):
                proposal = DraftTokens(proposal.ids[:keep], SparseDist(proposal.q.ids[:keep], proposal.q.probs[:keep]))
        return VerifyStep(self, proposal)

    def decode(self, n: int) -> DecodeRun:
        if self.hook is not None and self.hook.drafts:  # decoding in runs, it drafts no more (target_replica.DecodeRuns)
            self.hook = None
        return DecodeRun(self, n)

    def judge(self, proposal: DraftTokens, logits: torch.Tensor) -> Outcome:
        """The verdict on ``proposal`` from the target's logits after the committed tokens and after
        each proposed one (a chain's [k+1, V]; a token tree's [T+1, V], the root's row then one after
        each node; for a greedy session the pass may give their argmax alone), committed to the
        session. Each row is processed and masked along the tokens before it, then the rejection rule
        judges them. Only the session's own generator draws, so a sampled verdict depends on its
        seed, never on what shared its pass."""
        raw = logits
        if self.processed:  # each row sees the output, then the proposal's tokens on its way there
            output = self.sequence.committed[self.output_start:]
            logits = processed(self.processing, logits, [output + path for path in _row_paths(proposal, len(logits))])
        if self.grammar is not None:
            logits = (self.grammar.mask_chain(logits, proposal.ids) if proposal.parents is None
                      else self.grammar.mask_tree(logits, proposal.ids, proposal.parents))
        verdict = self._verdict(proposal, logits)
        if proposal.parents is None:
            self.sequence.commit(proposal.ids, verdict.num_accepted, verdict.token)
        else:
            self.sequence.commit_path(proposal.ids, verdict.path, verdict.token)
        committed = accepted_ids(proposal, verdict) + [verdict.token]
        if self.grammar is not None:
            self._commit_grammar(committed)
        # Row 0 predicts the first token; row n + 1 what follows the chain's token n (the tree's node n).
        kept = verdict.path if proposal.parents is not None else range(verdict.num_accepted)
        self._keep_logprobs(raw, [0] + [node + 1 for node in kept], committed)
        return verdict

    def _verdict(self, proposal: DraftTokens, logits: torch.Tensor) -> Outcome:
        """The rejection rule on the processed rows: greedy, the target's argmax; sampled, with this
        session's uniforms (workers/acceptance.py)."""
        ids, parents = proposal.ids, proposal.parents
        if self.sampling.greedy:
            if parents is None:
                return verify_greedy(_argmax(logits), torch.tensor(ids, dtype=torch.long))
            tree = verify_tree_greedy(_argmax(logits), ids, parents)
        else:
            uniforms = torch.rand(len(ids) + 1, generator=self.generator)
            if parents is None:
                return verify(warp(logits, self.sampling), torch.tensor(ids, dtype=torch.long), proposal.q, uniforms)
            tree = verify_tree(warp(logits, self.sampling), ids, parents, proposal.q, uniforms)
        return Outcome(len(tree.path), tree.token, tree.path)


def _row_paths(proposal: DraftTokens, rows: int) -> list[list[int]]:
    """The proposal's tokens before each of the pass's rows: a chain's first i at row i; a tree's
    none at its root's row, then at node n's row the path to n, n included."""
    if proposal.parents is None:
        return [list(proposal.ids[:i]) for i in range(rows)]
    paths: list[list[int]] = []
    for node, parent in enumerate(proposal.parents):
        paths.append((paths[parent] if parent >= 0 else []) + [proposal.ids[node]])
    return [[], *paths]


def _argmax(rows: torch.Tensor) -> torch.Tensor:
    """The target's choice per row: given ([rows], the pass took it) or taken here ([rows, V])."""
    return rows if rows.dim() == 1 else rows.argmax(-1)


class VerifyStep:
    """Verifying one proposal: prefill chunks first if the session's prompt needs them, then one pass."""

    def __init__(self, session: TargetSession, proposal: DraftTokens) -> None:
        if proposal.parents is not None and len(proposal.parents) != len(proposal.ids):
            raise ValueError(f"a token tree of {len(proposal.ids)} tokens needs as many parents, got "
                             f"{len(proposal.parents)}")
        if proposal.parents is not None:
            children_of(proposal.parents)  # each parent before its children, or a ValueError here
        self.session = session
        self.proposal = proposal
        self.planned: Segment | None = None
        self.result: Outcome | None = None

    def plan(self, room: int) -> Segment | None:
        ids = self.proposal.ids
        self.planned = self.session.plan(self.session.sequence.segment(ids, len(ids) + 1, room, self.proposal.parents))
        return self.planned

    @property
    def after_pass(self):
        """Once every step of the pass advanced: the work its sessions' hooks share (heads drafting
        here draft for all of them at once)."""
        return self.session.hook.after_pass if self.session.hook is not None else None

    def advance(self, logits: torch.Tensor) -> bool:
        self.session.sequence.ran(self.planned)
        if not self.planned.logits:  # a prefill chunk
            self.session.passed(self.planned, 0, ())
            return False
        self.result = self.session.judge(self.proposal, logits)
        kept = list(self.result.path or range(self.result.num_accepted))
        self.session.passed(self.planned, len(self.proposal.ids), kept)
        return True


class DecodeRun:
    """Target-only decoding of ``n`` tokens, one per pass, as one step: the session stays in every
    pass until they are drawn, instead of sitting out a round trip to its router after each token.
    Each token is the verdict on an empty proposal, so a run draws exactly what ``n`` plain steps
    would; ``verdicts`` grows by one as each pass settles (prefill chunks draw nothing)."""

    def __init__(self, session: TargetSession, n: int) -> None:
        if n < 1:
            raise ValueError(f"a decode run needs at least 1 token, got {n}")
        self.session = session
        self.n = n
        self.planned: Segment | None = None
        self.verdicts: list[Outcome] = []
        self.result: list[Outcome] | None = None

    def extend(self, n: int) -> bool:
        """``n`` more tokens, if the run is still going (call between passes); False when it is
        done, or ``n`` is not a valid grant."""
        if self.result is not None or n < 1:
            return False
        self.n += n
        return True

    def plan(self, room: int) -> Segment | None:
        self.planned = self.session.plan(self.session.sequence.segment((), 1, room))
        return self.planned

    def advance(self, logits: torch.Tensor) -> bool:
        self.session.sequence.ran(self.planned)
        self.session.passed(self.planned, 0, ())
        if not self.planned.logits:  # a prefill chunk
            return False
        self.verdicts.append(self.session.judge(NO_PROPOSAL, logits))
        if len(self.verdicts) < self.n and not self.session.ended:  # ended: the text is over (a grammar's)
            return False
        self.result = self.verdicts
        return True
