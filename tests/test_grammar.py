"""Structured output (workers/grammar.py): the output is the target's constrained to the grammar.

Greedy, every proposer gives the constrained target-only tokens, and the output parses and follows
its schema; sampled, the first tokens under a small grammar have the masked target's exact
distribution through the real engine (the statistics of test_lossless_sampling.py); a session
reopened after a failure masks as one that never stopped; a grammar that does not compile is one
message saying what is wrong. The rule's own masked cases are in test_acceptance_distribution.py.
"""

from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest
import torch

from specserve.proto.v1 import internal_pb2 as pb
from specserve.workers.acceptance import warp
from specserve.workers.sampling import SamplingParams
from specserve.workers.engine import SpecEngine
from specserve.workers.grammar import GrammarCompiler, GrammarState
from specserve.workers.grammar_spec import GrammarError, GrammarSpec
from specserve.workers.request import GenerationParams
from specserve.workers.target_replica import target_session
from specserve.workers.wire import sampling_message

from test_lossless_sampling import LENGTH, assert_same_distribution, tiny_head, tiny_model, word_tokenizer

PROPOSERS = [{"draft": "sql"}, {"draft": "eagle3"}, {"draft": "ngram"},
             {"draft": "tree", "members": ("sql", "general")}, {"draft": "cascade", "members": ("sql",)}]
# A schema a tiny model can finish within a few dozen tokens: every value bounded.
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "admin"],
          "properties": {"name": {"enum": ["ada", "bob", "cy"]}, "age": {"type": "integer", "minimum": 0,
                                                                         "maximum": 99},
                         "admin": {"type": "boolean"}}}
SCHEMA = GrammarSpec("json_schema", json.dumps(PERSON))


def generate(engine, prompt, grammar, sampling=SamplingParams(), seed=3, tokens=48, **proposer):
    params = GenerationParams(max_tokens=tokens, speculation=bool(proposer), grammar=grammar, sampling=sampling,
                              seed=seed)
    return engine.generate(prompt, params, **proposer).complete()


@pytest.mark.parametrize("proposer", PROPOSERS, ids=["draft", "head", "ngram", "tree", "cascade"])
def test_greedy_output_under_a_schema_is_the_constrained_targets_with_every_proposer(tiny_engine, tiny_zoo, proposer):
    prompt = tiny_zoo.prompts("sql")[2]
    alone = generate(tiny_engine, prompt, SCHEMA)
    assert alone.finish_reason == "eos"  # the grammar ended the text: nothing but EOS after the object
    jsonschema.validate(json.loads(alone.text), PERSON)
    speculated = generate(tiny_engine, prompt, SCHEMA, **proposer)
    assert speculated.token_ids == alone.token_ids
    assert speculated.stats.proposed > 0


def test_sampled_outputs_follow_a_regex_and_a_lark_grammar(tiny_engine, tiny_zoo):
    prompt = tiny_zoo.prompts("code")[0]
    regex = r"(select|update) [a-z]{1,6} (from|set) [a-z_]{1,8};"
    lark = 'start: "def " NAME "(" NAME? ")" ":"\nNAME: /[a-z]{1,5}/'
    for seed in range(4):
        done = generate(tiny_engine, prompt, GrammarSpec("regex", regex), SamplingParams(temperature=1.0), seed,
                        draft="code")
        assert done.finish_reason == "eos" and re.fullmatch(regex, done.text), done.text
        done = generate(tiny_engine, prompt, GrammarSpec("lark", lark), SamplingParams(temperature=1.0), seed,
                        draft="code")
        assert done.finish_reason == "eos" and re.fullmatch(r"def [a-z]{1,5}\([a-z]{0,5}\):", done.text), done.text


# Sampled, end to end: 3 positions of 3 allowed words each, the rest of the vocabulary forbidden
# (the word tokenizer's ids: a..f are 0..5).
SMALL_GRAMMAR = GrammarSpec("regex", "[abc][ade][bcf]")
ALLOWED = ({0, 1, 2}, {0, 3, 4}, {1, 2, 5})  # the reference's own reading of it, not llguidance's
SAMPLES = 5000


