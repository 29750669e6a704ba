"""Whether a draft speaks the target's tokenizer, naming the first difference where not; a draft that
does not drafts through the tokens the two share (workers/token_bridge.py)."""

import pytest

from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec
from specserve.workers.tokenizer_check import TokenizerMismatch, check_compatible
from specserve.cluster.zoo.tokenizer import train_tokenizer


def test_the_zoo_drafts_pass(tiny_zoo):
    from specserve.workers.loading import load_tokenizer

    from specserve.workers.heads.format import is_head

    target = load_tokenizer(str(tiny_zoo.target_dir))
    for name in tiny_zoo.draft_names:
        if not is_head(tiny_zoo.draft_dir(name)):  # an EAGLE-3 head has the target's vocabulary (test_heads.py)
            check_compatible(target, load_tokenizer(str(tiny_zoo.draft_dir(name))))


def test_different_vocabulary_names_the_first_differing_token():
    a = train_tokenizer(["the cat sat on the mat " * 50], vocab_size=300)
    b = train_tokenizer(["SELECT id FROM users WHERE " * 50], vocab_size=300)
    with pytest.raises(TokenizerMismatch, match=r"vocabularies differ at token id \d+: target '.+', draft '.+'"):
        check_compatible(a, b)


def test_different_special_tokens_are_refused():
    a = train_tokenizer(["hello world " * 50], vocab_size=280)
    b = train_tokenizer(["hello world " * 50], vocab_size=280)
    b.eos_token = b.pad_token
    with pytest.raises(TokenizerMismatch, match="special token eos_token differs"):
        check_compatible(a, b)


def test_the_engine_takes_a_draft_of_another_tokenizer_through_the_tokens_they_share(tiny_zoo, tmp_path):
    """Refused before drafts of another tokenizer were served: now it drafts through a bridge
    (tests/test_token_bridge.py), and one sharing too little is refused there."""
    from transformers import AutoModelForCausalLM

    draft = AutoModelForCausalLM.from_pretrained(tiny_zoo.draft_dir("sql"))
    draft.save_pretrained(tmp_path)
    train_tokenizer(["completely different text " * 40], vocab_size=300).save_pretrained(tmp_path)
    engine = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir)), {"odd": ModelSpec(str(tmp_path))})
    assert engine.bridges["odd"].shared > 256  # the bytes and a few merges


def test_the_router_starts_with_a_draft_of_another_tokenizer_and_says_so(tiny_zoo, tmp_path, caplog):
    import logging

    from transformers import AutoModelForCausalLM

    from specserve.cluster.models import ModelSet, check_tokenizers

    AutoModelForCausalLM.from_pretrained(tiny_zoo.draft_dir("sql")).save_pretrained(tmp_path)
    train_tokenizer(["completely different text " * 40], vocab_size=300).save_pretrained(tmp_path)
    models = ModelSet(target=str(tiny_zoo.target_dir), dtype="auto", tasks={"sql": ("sql", "odd")},
                      drafts={"sql": str(tiny_zoo.draft_dir("sql")), "odd": str(tmp_path)})
    with caplog.at_level(logging.INFO, logger="specserve.workers"):
        check_tokenizers(models)
    assert "draft odd has another tokenizer: " in caplog.text
