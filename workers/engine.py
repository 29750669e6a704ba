"""The in-process speculative decoder: the loop (loop.py) over local models.

The same loop runs in the service (router/request.py) with a target replica's stream as its
verifier; here the verifier is the target's session in this process, and the proposer a local
draft, a draft-free one, or a token tree of several, each run alone (a batch of one).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Collection, Iterator, Sequence

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from .decoding import Completion, Decoding
from .draft_length import DraftLength
from .drafters import model_drafter
from .drafting import DRAFT_MAX_SUPPORT, NO_CASCADE, Cascade, DraftTokens, Misalignment
from .grammar import GrammarCompiler, GrammarState
from .heads.eagle3 import Eagle3Head
from .heads.format import is_head, load_head_of
from .heads.medusa import MedusaHeads, is_medusa, load_medusa
from .heads.fed_guess import FedGuessBatch, FedGuesser
from .heads.medusa_draft import GuessBatch, MedusaGuesser, runner_up
from .heads.proposer import HeadDrafter, HeadState, drafted_alone
from .kv_cache import session_capacity
from .kv_pool import KVPool
from .lookup import DraftFree
from .proposer_kinds import CASCADE, DRAFT_FREE, TREE, ProposerKind
from .loop import SpeculativeLoop, run_now
from .proposers import Proposers
from .pass_hooks import HiddenKeeper, PassHook
from .proposing import Proposer, Verified, VerifyNeeds
from .loading import ModelSpec, gemv_layout, load_model, load_tokenizer
from .prompt import encode_prompt
from .request import GenerationParams
from .seeds import DraftDraws, verifier_generator
from .session_proposer import SessionProposer
from .sim_device import DRAFT, HEAD, TARGET, SimConfig, SimStream, simulate
from .ragged_pass import use_pooled_attention
from .recording import StatsRecorder
from .stats import SpecStats
from .steps import private_sequence, run_alone
from .stopping import Chunk, OutputAssembler
from .token_bridge import TokenBridge, bridge_if_needed, bridged_capacity
from .verifier_draft import VerifierDraft
from .verifying import TargetSession


class SpecEngine:
    """A target model, its tokenizer and any number of named drafts, all in this process."""

    def __init__(
        self,
        target: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        drafts: dict[str, PreTrainedModel],
        draft_max_support: int = DRAFT_MAX_SUPPORT,
        heads: dict[str, Eagle3Head] | None = None,
        medusa: dict[str, MedusaHeads] | None = None,
        bridges: dict[str, TokenBridge] | None = None,
        on_verifier: Collection[str] = (),
    ) -> None:
        """``on_verifier``: heads among ``heads`` that draft after each verify pass, in the target
        session's side, as a target replica serving them does (heads/fed_guess.py), rather than
        before it as a draft of their own."""
        self.target = use_pooled_attention(target)
        self.tokenizer = tokenizer
        self.drafts = {name: use_pooled_attention(model) for name, model in drafts.items()}
        self.heads = dict(heads or {})  # EAGLE-3 heads of this target, drafting from its hidden states
        self.medusa = dict(medusa or {})  # Medusa heads of this target, guessing from its last hidden state
        self.guesses = {name: GuessBatch(heads, MedusaHeads.reads_layer(target.config))
                        for name, heads in self.medusa.items()}
        if not_heads := sorted(set(on_verifier) - set(self.heads)):
            raise ValueError(f"on_verifier names {not_heads}, which are none of the heads fed by hidden states "
                             f"({', '.join(sorted(self.heads)) or 'none'})")
        self.fed_guesses = {name: FedGuessBatch(self.heads[name]) for name in on_verifier}
        self.draft_max_support = draft_max_support  # tokens a sampling draft's q keeps (see drafting.py)
        self.bridges = dict(bridges or {})  # drafts of another tokenizer, by name (token_bridge.py)
        self.context_window = int(target.config.max_position_embeddings)
        # Prompt lookup and suffix decoding (over the prompt alone: no task's outputs), the heads'
        # names, a tree's size and a cascade's guesses: what each request's proposer is built from.
        self.proposers = Proposers(DraftFree(), self.heads.keys(),
                                   on_verifier={*self.medusa, *self.fed_guesses})
        self.task = ""  # whose outputs suffix decoding reads, if a caller teaches proposers.draft_free some
        self.sim: SimConfig | None = None  # its models' simulated device (``simulate``), if on one
        self._grammars: GrammarCompiler | None = None

    @property
    def grammars(self) -> GrammarCompiler:
        """The target's grammars, built on the first request that has one."""
        if self._grammars is None:
            self._grammars = GrammarCompiler(self.tokenizer)
        return self._grammars

    def simulate(self, sim: SimConfig) -> SimStream:
        """Every model's passes from now on held to ``sim``'s timing (workers/sim_device.py), on one
        simulated device: the target, its drafts and heads share it, as one GPU's stream, since this
        engine runs them one after another; its drafts aligned on ``task`` as ``sim.alignment`` says.
        The stream, for its counters."""
        self.sim, stream = sim, SimStream()
        simulate(self.target, stream, sim.curve(TARGET, TARGET))
        for name, model in self.drafts.items():
            simulate(model, stream, sim.curve(name, DRAFT))
        for name, head in self.heads.items():
            simulate(head, stream, sim.curve(name, HEAD))
        return stream

    @classmethod
    def load(cls, target: ModelSpec, drafts: dict[str, ModelSpec], on_verifier: Collection[str] = ()) -> SpecEngine:
        """Load models; a draft whose tokenizer is not the target's drafts through the tokens they
        share (refused where they share too few); a draft that is an EAGLE-3 head or Medusa heads
        directory is loaded as heads of the target (refused if they are another's), those named in
        ``on_verifier`` drafting after each verify pass."""
        tokenizer = load_tokenizer(target.source)
        heads = {name: spec for name, spec in drafts.items() if is_head(spec.source)}
        medusa = {name: spec for name, spec in drafts.items() if is_medusa(spec.source)}
        models = {name: spec for name, spec in drafts.items() if name not in heads and name not in medusa}
        model = gemv_layout(load_model(target))  # the layout a model process serves with (ModelHost)
        loaded = {name: gemv_layout(load_model(spec)) for name, spec in models.items()}
        bridges = {name: bridge for name, spec in models.items()
                   if (bridge := bridge_if_needed(tokenizer, spec.source, loaded[name].config.vocab_size, name)) is not None}
        return cls(model, tokenizer, loaded, bridges=bridges,
                   heads={name: gemv_layout(load_head_of(spec.source, model)) for name, spec in heads.items()},
                   medusa={name: gemv_layout(load_medusa(spec.source, model)) for name, spec in medusa.items()},
                   on_verifier=on_verifier)

    def generate(self, prompt: str | list[int], params: GenerationParams, draft: str | None = None,
                 members: Sequence[str] = (), first_alone: bool = False) -> Generation:
        """``draft`` names the proposer: one of the drafts, a draft-free one (``ngram``, ``suffix``),
        ``tree``: the proposers named in ``members`` as one token tree, or ``cascade``: the draft
        model named in ``members`` with prompt lookup under it (``proposers.cascade``).
        ``first_alone``: a draft model's first step proposes nothing, as the service's do when they
        draft ahead (the same output for a seeded sampled request in both)."""
        prompt_ids = encode_prompt(self.tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
        if not prompt_ids or (isinstance(prompt, str) and not prompt):
            raise ValueError("prompt must not be empty")
        if len(prompt_ids) + params.max_tokens > self.context_window:
            raise ValueError(
                f"prompt is {len(prompt_ids)} tokens and max_tokens is {params.max_tokens}: together they "
                f"exceed the context window of {self.context_window} tokens; shorten the prompt or lower max_tokens"
            )
        if params.speculation:
            self._check_proposer(draft, members)
        return Generation(self, prompt_ids, params, draft if params.speculation else None, members, first_alone)

    def _check_proposer(self, name: str | None, members: Sequence[str]) -> None:
        known = (*sorted(self.drafts), *sorted(self.heads), *sorted(self.medusa), *DRAFT_FREE)
        if name == TREE:
            if len(members) < 2 or not set(members) <= set(known) or len(set(members)) < len(members):
                raise ValueError(f"a tree needs two or more different ones of {', '.join(known)}; got {list(members)}")
            if medusa := sorted(set(members) & set(self.medusa)):
                raise ValueError(f"Medusa heads {medusa} guess a tree of their own and join no token tree")
        elif name == CASCADE:
            if len(members) != 1 or members[0] not in self.drafts:
                raise ValueError(f"a cascade runs one draft model, one of {', '.join(sorted(self.drafts))}; "
                                 f"got {list(members)}")
        elif name not in known:
            raise ValueError(f"unknown draft {name!r}; available: {', '.join(known)}, {TREE} or {CASCADE}")


class LocalVerifier:
    """The target's side of one request in this process: its session, verified alone."""

    def __init__(self, model: PreTrainedModel, pool: KVPool, session: TargetSession) -> None:
        self.model = model
        self.pool = pool
        self.session = session

    async def open(self) -> None:
        pass  # the session holds the prompt from the start

    async def verify(self, proposal: DraftTokens, alone: bool, needs: VerifyNeeds) -> Verified:
        started = time.perf_counter()
        verdict = run_alone(self.model, self.pool, self.session.step(proposal))
        seconds = time.perf_counter() - started
        return Verified(verdict, seconds, self.session.take_extras(), self.session.take_logprobs(), self.session.ended)

    def arrived(self) -> Verified | None:
        return None  # every verdict is computed when asked

    async def close(self) -> None:
        pass

    def abandon(self) -> None:
        pass


class Generation:
    """One request in flight. Iterate for chunks as they are committed; ``complete()`` drains it."""

    def __init__(self, engine: SpecEngine, prompt_ids: list[int], params: GenerationParams, draft: str | None,
                 members: Sequence[str], first_alone: bool = False) -> None:
        self.engine = engine
        self.first_alone = first_alone
        self.params = params
        self.draft = draft
        self.decoding = Decoding(engine.tokenizer, prompt_ids, params, params.resolved_seed())
        self.recorder = StatsRecorder(self.decoding.stats)
        self.verify_generator = verifier_generator(self.decoding.stats.seed)
        self.capacity = session_capacity(len(prompt_ids), params.max_tokens, engine.context_window)
        self.length = DraftLength("fixed", params.k if draft else 0, params.k)
        proposer = self._proposer(draft, members) if draft else None
        pool, sequence = private_sequence(engine.target, prompt_ids, self.capacity)
        session = TargetSession(sequence, params.sampling, self.verify_generator,
                                self._hook(proposer.needs) if proposer else None, params.logprobs, params.processing,
                                grammar=self._grammar())
        self.loop = SpeculativeLoop(self.decoding, LocalVerifier(engine.target, pool, session), proposer,
                                    self.length, self.recorder)

    def _proposer(self, name: str, members: Sequence[str]) -> Proposer:
        return self.engine.proposers.build(name, self.engine.task, self.decoding.committed_ids(), self.recorder,
                                           self._model_draft, members)

    def _model_draft(self, name: str, kind: ProposerKind, in_tree: bool, cascade: Cascade = NO_CASCADE) -> Proposer:
        """A draft model or heads in this process, for this request (no lookahead: it runs alone)."""
        if kind is ProposerKind.ON_VERIFIER:  # drafting in or after the target session's passes (``_hook``)
            return VerifierDraft(name, self.params.sampling, self.recorder, self.length.most)
        if kind is ProposerKind.HEAD:
            state = HeadState(self.engine.heads[name], self.capacity, self.params.sampling,
                              DraftDraws(self.decoding.stats.seed, name), self.engine.draft_max_support)
            return SessionProposer(name, HeadDrafter(state, self.decoding.committed_ids()), drafted_alone,
                                   len(self.decoding.committed_ids()), self.length, self.recorder,
                                   VerifyNeeds(state.head.config.aux_layers))
        model, prompt_ids = self.engine.drafts[name], self.decoding.prompt_ids
        draws = DraftDraws(self.decoding.stats.seed, name)
        # an alignment set by hand for the draft on the engine's task, on a simulated device
        misaligned = Misalignment.of(self.engine.sim, name, self.engine.task, self.decoding.stats.seed)
        if (bridge := self.engine.bridges.get(name)) is not None:  # its own tokens of the text, no grammar
            prompt = bridge.encode(prompt_ids)
            pool, sequence = private_sequence(model, prompt, bridged_capacity(self.capacity, len(prompt_ids),
                                                                              len(prompt)))
            drafter = model_drafter(sequence, self.params.sampling, draws, max_support=self.engine.draft_max_support,
                                    cascade=cascade, misalignment=misaligned, bridge=bridge, committed=prompt_ids,
                                    name=name)
        else:
            pool, sequence = private_sequence(model, prompt_ids, self.capacity)
            drafter = model_drafter(sequence, self.params.sampling, draws, max_support=self.engine.draft_max_support,
                                    grammar=self._grammar(), output_start=len(prompt_ids), cascade=cascade,
                                    misalignment=misaligned)
        return SessionProposer(name, drafter, functools.partial(run_alone, model, pool), len(prompt_ids),
                               self.length, self.recorder, first_alone=self.first_alone)

    def _hook(self, needs: VerifyNeeds) -> PassHook | None:
        """The target session's hook that serves what the proposer ``needs`` of each pass: the
        hidden states of its layers, or the side of the heads drafting here, drawing as a draft of
        their name (workers/pass_hooks.py)."""
        if needs.hidden_layers:
            return HiddenKeeper(needs.hidden_layers)
        name, seed = needs.on_verifier, self.decoding.stats.seed
        if not name:
            return None
        if (fed := self.engine.fed_guesses.get(name)) is not None:
            state = HeadState(fed.head, self.capacity, self.params.sampling, DraftDraws(seed, name),
                              self.engine.draft_max_support)
            return FedGuesser(fed, state, self.length.most)
        return MedusaGuesser(self.engine.guesses[name], self.params.sampling, DraftDraws(seed, name),
                             self.engine.draft_max_support, DraftDraws(seed, runner_up(name)))

    def _grammar(self) -> GrammarState | None:
        """A state of the request's grammar of its own, for the target's session or a draft's."""
        return self.engine.grammars.state(self.params.grammar.compiled()) if self.params.grammar else None

    @property
    def stats(self) -> SpecStats:
        return self.decoding.stats

    @property
    def output(self) -> OutputAssembler:
        return self.decoding.output

    def __iter__(self) -> Iterator[Chunk]:
        chunks = self.loop.run()
        while True:
            try:
                yield run_now(chunks.__anext__())
            except StopAsyncIteration:
                return

    def complete(self) -> Completion:
        for _ in self:
            pass
        return self.decoding.completion(self.draft)