@torch.inference_mode()
def masked_distribution(model, prefix, params) -> dict[tuple, float]:
    """P(first LENGTH tokens) of the target constrained to SMALL_GRAMMAR, by enumeration."""
    out: dict[tuple, float] = {}

    def walk(seq, prob):
        generated = seq[len(prefix):]
        if len(generated) == LENGTH:
            out[tuple(generated)] = out.get(tuple(generated), 0.0) + prob
            return
        logits = model(torch.tensor([seq])).logits[0, -1:].clone()
        logits[0, [t for t in range(logits.shape[-1]) if t not in ALLOWED[len(generated)]]] = -math.inf
        for token, pr in enumerate(warp(logits, params)[0].double().tolist()):
            if pr > 0:
                walk(seq + [token], prob * pr)

    walk(list(prefix), 1.0)
    return out


# The head's (unmasked q) with the slow suite: the default run keeps the masked draft's, and the
# rule's own unmasked case (test_acceptance_distribution.py) runs by default.
@pytest.mark.parametrize("proposer", ["draft", pytest.param("head", marks=pytest.mark.slow)])
def test_sampling_under_a_grammar_has_the_masked_targets_distribution(proposer):
    """A draft model drafts within the grammar (its q masked as p is); an EAGLE-3 head knows nothing
    of it and proposes forbidden words, which are rejected, the residual drawn within the mask. TV
    and chi-square as test_lossless_sampling.py's, 5,000 draws each, the seeds split between two
    processes (each request is seeded: the same counts, in half the time on two cores)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    tokenizer = word_tokenizer()
    sampling = SamplingParams(temperature=1.0, top_p=0.9)
    exact = masked_distribution(tiny_model(0), [tokenizer.bos_token_id], sampling)
    assert len(exact) == 27 and math.isclose(sum(exact.values()), 1.0, rel_tol=1e-6)
    with ProcessPoolExecutor(2, mp_context=get_context("spawn")) as pool:
        shares = list(pool.map(_sample_under_the_grammar, [proposer] * 2, [range(i, SAMPLES, 2) for i in range(2)]))
    counts: dict[tuple, int] = {}
    for share, _, _ in shares:
        for outcome, count in share.items():
            counts[outcome] = counts.get(outcome, 0) + count
    proposed, accepted = sum(p for _, p, _ in shares), sum(a for _, _, a in shares)
    assert 0 < accepted < proposed  # drafts were accepted and rejected both
    assert_same_distribution(exact, counts, SAMPLES)


def _sample_under_the_grammar(proposer: str, seeds: range) -> tuple[dict[tuple, int], int, int]:
    """One process's share: (counts of the outputs, tokens proposed, tokens accepted)."""
    torch.set_num_threads(1)  # as every model test here runs (two threads on two busy cores: ~5x slower)
    tokenizer = word_tokenizer()
    sampling, k = SamplingParams(temperature=1.0, top_p=0.9), 2
    target = tiny_model(0)
    engine = SpecEngine(target, tokenizer, {"draft": tiny_model(1)}, heads={"head": tiny_head(target)})
    counts: dict[tuple, int] = {}
    proposed = accepted = 0
    for seed in seeds:
        # A head's first step is target-only (it drafts from the target's hidden states): one more token.
        params = GenerationParams(max_tokens=LENGTH + 1, sampling=sampling, seed=seed, k=k, grammar=SMALL_GRAMMAR)
        done = engine.generate([tokenizer.bos_token_id], params, draft=proposer).complete()
        counts[tuple(done.token_ids)] = counts.get(tuple(done.token_ids), 0) + 1
        proposed, accepted = proposed + done.stats.proposed, accepted + done.stats.accepted
    return counts, proposed, accepted


def test_a_reopened_session_masks_as_one_that_never_stopped(tiny_engine):
    """A replica lost mid-request: the next one's session consumes the output so far from its open
    message (prompt_ids[output_start:]) and masks the next rows as the first would have."""
    compiler = GrammarCompiler(tiny_engine.tokenizer)
    output = tiny_engine.tokenizer.encode('{"name": "bob", "age": 4', add_special_tokens=False)
    first = compiler.state(SCHEMA.compiled())
    first.commit(output)
    logits = torch.zeros(1, len(tiny_engine.tokenizer))

    class Sequence:  # what target_session reads of a pooled sequence
        committed, reused = [7, 8] + output, 0

    opened = pb.SessionOpen(prompt_ids=[7, 8] + output, sampling=sampling_message(SamplingParams(), 1),
                            grammar=pb.Grammar(compiled=SCHEMA.compiled(), output_start=2))
    session = target_session(Sequence(), opened, lambda: compiler)
    assert torch.equal(session.grammar.mask_chain(logits, []), first.mask_chain(logits, []))
    assert not session.ids_only  # the pass must hand the masked rows their logits


