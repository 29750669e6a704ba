"""A head fed by the target (EAGLE-3's, an MTP module) drafting for one request: its state and its
session (``HeadDrafter``), on a draft worker or in this process.

The verify pass hands the head, with each verdict, the target's aux hidden states of the positions
it committed (``AUX_HIDDEN``); the head holds the request's tokens, its own cache of the positions
the target fed, and drafts a proposal in 1 + (k - 1) passes of one layer: the first over every
position the target fed since the last proposal (their features, each with the token after it),
each later one over the token just drafted with the head's own output before it.

Before the target's first pass there are no hidden states: the first step proposes nothing (the
target-only pass that prefills the prompt also returns them), as vLLM's EAGLE drafts after prefill.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..acceptance import SparseDist
from ..sampling import SamplingParams
from ..batching import Scheduler, advance_all
from ..config import BatchingConfig
from ..drafting import DRAFT_MAX_SUPPORT, DraftTokens, draw, stack_rows
from ..grpc_host import Device
from ..kv_cache import session_capacity
from ..draft_steps import DraftStep
from ..proposing import HiddenRows, ProposerGone
from ..seeds import DraftDraws
from ..sim_device import HEAD, PassShape, held
from ..wire import sampling_from
from .eagle3 import FedHead, HeadCache


class HeadState:
    """One request's tokens and hidden states as a head sees them, and its cache.

    committed   the request's tokens, x_0 .. x_{n-1}
    fed         positions 0 .. fed-1 are in the cache as the target fed them
    features    hidden states of positions fed .. (rows not fed yet), in order
    A proposal is possible when features reach position n-2: each fed position i needs x_{i+1}.
    """

    def __init__(self, head: FedHead, capacity: int, sampling: SamplingParams, draws: DraftDraws,
                 max_support: int = DRAFT_MAX_SUPPORT) -> None:
        self.head = head
        self.cache = HeadCache(head.config, capacity, head.weight.dtype, head.weight.device)
        self.sampling = sampling
        self.draws = draws  # by position (workers/seeds.py)
        self.max_support = max_support
        self.committed: list[int] = []
        self.fed = 0
        self.features: list[torch.Tensor] = []
        self.known = 0  # positions whose hidden states the head holds or has fed
        self.origin = 0  # the first position in its cache: a long prompt's come as its last window
        self.gap = ""  # why it can no longer draft (hidden states missing), once they are

    def commit(self, tokens: Sequence[int]) -> None:
        self.committed += list(tokens)

    def resync(self, proposed: Sequence[int], keep: int, append: Sequence[int]) -> None:
        """Committed becomes the first ``keep`` tokens of committed + ``proposed`` (its last
        proposal), then ``append``: a draft worker's step (see PooledSequence.resync)."""
        held = self.committed + list(proposed)
        if not 1 <= keep <= len(held):
            raise ValueError(f"keep must be 1..{len(held)} (the tokens this session holds), got {keep}")
        if keep - 1 < self.known:  # the hidden states of a position past the kept tokens would not stand
            raise ValueError(f"a head cannot rewind to {keep} tokens: it holds hidden states of {self.known} "
                             f"positions (a head drafts no lookahead)")
        self.committed = held[:keep] + list(append)

    def add(self, hidden: HiddenRows) -> None:
        """The target's hidden states of committed positions; rows held already are skipped (a
        replica that took the request over sends every position again)."""
        if not self.known and hidden.start > 0:  # a long prompt's last positions (proposing.AUX_WINDOW_BYTES)
            self.origin = self.fed = self.known = hidden.start
        if hidden.start > self.known:  # said at the next proposal: a verdict is no place to fail
            self.gap = f"positions {self.known}..{hidden.start - 1} have no hidden states"
            return
        rows = hidden.rows[self.known - hidden.start :]
        if len(rows):
            self.features.append(rows)
            self.known += len(rows)

    def ready(self) -> bool:
        """Whether it can draft: every committed position but the last has its hidden state."""
        if self.gap:
            raise ProposerGone(f"the head cannot draft: {self.gap}")
        if self.known > len(self.committed) - 1:  # out of step: these are not this request's tokens
            raise ProposerGone(f"the head holds hidden states of {self.known} positions for {len(self.committed)} "
                               f"committed tokens")
        return self.known > self.fed and self.known == len(self.committed) - 1

    def draft(self, k: int) -> DraftTokens:
        """Up to ``k`` tokens after the committed ones (call when ``ready``), in passes of its own."""
        return drafted_alone(HeadRun(self, k))


