"""The draft side of one session: propose k tokens and the exact distributions they came from.

A cascade (``Cascade``; proposer ``cascade``, workers/lookup.py): before drafting, prompt lookup
guesses the tokens after the committed ones, and the draft's first pass runs them too, with logits
after each. At each row the draft verifies the guess: one it gives at least ``min_p`` is proposed
as it is (q one-hot: given what stands, the choice is made, whatever the draft would have drawn),
else it draws its own token as a pass of its own would have drawn it (the same uniform at that
position). It goes down the guesses while its token is the guess (a row after a guess it did not
take is never used) and past k (``DraftRun``), then drafts on one pass a token. So what the target
is sent keeps an exact q: lookup's long matches the draft vouches for, whole, and the draft's own
tokens where it does not; at ``min_p`` 1, its own drafting alone, in fewer passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from .acceptance import SparseDist, Outcome, one_hot, sample_sparse, sparsify, warp
from .sampling import SamplingParams
from .grammar import GrammarState
from .kv_cache import BRANCH_ROOM
from .ngram import NgramIndex
from .ragged_pass import PooledSequence, Segment
from .request import MAX_K
from .seeds import DraftDraws
from .sim_device import SimConfig

# The draft samples from its warped distribution truncated to this many tokens. q stays exact (the
# draft samples from the truncation itself) and a proposal stays a few hundred bytes on the wire;
# the mass beyond the top 32 of a small draft is negligible for acceptance.
DRAFT_MAX_SUPPORT = 32
GREEDY = SamplingParams()


@dataclass(frozen=True)
class Cascade:
    """Prompt lookup under a draft model (see the module's docstring): at most ``guesses`` of its
    guesses (0: no cascade) verified in a proposal's first pass, a guess the draft gives at least
    ``min_p`` proposed as it is (q one-hot: given what stands, the choice is made) and the draft's
    own token drawn below it (1: the proposal is the draft's own drafting)."""

    guesses: int = 0
    min_p: float = 1.0


NO_CASCADE = Cascade()


@dataclass(frozen=True)
class Alternative:
    """What the draft gave besides a token it drew: the probability of that token, and its likeliest
    other token and that one's probability (where the target rejects the token, its likeliest
    correction, as far as the draft knows: where a branch forks, router/remote_draft.py)."""

    token_p: float = 1.0
    runner_up: int = -1  # -1: none (a guess, or a distribution with one token)
    runner_up_p: float = 0.0


NO_ALTERNATIVE = Alternative()


@dataclass(frozen=True)
class DraftTokens:
    """A proposal: draft tokens with the exact q each was drawn from (on the wire: ``pb.Proposal``)."""

    ids: list[int]  # [k] proposed tokens
    q: SparseDist  # [k, m] the distribution each was sampled from
    parents: list[int] | None = None  # a token tree: each token's parent (-1: the last committed token); None: a chain
    # The pb.Proposal these came in over a stream, if they did: forwarded to the target as it is, so a
    # remote draft's proposal is not converted back on the per-token path.
    wire: object = field(default=None, compare=False, repr=False)

    @staticmethod
    def empty() -> DraftTokens:
        return DraftTokens([], SparseDist(torch.zeros(0, 1, dtype=torch.long), torch.zeros(0, 1)))

    def first(self, n: int) -> DraftTokens:
        """A chain's first ``n`` tokens, with their q (a prefix of a proposal is one too)."""
        if len(self.ids) <= n:
            return self
        return DraftTokens(self.ids[:n], SparseDist(self.q.ids[:n], self.q.probs[:n]))

    @staticmethod
    def of_ids(ids: Sequence[int], parents: Sequence[int] | None = None) -> DraftTokens:
        """A deterministic proposal: ``ids`` with one-hot q."""
        if not ids:
            return DraftTokens.empty()
        return DraftTokens(list(ids), one_hot(torch.tensor(ids)), None if parents is None else list(parents))


@dataclass(frozen=True)
class Misalignment:
    """A draft's alignment with the target set by hand, on a simulated device (workers/sim_device.py
    ``SimConfig.alignment``): at each position, decided by a draw of its own before the token is,
    the draft drafts from its own distribution with probability ``alignment``, else from that
    distribution shifted by one token id (as sharp, mostly wrong). A draft that is a copy of the
    target is then accepted at about ``alignment`` of its positions. Lossless either way: q is the
    distribution each token was drawn from."""

    alignment: float
    draws: DraftDraws  # keyed apart from the draft's token draws (``of``)

    @staticmethod
    def of(sim: SimConfig | None, draft: str, task: str, seed: int, drawn_as: str = "") -> Misalignment | None:
        """A session's, where ``sim`` (its device's, None on a real one) sets an alignment for ``draft``
        on ``task``; its draws keyed by the request's seed and ``drawn_as`` (default: ``draft``), as
        the draft's own token draws are."""
        alignment = sim.alignment_of(draft, task) if sim is not None else None
        if alignment is None or alignment >= 1.0:
            return None
        return Misalignment(alignment, DraftDraws(seed, f"{drawn_as or draft}:misaligned"))

    def logits(self, logits: torch.Tensor, position: int) -> torch.Tensor:
        return logits if self.draws.uniform(position) < self.alignment else logits.roll(1, -1)


class DraftSession:
    """Proposes continuations of one request's committed tokens with a draft model."""

    def __init__(self, sequence: PooledSequence, sampling: SamplingParams, draws: DraftDraws,
                 max_support: int = DRAFT_MAX_SUPPORT, alternatives: bool = False,
                 grammar: GrammarState | None = None, output_start: int = 0, cascade: Cascade = NO_CASCADE,
                 allowed: torch.Tensor | None = None, misalignment: Misalignment | None = None) -> None:
        self.sequence = sequence
        self.sampling = sampling
        self.draws = draws
        self.max_support = max_support
        self.alternatives = alternatives  # (a softmax over the vocabulary per token: only where branches fork)
        # Structured output (workers/grammar.py): the draft drafts within the grammar, its q masked
        # as the target's p is, over the output from committed[output_start] on. Lossless either way
        # (q is what it sampled from); masked, it no longer proposes what the target must reject.
        self.grammar = grammar
        self.output_start = output_start
        self.cascade = cascade
        # A draft of another tokenizer (workers/token_bridge.py) draws among the tokens it shares
        # with the target: [V] 0 there, -inf elsewhere, added to every row of logits it draws from.
        self.allowed = allowed
        # Its draws are keyed by the target's positions (``keyed_to``): its own positions in the
        # text re-encoded can move back (a merge), and a uniform the verifier examined must never
        # draw again (workers/seeds.py). 0: a draft of the target's tokenizer, the same positions.
        self.position_offset = 0
        self.lookup = NgramIndex() if cascade.guesses else None
        self.misalignment = misalignment  # on a simulated device, an alignment set by hand

    def guesses(self, k: int) -> list[int]:
        """Up to ``cascade.guesses`` tokens prompt lookup guesses after the committed ones (fewer
        than MAX_K): the cascade's cheaper level, which the first pass verifies."""
        if self.lookup is None or k < 1:
            return []
        committed, held = self.sequence.committed, self.lookup.tokens
        if len(held) > len(committed) or committed[: len(held)] != held:  # rewound: index again
            self.lookup = NgramIndex(committed, self.lookup.config)
        else:
            self.lookup.extend(committed[len(held) :])
        return self.lookup.propose(min(MAX_K - 1, self.cascade.guesses))

    def step(self, k: int, min_confidence: float = 0.0, min_tokens: int = 1, guess: bool = False) -> DraftRun:
        """Up to k tokens; with `min_confidence`, stop after a token (past the first `min_tokens`)
        the draft gave less probability than that. The stopping rule looks at the draft's own
        draws only, so the verified output keeps the target's distribution. ``guess``: the first
        token is the draft's guess of the target's own next token (its argmax, sampled or not),
        drafted ahead from, never proposed."""
        return DraftRun(self, k, min_confidence, min_tokens, guess)

    def commit(self, proposal: DraftTokens, verdict: Outcome) -> None:
        """Take the verifier's verdict: keep the accepted prefix, drop the rest of the cache."""
        self.sequence.commit(proposal.ids, verdict.num_accepted, verdict.token)

    def resync(self, proposal: DraftTokens | None, keep: int, append: list[int]) -> None:
        """The router's word on what stands (see PooledSequence.resync)."""
        self.sequence.resync(proposal.ids if proposal else [], keep, append)

    def draw(self, logits: torch.Tensor, position: int) -> tuple[int, SparseDist]:
        """``position``: in its own tokens; drawn with the uniform of the target position it stands for."""
        return draw(logits, self.sampling, self.draws.uniform(position + self.position_offset), self.max_support)

    def keyed_to(self, target_length: int) -> None:
        """Its committed tokens stand for the target's first ``target_length`` (a draft of another
        tokenizer, after each re-encoding): the next token it draws is the target's next position's."""
        self.position_offset = target_length - len(self.sequence.committed)

    def constrain(self, logits: torch.Tensor, drafted: Sequence[int], fork: int | None = None) -> torch.Tensor:
        """The logits [1, V] of the token after the committed tokens (the first ``fork`` of them,
        for a branch) and ``drafted``, masked to what the grammar allows there (as they are
        without one, or where ``drafted`` already left it), and to the tokens it ``allowed``; shifted
        first where its ``misalignment`` says so."""
        if self.misalignment is not None:
            before = len(self.sequence.committed) if fork is None else fork
            logits = self.misalignment.logits(logits, before + len(drafted) + self.position_offset)
        if self.allowed is not None:
            if self.allowed.device != logits.device:  # moved once, not a copy per token
                self.allowed = self.allowed.to(logits.device)
            logits = logits + self.allowed
        if self.grammar is None:
            return logits
        committed = self.sequence.committed[self.output_start:fork]
        if not self.grammar.sync(list(committed) + list(drafted)) or self.grammar.stuck:
            return logits
        return self.grammar.mask_next(logits)

    def stops(self, logits: torch.Tensor, token: int, q: SparseDist, drawn: int, k: int, min_confidence: float,
              min_tokens: int) -> bool:
        """After its ``drawn``-th token, does a run of at most k tokens stop? At k, or (past
        ``min_tokens``) after a token the draft gave less than ``min_confidence``: the rule looks
        at the draft's own draws only, so the verified output keeps the target's distribution."""
        confident = (not min_confidence or drawn < min_tokens
                     or self.confidence(logits, token, q) >= min_confidence)
        return drawn >= k or not confident

    def alternative(self, logits: torch.Tensor, token: int, q: SparseDist) -> Alternative:
        """The draft's likeliest token other than ``token``: of its plain softmax under greedy, of
        the distribution it sampled from otherwise (NO_ALTERNATIVE where the session reports none)."""
        if not self.alternatives:
            return NO_ALTERNATIVE
        if self.sampling.greedy:
            top = torch.softmax(logits[0].float(), dim=-1).topk(2)
            return Alternative(float(top.values[0]), int(top.indices[1]), float(top.values[1]))
        probs, ids = q.probs[0], q.ids[0]
        token_p = float(probs[ids == token].sum())
        others = probs.masked_fill(ids == token, -1.0)
        best = int(others.argmax())
        if float(others[best]) <= 0.0:
            return Alternative(token_p)
        return Alternative(token_p, int(ids[best]), float(others[best]))

    def confidence(self, logits: torch.Tensor, token: int, q: SparseDist) -> float:
        """The probability the draft gave its token: of its plain softmax under greedy (where q is
        one-hot), of the distribution it sampled from otherwise."""
        if self.sampling.greedy:
            return float(torch.softmax(logits[0].float(), dim=-1)[token])
        return float(q.probs[q.ids == token].sum())


class Drafted:
    """What a run of drafting holds (a proposal's tokens, their q, the draft's alternatives) and its
    stopping rule, shared by a chain (DraftRun) and a branch (BranchRun)."""

    def __init__(self, session: DraftSession, k: int, min_confidence: float, min_tokens: int) -> None:
        self.session = session
        self.k = k
        self.min_confidence = min_confidence
        self.min_tokens = min_tokens
        self.ids: list[int] = []
        self.rows: list[SparseDist] = []
        self.alternatives: list[Alternative] = []  # one per token of ids
        self.result: DraftTokens | None = None

    def so_far(self) -> DraftTokens:
        """Its proposal: the result, or the tokens drafted before it was stopped."""
        return self.result if self.result is not None else DraftTokens(list(self.ids), stack_rows(self.rows))

    def took(self, logits: torch.Tensor, token: int, q: SparseDist, alternative: Alternative) -> bool:
        """Keep a token drawn from ``logits``; True (the result set) when the run stops after it."""
        self.ids.append(token)
        self.rows.append(q)
        self.alternatives.append(alternative)
        if not self.session.stops(logits, token, q, len(self.ids), self.k, self.min_confidence, self.min_tokens):
            return False
        self.result = DraftTokens(self.ids, stack_rows(self.rows))
        return True


class DraftRun(Drafted):
    """Drafting one proposal, one pass per token: the first runs what the cache lacks (the verdict's
    tokens, or the prompt, in chunks if long) and a cascade's guesses, each later one the token
    drawn last.

    A cascade's proposal may run past k: a guess the draft takes (``min_p``'s choice, or its own draw
    where that is the guess) is a token two proposers agree on, and the draft goes on down the
    guesses it takes (up to ``longest`` tokens; the stopping rule reads the draft's draws and the
    lookup's guesses, both given by what stands, so q stays exact)."""

    def __init__(self, session: DraftSession, k: int, min_confidence: float, min_tokens: int,
                 guess: bool = False) -> None:
        super().__init__(session, k, min_confidence, min_tokens)
        self.guess = guess
        self.planned: Segment | None = None
        self.guesses = session.guesses(k)  # the first pass's, after the committed tokens
        # Its tokens at most: as far as the guesses it takes reach, or k where something else is
        # written past them (``within``).
        self.longest = MAX_K
        if k < 1:
            self.result = DraftTokens.empty()

    def within(self, tokens: int) -> None:
        """Write no more than ``tokens`` past the committed ones (a branch's region starts there,
        workers/draft_worker.py): at most that many drawn, and the guesses the first pass runs cut
        to fit before it."""
        self.longest = min(self.longest, tokens)
        self.guesses = self.guesses[: max(0, tokens - 1)]

    def plan(self, room: int) -> Segment | None:
        extra = self.ids[-1:] if self.ids else self.guesses
        self.planned = self.session.sequence.segment(extra, 1 + len(self.guesses) * (not self.ids), room)
        return self.planned

    def advance(self, logits: torch.Tensor) -> bool:
        """The pass's rows: one, or on a cascade's first pass one and one after each guess."""
        session = self.session
        session.sequence.ran(self.planned)
        if not self.planned.logits:  # a prefill chunk
            return False
        guesses = self.guesses if len(logits) > 1 else []
        done = self._draw(logits[:1], guesses[:1])
        for row, guess in enumerate(guesses, start=1):
            if done or self.ids[-1] != guess:  # the rows past a guess it did not draw read another context
                break
            done = self._draw(logits[row : row + 1], guesses[row : row + 1])
        # The cache holds the committed tokens and the drawn ones but the last: no guess past them.
        sequence = session.sequence
        sequence.length = min(sequence.length, len(sequence.committed) + len(self.ids) - 1)
        return done

    def _draw(self, logits: torch.Tensor, next_guess: list[int] = ()) -> bool:
        """The next token from its row of logits [1, V], drawn as a pass of its own would draw it;
        where it is ``next_guess``, the run may go one token past k (the pass holds that row)."""
        session = self.session
        logits = session.constrain(logits, self.ids)
        if self.guess and not self.ids:  # the likeliest target token: a hit is likelier than on a sample
            token, q = draw(logits, GREEDY, 0.0, session.max_support)
            alternative = NO_ALTERNATIVE  # never proposed: nothing to fork at
        else:
            token, q = session.draw(logits, len(session.sequence.committed) + len(self.ids))
            alternative = session.alternative(logits, token, q)
            # Decided before looking at the draw: taken whatever it drew, so q is one-hot exactly.
            # Never one it cannot draw (a grammar's or a bridge's mask, or outside its support).
            if next_guess and 0.0 < (p := session.confidence(logits, next_guess[0], q)) and p >= session.cascade.min_p:
                token, q, alternative = next_guess[0], one_hot(torch.tensor([next_guess[0]])), NO_ALTERNATIVE
        if next_guess and token == next_guess[0]:
            self.k = max(self.k, min(len(self.ids) + 2, self.longest))
        return self.took(logits, token, q, alternative)


class BranchRun(Drafted):
    """Drafting a branch beside a lookahead (SSD): the proposal the draft would draft afresh had the
    verdict committed the session's first ``fork`` tokens and then ``token`` (a rejection there,
    and the correction the router expects). Its tokens are ``token`` (never proposed, as a
    lookahead's guess) then up to k - 1 drawn, each at its own position's uniform, so a branch the
    router uses is token for token and q for q the fresh draft. They are written apart, past what the
    lookahead writes (``Segment.fork``; the region's STEP_ROOM holds them), in the same passes as
    the lookahead; adopting the branch moves them into place (``PooledSequence.adopt``)."""

    def __init__(self, session: DraftSession, fork: int, token: int, k: int, min_confidence: float,
                 min_tokens: int, reach: int) -> None:
        sequence = session.sequence
        # Its tokens go just past the lookahead's ``reach`` (the slots it may write): attention over
        # a branch spans the slots up to it, so the nearer, the narrower (a gathered pass pads every
        # row of its group to the widest). Moving into place, its slots never overlap their targets.
        self.base = max(reach, fork + k)
        if not 1 <= fork <= sequence.length or k > BRANCH_ROOM or self.base + k > sequence.region.capacity:
            raise ValueError(f"a branch forks within the cache's {sequence.length} written positions and drafts "
                             f"at most {BRANCH_ROOM} tokens within the region's {sequence.region.capacity}: fork "
                             f"{fork}, k {k} from slot {self.base}")
        super().__init__(session, k, min_confidence, min_tokens)
        self.fork = fork
        self.ids, self.rows, self.alternatives = [token], [one_hot(torch.tensor([token]))], [NO_ALTERNATIVE]
        self.written = 0  # of its tokens, in the region from ``base``
        if k < 2:
            self.result = self.so_far()

    def plan(self, room: int) -> Segment | None:
        if room < 1:
            return None
        start = self.base + self.written
        return Segment(self.session.sequence.region, start, self.ids[-1:], 1, fork=(self.fork, self.base))

    def advance(self, logits: torch.Tensor) -> bool:
        self.written += 1
        logits = self.session.constrain(logits, self.ids, self.fork)
        token, q = self.session.draw(logits, self.fork + len(self.ids))
        return self.took(logits, token, q, self.session.alternative(logits, token, q))

    def adopt(self) -> DraftTokens:
        """The router used this branch: the session holds its fork's tokens, then the branch (its
        written tokens' keys and values moved into place). Its tokens, as the session's last proposal."""
        self.session.sequence.adopt(self.fork, self.base, self.written)
        return self.so_far()


def draw(logits: torch.Tensor, sampling: SamplingParams, u: float, max_support: int) -> tuple[int, SparseDist]:
    """A draft's token from its logits [1, V], and the exact q it was drawn from: its argmax
    (one-hot q) under greedy, else the sample at uniform ``u`` from its warped distribution cut to
    ``max_support``."""
    if sampling.greedy:
        token = logits[0].argmax()
        return int(token), one_hot(token)
    q = sparsify(warp(logits, sampling), max_support)
    return sample_sparse(q, u), q


def score_continuation(model: PreTrainedModel, ids: list[int], start: int) -> tuple[int, int]:
    """Full information (HedgeSpec): how many of ids[start:] the draft's greedy choice would have
    matched, each given the verified tokens before it. One teacher-forced pass, no cache."""
    if not 1 <= start < len(ids):
        raise ValueError(f"scoring needs a prompt and a continuation: start {start} of {len(ids)} tokens")
    with torch.inference_mode():
        logits = model(torch.tensor([ids], device=model.device)).logits[0]  # [n, V]
    guesses = logits[start - 1 : -1].argmax(dim=-1).cpu()  # [n - start]: the choice before each verified token
    positions = len(ids) - start
    return positions, int((guesses == torch.tensor(ids[start:])).sum())


def stack_rows(rows: list[SparseDist]) -> SparseDist:
    """Rows [1, m_i] as one [n, max m_i], padded with probability 0 (a lookahead's one-hot guess
    beside its sampled rows; a token tree's members' rows)."""
    if not rows:
        return DraftTokens.empty().q
    width = max(row.ids.shape[-1] for row in rows)
    if all(row.ids.shape[-1] == width for row in rows):  # on the CPU: a tree's rows come from several devices
        return SparseDist(torch.cat([r.ids.cpu() for r in rows]), torch.cat([r.probs.cpu() for r in rows]))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    probs = torch.zeros(len(rows), width, dtype=rows[0].probs.dtype)
    for i, row in enumerate(rows):
        ids[i, : row.ids.shape[-1]] = row.ids[0].cpu()
        probs[i, : row.probs.shape[-1]] = row.probs[0].cpu()
    return SparseDist(ids, probs)