def test_masking_a_proposal_through_the_grammars_end_and_eos_leaves_the_state_as_it_was(tiny_engine):
    """llguidance takes EOS after a complete grammar without counting it: masking a proposal that
    runs through the closing brace and EOS must still roll back exactly what it consumed."""
    state = GrammarCompiler(tiny_engine.tokenizer).state(SCHEMA.compiled())
    eos = tiny_engine.tokenizer.eos_token_id
    ids = tiny_engine.tokenizer.encode('{"name": "cy", "age": 7, "admin": true}', add_special_tokens=False)
    rows = torch.zeros(len(ids) + 2, len(tiny_engine.tokenizer))
    before = state.mask_chain(rows[:1], [])
    masked = state.mask_chain(rows, ids + [eos])
    assert (masked[len(ids)] == 0).nonzero().flatten().tolist() == [eos]  # after the object: EOS only
    assert torch.equal(state.mask_chain(rows[:1], []), before)
    state.commit(ids + [eos])
    assert state.ended and not state.stuck


def test_a_proposed_id_outside_the_tokenizer_is_forbidden_and_leaves_the_state_as_it_was(tiny_engine):
    """A model may pad its vocabulary past the tokenizer's; llguidance stops for good on such an
    id, so a proposal carrying one (an unmasked head's) must not reach it."""
    state = GrammarCompiler(tiny_engine.tokenizer).state(SCHEMA.compiled())
    vocab = len(tiny_engine.tokenizer)
    first = tiny_engine.tokenizer.encode('{"', add_special_tokens=False)
    rows = torch.zeros(len(first) + 2, vocab + 64)  # logits wider than the tokenizer
    before = state.mask_chain(rows[:1], [])
    assert state.allowed_prefix(first + [vocab + 3, first[0]]) == len(first)
    masked = state.mask_chain(rows, first + [vocab + 3])
    assert torch.isinf(masked[:len(first) + 1, vocab:]).all() and not state.stuck  # (the row after it: never read)
    assert torch.equal(state.mask_chain(rows[:1], []), before)


def stick_after(monkeypatch, tokens: int) -> None:
    """Grammars report themselves stuck (as llguidance does past a limit of its own, a parser too
    complex) once ``tokens`` output tokens were committed to them."""
    committed = []
    commit = GrammarState.commit
    monkeypatch.setattr(GrammarState, "commit", lambda self, ids: (committed.extend(ids), commit(self, ids))[1])
    monkeypatch.setattr(GrammarState, "stuck", property(lambda self: "ParserTooComplex" * (len(committed) >= tokens)))


def test_a_grammar_that_can_take_no_further_token_ends_the_text_with_finish_reason_grammar(tiny_engine, tiny_zoo,
                                                                                          monkeypatch):
    prompt = tiny_zoo.prompts("sql")[2]
    free = generate(tiny_engine, prompt, GrammarSpec("regex", "[a-z]{30}"))
    stick_after(monkeypatch, 5)
    stuck = generate(tiny_engine, prompt, GrammarSpec("regex", "[a-z]{30}"))
    assert stuck.finish_reason == "grammar" and stuck.token_ids == free.token_ids[:5]


@pytest.mark.parametrize("kind,source,words", [
    ("json_schema", "{not json", "not valid JSON"),
    ("json_schema", '{"type": "nonsense"}', "nonsense"),
    ("json_schema", "[1, 2]", "a JSON object"),
    ("regex", "[a-", "unclosed character class"),
    ("lark", "start: foo", "unknown name"),
    ("yaml", "", "kind is one of"),
    ("regex", "a" * 70_000, "at most"),
])
def test_a_grammar_that_does_not_compile_is_one_message_naming_the_fault(kind, source, words):
    with pytest.raises(GrammarError, match=re.escape(words)):
        GrammarSpec(kind, source).compiled()