class HeadDrafter:
    """A head's session for one request (a ``Drafter``, workers/drafters.py), on a draft worker or
    in this process: each step brings it to what stands, adds the target's hidden states that came
    with the verdict, and drafts (a ``HeadRun``). It drafts no branch and gives no alternatives."""

    alternatives = False
    branch = None

    def __init__(self, state: HeadState, committed: Sequence[int]) -> None:
        self.state = state
        self.greedy = state.sampling.greedy
        state.commit(committed)
        self.last = DraftTokens.empty()  # the proposal the next step's lengths refer to

    def adopt(self) -> None:
        raise ValueError("a head drafts no branch to adopt")

    def step(self, step: DraftStep) -> HeadRun:
        """The drafting this step asks for (its ``result`` once run). ProposerGone: the hidden states
        it holds do not fit the request's tokens (a worker ends the session: they came wrong)."""
        if step.adopt:
            self.adopt()
        self.state.resync(self.last.ids, step.keep, step.append)
        if step.hidden is not None:
            self.state.add(step.hidden)
        self.last = DraftTokens.empty()  # what stands if the run fails
        return HeadRun(self.state, step.k)

    def proposal(self, run: HeadRun) -> DraftTokens:
        self.last = run.result if run.result is not None else DraftTokens.empty()
        return self.last


def drafted_alone(run: HeadRun) -> DraftTokens:
    """Every pass of a head's ``run`` on its own, a batch of one (in this process)."""
    head = run.state.head
    with torch.inference_mode():
        while run.result is None:
            segment, started = run.plan(2**31), time.perf_counter()
            output = head.step_many([segment.run_on(head)])[0]
            held(head, started, [segment], head_shape)  # on a simulated device, its modelled time
            run.advance(output)
    return run.result


def opened_state(head: FedHead, opened, name: str) -> HeadState:
    """The state a worker's session of ``head`` starts from, as its open message (``pb.SessionOpen``)
    asks: room for the prompt and the tokens still to come, the request's sampling, draws keyed by
    ``name`` (a draft worker's and a target replica's alike)."""
    capacity = session_capacity(len(opened.prompt_ids), opened.max_new_tokens, head.config.max_position_embeddings)
    return HeadState(head, capacity, sampling_from(opened.sampling), DraftDraws(opened.sampling.seed, name))


@dataclass(frozen=True)
class HeadSegment:
    """What one session runs in a pass of heads: ``part`` is (token ids, features, positions, cache)
    for ``FedHead.step_many``; the first pass of a proposal carries the target's aux hidden
    states instead of features (fused on the device, in the pass)."""

    ids: torch.Tensor
    positions: torch.Tensor
    cache: HeadCache
    features: torch.Tensor | None = None
    aux: torch.Tensor | None = None
    region = None  # no KV region of a pool: the cache is the session's own

    @property
    def tokens(self) -> torch.Tensor:  # what a pass's token budget counts
        return self.ids

    def run_on(self, head: FedHead) -> tuple:
        features = head.fuse(self.aux) if self.features is None else self.features
        return self.ids, features, self.positions, self.cache


