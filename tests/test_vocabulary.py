"""A standalone draft's reduced vocabulary (workers/vocabulary.py, FR-Spec): chosen by frequency,
cut at load from ``specserve_vocab.json``, answering the same logits on the tokens it keeps and
-inf elsewhere, lossless (greedy identical here; sampled in test_lossless_sampling.py), and made
and measured by `distill --method draft --draft-vocab N`."""

import copy
import json
import shutil

import pytest
import torch

from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec, load_model
from specserve.workers.request import GenerationParams
from specserve.workers.vocabulary import (VOCAB_FILE, PrunedHead, choose_vocabulary, prune_head, read_vocabulary,
                                          write_vocabulary)
from specserve.cluster.zoo.distill import distill_to_directory
from specserve.cluster.zoo.presets import TrainBudget


def test_the_vocabulary_is_the_most_frequent_tokens_and_says_what_it_covers():
    tokens = torch.tensor([5, 5, 5, 2, 2, 9, 7])
    ids, coverage = choose_vocabulary(tokens, 10, 2)
    assert ids.tolist() == [2, 5] and coverage == pytest.approx(5 / 7)
    ids, coverage = choose_vocabulary(tokens, 10, 6)  # more than the text uses: unseen ids fill it up
    assert ids.tolist() == [0, 1, 2, 5, 7, 9] and coverage == 1.0
    with pytest.raises(ValueError, match="must be 1..10 tokens"):
        choose_vocabulary(tokens, 10, 11)


def test_a_pruned_head_answers_the_same_logits_on_its_tokens_and_minus_infinity_elsewhere(tiny_zoo):
    draft = load_model(ModelSpec(str(tiny_zoo.draft_dir("sql"))))
    ids = torch.tensor([3, 4, 10, 17, 40])
    inputs = torch.tensor([[1, 40, 17, 3]])
    with torch.inference_mode():
        whole = draft(inputs).logits
        cut = prune_head(copy.deepcopy(draft), ids)(inputs).logits
    assert torch.allclose(cut[..., ids], whole[..., ids], atol=1e-5)
    off = torch.ones(whole.shape[-1], dtype=torch.bool)
    off[ids] = False
    assert torch.isneginf(cut[..., off]).all()
    with pytest.raises(ValueError, match="distinct ids in"):
        prune_head(copy.deepcopy(draft), torch.tensor([1, 1]))


def test_a_draft_directory_with_a_vocabulary_file_loads_cut_and_keeps_the_targets_output(tiny_zoo, tmp_path):
    draft = tmp_path / "sql-cut"
    shutil.copytree(tiny_zoo.draft_dir("sql"), draft)
    corpus = json.loads((tiny_zoo.root / "corpora" / "sql.json").read_text())["train"][:50]
    target = ModelSpec(str(tiny_zoo.target_dir))
    engine = SpecEngine.load(target, {"sql": ModelSpec(str(draft))})
    tokens = torch.tensor([t for doc in corpus for t in engine.tokenizer.encode(doc)])
    ids, coverage = choose_vocabulary(tokens, engine.target.config.vocab_size, 256)
    write_vocabulary(draft, ids, coverage)
    assert torch.equal(read_vocabulary(str(draft)), ids)
    cut = SpecEngine.load(target, {"sql": ModelSpec(str(draft))})
    assert isinstance(cut.drafts["sql"].get_output_embeddings(), PrunedHead)
    for prompt in tiny_zoo.prompts("sql")[:2] + tiny_zoo.prompts("prose")[:1]:  # prose: tokens it may have cut
        alone = cut.generate(prompt, GenerationParams(max_tokens=40, speculation=False)).complete()
        done = cut.generate(prompt, GenerationParams(max_tokens=40, k=3), draft="sql").complete()
        assert done.token_ids == alone.token_ids and done.stats.proposed > 0
    (draft / VOCAB_FILE).write_text('{"tokens": [1, 2]}')
    with pytest.raises(ValueError, match=r"not a draft vocabulary \(\{\"ids\": \[...\]\}\)"):
        load_model(ModelSpec(str(draft)))


def test_distill_measures_a_draft_with_its_whole_head_and_a_cut_one(tiny_zoo, tmp_path):
    corpus = tmp_path / "queries.sql"
    corpus.write_text("\n".join(json.loads((tiny_zoo.root / "corpora" / "sql.json").read_text())["train"][:40]))
    out = tmp_path / "my-draft"
    facts = distill_to_directory(str(tiny_zoo.target_dir), "sql", [str(corpus)], str(out),
                                 budget=TrainBudget(steps=5, batch_size=4, learning_rate=3e-3), distill_tokens=2_000,
                                 seed=0, init="target", draft_vocab=128)
    whole, cut = facts["measured"]
    assert whole["vocab_size"] == tiny_zoo.manifest["config"]["vocab_size"] and cut["vocab_size"] == 128
    assert 0 < cut["vocabulary_coverage"] <= 1 and cut["cost_ratio"] > 0
    assert facts["vocab_size"] == 128 and read_vocabulary(str(out)).numel() == 128  # asked for: kept
    assert isinstance(load_model(ModelSpec(str(out))).get_output_embeddings(), PrunedHead)
    with pytest.raises(ValueError, match="must be 1..384 tokens"):  # said before any training
        distill_to_directory(str(tiny_zoo.target_dir), "sql", [str(corpus)], str(out), budget=TrainBudget(1, 1, 1e-3),
                             distill_tokens=10, seed=0, draft_vocab=385)
