"""A cascade on a draft model (workers/drafting.py): prompt lookup guesses, the draft verifies them in
its first pass. What it proposes is the draft's own drafting, token for token and q for q, in fewer
passes where the guesses are its tokens; through the engine, greedy output is the target's alone."""

from __future__ import annotations

import pytest
import torch

from specserve.workers.acceptance import SamplingParams
from specserve.workers.drafting import DraftSession
from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer
from specserve.workers.ragged_pass import use_pooled_attention
from specserve.workers.request import GenerationParams
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
        sessions[cascade] = (pool, DraftSession(sequence, sampling, DraftDraws(7, "sql"), cascade=cascade))
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


def test_greedy_output_with_a_cascade_is_the_targets_alone(tiny_zoo):
    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"sql": ModelSpec(str(tiny_zoo.draft_dir("sql")))})
    prompts = [tiny_zoo.prompts(task)[0] for task in ("sql", "code")]
    plain = [engine.generate(p, GenerationParams(max_tokens=40, speculation=False)).complete().token_ids for p in prompts]
    engine.cascade = K - 1
    for prompt, expected in zip(prompts, plain, strict=True):
        done = engine.generate(prompt, GenerationParams(max_tokens=40, k=K), draft="sql").complete()
        assert done.token_ids == expected