class HeadRun:
    """Drafting one proposal with a head: first the positions the target fed since the last one
    (their hidden states, each with the token after it; in chunks if a pass has less room), then
    one pass per drafted token (the token and the head's own output before it). The step a batch
    scheduler runs (workers/steps.py); ``HeadState.draft`` runs it alone."""

    def __init__(self, state: HeadState, k: int) -> None:
        self.state, self.k = state, k
        self.tokens: list[int] = []
        self.rows: list[SparseDist] = []
        self.hidden: torch.Tensor | None = None  # the head's output after the last token drawn
        self.planned: HeadSegment | None = None
        self.result: DraftTokens | None = None
        if k < 1 or not state.ready():
            self.result = DraftTokens.empty()
            return
        state.cache.length = state.fed - state.origin  # the last proposal's entries go
        self.aux = torch.cat(state.features)  # positions fed .. known-1
        state.features = []
        self.first = state.fed

    def plan(self, room: int) -> HeadSegment | None:
        """The next pass's rows, at most ``room`` of them (a pure function of the run: asking is free)."""
        state, device = self.state, self.state.cache.keys.device
        if self.hidden is None:  # feeding the target's positions fed..known-1
            done = state.fed - self.first
            n = min(len(self.aux) - done, room)
            if n < 1:
                return None
            ids = torch.tensor(state.committed[state.fed + 1 : state.fed + n + 1], device=device)
            self.planned = HeadSegment(ids, torch.arange(state.fed, state.fed + n), state.cache,
                                       aux=self.aux[done : done + n].to(device))
        elif room < 1:
            return None
        else:
            position = torch.tensor([state.fed + len(self.tokens) - 1])
            self.planned = HeadSegment(torch.tensor(self.tokens[-1:], device=device), position, state.cache,
                                       features=self.hidden[-1:])
        return self.planned

    def advance(self, output: tuple[torch.Tensor, torch.Tensor]) -> bool:
        """The pass ran the planned rows: (logits [T, Vd], hidden [T, H]). True when done."""
        logits, hidden = output
        state = self.state
        if self.hidden is None:
            state.fed += len(self.planned.ids)
            if state.fed < self.first + len(self.aux):  # more of the target's positions to feed
                return False
        u = state.draws.uniform(len(state.committed) + len(self.tokens))
        token, q = draw(state.head.to_target(logits[-1:]), state.sampling, u, state.max_support)
        self.tokens.append(token)
        self.rows.append(q)
        self.hidden = hidden
        if len(self.tokens) == self.k:
            self.result = DraftTokens(self.tokens, stack_rows(self.rows))
            return True
        return False


class HeadScheduler(Scheduler):
    """The continuous batch of one head's sessions on a draft worker: each pass runs every pending
    session's rows through ``FedHead.step_many`` (workers/batching.py does the rest)."""

    def __init__(self, head: FedHead, device: Device, config: BatchingConfig, name: str = "") -> None:
        # no KV pool: each session's cache is its own
        super().__init__(head, None, device, config, timing=device.timing(name, HEAD))

    @torch.inference_mode()
    def _run(self, members: list) -> list:
        return advance_all(members, self.model.step_many([segment.run_on(self.model) for _, segment in members]))

    def _shape(self, segments: list) -> PassShape:
        return head_shape(segments)


def head_shape(segments: Sequence) -> PassShape:
    """A head's pass's shape (workers/sim_device.py) from its sessions' segments (``HeadRun.plan``)."""
    rows = sum(len(s.ids) for s in segments)
    return PassShape(rows, len(segments), sum(int(s.positions[-1]) + 1 for s in segments if len(s.positions)))


@torch.inference_mode()
def score_head(target, head: FedHead, ids: list[int], start: int) -> tuple[int, int]:
    """Full information, as ``drafting.score_continuation`` for a draft model: how many of
    ids[start:] the head's greedy first token would have matched, each drafted from the target's
    hidden states of the verified tokens before it. One target pass and one head pass, no cache kept."""
    if not 2 <= start < len(ids):
        raise ValueError(f"scoring needs a prompt of 2+ tokens and a continuation: start {start} of {len(ids)}")
    out = target(input_ids=torch.tensor([ids], device=target.device), output_hidden_states=True, logits_to_keep=1)
    aux = torch.cat([out.hidden_states[layer][0] for layer in head.config.aux_layers], -1)  # [n, 3Ht]
    cache = HeadCache(head.config, len(ids), head.weight.dtype, head.weight.device)
    # Row i reads x_{i+1} and position i's hidden state and guesses x_{i+2}: rows start-2 .. n-3 guess ids[start:].
    logits, _ = head.step(torch.tensor(ids[1:-1], device=cache.keys.device), head.fuse(aux[:-2]),
                          torch.arange(len(ids) - 2), cache)
    guesses = head.target_ids()[logits[start - 2 :].argmax(-1)].cpu()
    return len(ids) - start, int((guesses == torch.tensor(ids[start:])).sum())
