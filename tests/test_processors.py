"""Penalties and a logit bias (workers/processors.py): the output is the processed target's with
every proposer. Greedy, each proposer gives target-only's processed tokens (so each verify row saw
the output as that row's position does, proposal tokens before it included); a bias of +100 makes
a token the only one; bad values are refused naming the field."""

from __future__ import annotations

import pytest
import torch

from specserve.workers.sampling import SamplingParams
from specserve.workers.processors import processed
from specserve.workers.sampling import LogitsProcessing
from specserve.workers.request import GenerationParams

TOKENS = 24
PROPOSERS = [{"draft": "sql"}, {"draft": "eagle3"}, {"draft": "ngram"},
             {"draft": "tree", "members": ("sql", "general")}, {"draft": "cascade", "members": ("sql",)}]


def generate(engine, prompt, processing, sampling=SamplingParams(), **proposer):
    params = GenerationParams(max_tokens=TOKENS, speculation=bool(proposer), processing=processing, sampling=sampling,
                              seed=3)
    return engine.generate(prompt, params, **proposer).complete()


@pytest.mark.parametrize("proposer", PROPOSERS, ids=["draft", "head", "ngram", "tree", "cascade"])
def test_greedy_output_under_penalties_is_the_processed_targets_with_every_proposer(tiny_engine, tiny_zoo, proposer):
    prompt = tiny_zoo.prompts("sql")[2]
    processing = LogitsProcessing(((5, 3.0),), presence_penalty=0.6, frequency_penalty=0.8)
    alone = generate(tiny_engine, prompt, processing)
    plain = generate(tiny_engine, prompt, LogitsProcessing())
    assert alone.token_ids != plain.token_ids  # the penalties change this output
    assert generate(tiny_engine, prompt, processing, **proposer).token_ids == alone.token_ids


def test_a_large_bias_makes_a_token_the_only_one_and_a_penalty_is_what_openai_says(tiny_engine, tiny_zoo):
    prompt = tiny_zoo.prompts("sql")[2]
    forced = generate(tiny_engine, prompt, LogitsProcessing(((42, 100.0),)), SamplingParams(temperature=1.0),
                      draft="sql")
    assert set(forced.token_ids) == {42}
    logits = torch.zeros(2, 6)
    processing = LogitsProcessing(((1, 0.5),), presence_penalty=1.0, frequency_penalty=0.25)
    processed_rows = processed(processing, logits, [[], [3, 3]])
    assert processed_rows[0].tolist() == [0, 0.5, 0, 0, 0, 0]
    assert processed_rows[1].tolist() == [0, 0.5, 0, -1.5, 0, 0]  # presence 1 + 2 x 0.25


@pytest.mark.parametrize("processing, words", [
    (dict(presence_penalty=2.5), "presence_penalty must be -2..2"),
    (dict(frequency_penalty=-3), "frequency_penalty must be -2..2"),
    (dict(logit_bias=((7, 101.0),)), "logit_bias maps token ids >= 0 to -100..100"),
])
def test_bad_processing_is_refused_naming_the_field(processing, words):
    with pytest.raises(ValueError, match=words):
        LogitsProcessing(**processing)
