"""A cascade on a draft model (workers/drafting.py): prompt lookup guesses, the draft verifies them in
its first pass. What it proposes is the draft's own drafting, token for token and q for q, in fewer
passes where the guesses are its tokens; through the engine, greedy output is the target's alone."""

from __future__ import annotations

import pytest
import torch

from specserve.workers.sampling import SamplingParams
from specserve.workers.drafting import GREEDY, Cascade, DraftSession
from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer
from specserve.workers.ragged_pass import use_pooled_attention
from specserve.workers.request import MAX_K, GenerationParams
from specserve.workers.seeds import DraftDraws
from specserve.workers.steps import private_sequence, run_alone

K = 5


@pytest.fixture(scope="module")
def draft(tiny_zoo):
    return use_pooled_attention(load_model(ModelSpec(str(tiny_zoo.draft_dir("sql")))))


def _repetitive(tiny_zoo) -> list[int]:
    """A prompt that says its text twice: prompt lookup has something to guess from."""
    ids = load_tokenizer(str(tiny_zoo.target_dir)).encode(tiny_zoo.prompts("sql")[0])
    return ids + ids


class Counting:
    """A step that counts its passes."""

    def __init__(self, step) -> None:
        self.step, self.passes = step, 0

    @property
    def result(self):
        return self.step.result

    def plan(self, room: int):
        return self.step.plan(room)

    def advance(self, logits: torch.Tensor) -> bool:
        self.passes += 1
        return self.step.advance(logits)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_cascade_proposes_the_drafts_own_tokens_and_q_in_fewer_passes(tiny_zoo, draft, sampling):
    prompt = _repetitive(tiny_zoo)
    sessions = {}
    for cascade in (0, K - 1):
        pool, sequence = private_sequence(draft, prompt, len(prompt) + 8 * (K + 1))
        sessions[cascade] = (pool, DraftSession(sequence, sampling, DraftDraws(7, "sql"),
                                                          cascade=Cascade(cascade)))
    passes = {0: 0, K - 1: 0}
    for step in range(6):
        proposals = {}
        for cascade, (pool, session) in sessions.items():
            counted = Counting(session.step(K))
            proposals[cascade] = run_alone(draft, pool, counted)
            passes[cascade] += counted.passes
        plain, cascaded = proposals[0], proposals[K - 1]
        assert cascaded.ids == plain.ids, step
        assert torch.equal(cascaded.q.ids, plain.q.ids) and torch.allclose(cascaded.q.probs, plain.q.probs, atol=1e-6)
        # The verifier keeps the proposal's first half and appends a token of its own: both sessions alike.
        keep = len(plain.ids) // 2
        for pool, session in sessions.values():
            session.resync(plain, len(session.sequence.committed) + keep, [prompt[step]])
    # The guesses it drew saved passes (greedy: the tiny draft repeats the prompt; sampled at t=1 it
    # seldom draws a guess here), and a cascade never costs one.
    assert passes[K - 1] < passes[0] if sampling.greedy else passes[K - 1] <= passes[0], passes


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_cascade_proposes_past_k_down_the_guesses_the_draft_drew(tiny_zoo, draft, sampling):
    """With more guesses than k, a proposal goes on past k while the draft draws what prompt lookup
    guessed (two proposers agreeing), in the same first pass. Each token is still the one the draft
    alone would have drawn there, with the same q: the proposal is a prefix of the draft's own
    longer one."""
    k, cascade, longer = 2, 8, 10
    # A prompt that says a text, the draft's own greedy continuation of it and the text again: where
    # the draft goes on as it did, prompt lookup guesses its tokens.
    text = load_tokenizer(str(tiny_zoo.target_dir)).encode(tiny_zoo.prompts("sql")[0])
    pool, sequence = private_sequence(draft, text, len(text) + 2 * MAX_K)
    prompt = text + run_alone(draft, pool, DraftSession(sequence, GREEDY, DraftDraws(7, "sql")).step(MAX_K)).ids + text
    sessions = {}
    for guesses in (0, cascade):
        pool, sequence = private_sequence(draft, prompt, len(prompt) + 8 * (longer + 1))
        sessions[guesses] = (pool, DraftSession(sequence, sampling, DraftDraws(7, "sql"),
                                                          cascade=Cascade(guesses)))
    past_k = 0
    for step in range(6):
        (plain_pool, plain_session), (pool, session) = sessions[0], sessions[cascade]
        plain = run_alone(draft, plain_pool, plain_session.step(longer))
        counted = Counting(session.step(k))
        cascaded = run_alone(draft, pool, counted)
        n = len(cascaded.ids)
        assert k <= n <= len(plain.ids) and cascaded.ids == plain.ids[:n], step
        assert torch.equal(cascaded.q.ids, plain.q.ids[:n]) and torch.allclose(cascaded.q.probs, plain.q.probs[:n],
                                                                               atol=1e-6)
        assert counted.passes <= k or n == k, (counted.passes, n)  # past k: within the first pass only
        past_k += n > k
        # The verifier keeps the proposal and appends the draft's next token: the draft's own path.
        after = plain.ids[n] if n < len(plain.ids) else prompt[step]
        plain_session.resync(plain, len(plain_session.sequence.committed) + n, [after])
        session.resync(cascaded, len(session.sequence.committed) + n, [after])
    if sampling.greedy:  # the tiny draft repeats the prompt: it draws the guesses
        assert past_k > 0


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=1.0, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_a_cascade_proposes_the_guesses_its_draft_vouches_for_as_they_are(tiny_zoo, draft, sampling):
    """A guess the draft gives at least min_p is proposed as it is, with a one-hot q (the choice is
    made given what stands, whatever the draft would have drawn); past the guesses it drafts on.
    At min_p 0 every guess it can draw is taken: greedy (where it can draw any token), the proposal
    starts with prompt lookup's guesses; sampled, it takes them while they are in its support."""
    text = load_tokenizer(str(tiny_zoo.target_dir)).encode(tiny_zoo.prompts("code")[0])
    prompt = text + text[: len(text) // 2]  # lookup guesses the second half of the text
    pool, sequence = private_sequence(draft, prompt, len(prompt) + 4 * MAX_K)
    session = DraftSession(sequence, sampling, DraftDraws(7, "sql"), cascade=Cascade(8, 0.0))
    run = session.step(3)
    guesses = list(run.guesses)
    proposal = run_alone(draft, pool, run)
    taken = next((i for i, (a, b) in enumerate(zip(proposal.ids, guesses)) if a != b), len(guesses))
    assert guesses and (taken == len(guesses) or not sampling.greedy)
    assert torch.equal(proposal.q.probs[:taken, 0], torch.ones(taken))  # one-hot: all on the guess
    if taken < len(guesses):  # the first guess not taken: one the draft gives nothing (outside top p)
        row = proposal.q.ids[taken][proposal.q.probs[taken] > 0]
        assert guesses[taken] not in row.tolist()
    # Drafted again from the same place, within 3 tokens (a branch's region starts there on a draft
    # worker): the first pass holds 2 guesses at most, and the run stops at 3 whatever it takes.
    run = session.step(3)
    run.within(3)
    assert len(run.guesses) <= 2 and len(run_alone(draft, pool, run).ids) <= 3


def test_greedy_output_with_a_cascade_is_the_targets_alone(tiny_zoo):
    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"sql": ModelSpec(str(tiny_zoo.draft_dir("sql")))})
    prompts = [tiny_zoo.prompts(task)[0] for task in ("sql", "code")]
    plain = [engine.generate(p, GenerationParams(max_tokens=40, speculation=False)).complete().token_ids for p in prompts]
    for guesses, k, min_p in ((K - 1, K, 1.0), (8, 2, 1.0), (8, 2, 0.1), (8, 2, 0.0)):  # past k; guesses taken
        engine.proposers.cascade = Cascade(guesses, min_p)
        for prompt, expected in zip(prompts, plain, strict=True):
            done = engine.generate(prompt, GenerationParams(max_tokens=40, k=k), draft="cascade",
                                   members=("sql",)).complete()
            assert done.token_ids == expected
    with pytest.raises(ValueError, match="a cascade runs one draft model, one of sql; got \\['ngram'\\]"):
        engine.generate(prompts[0], GenerationParams(max_tokens=4), draft="cascade", members=("ngram",))
