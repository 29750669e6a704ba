"""A GGUF file serves wherever a model directory does: the tiny zoo's models written as GGUF here
(``gguf_export``), loaded through ``workers.loading`` as the engine loads them.

Bounds: at f32 the weights come back bit-identical (so the logits too, asserted at atol 1e-4); at
f16 and q8_0 every matrix comes back as the directory's rounded by the gguf package's reference
(quantise, dequantise), the logits within 5e-3 (f16; observed ~1.5e-4) and 2e-2 (q8_0; observed ~3e-3)
of the directory's, on logits of magnitude ~1; greedy speculative output is token-identical.

To get such a file elsewhere (a CLI test): ``write_gguf(tiny_zoo.target_dir, tmp_path / "target.gguf")``
after ``from gguf_export import write_gguf``, or use the ``gguf_target`` fixture (conftest.py).
"""

import gguf
import pytest
import torch

from gguf_export import write_gguf
from specserve.workers.engine import SpecEngine
from specserve.workers.loading import ModelSpec, load_model, load_tokenizer
from specserve.workers.request import GenerationParams
from specserve.workers.tokenizer_check import SAMPLE_TEXTS, check_compatible

DRAFT = "sql"
TEXTS = (
    *SAMPLE_TEXTS,
    "class Stack:\n\tdef push(self, x):\n\t\tself.items.append(x)  # O(1)\n",
    "It was the best of times, it was the worst of times.  \r\n Ünïcödé: Ωμέγα, Привет, مرحبا, 🚀🧪",
    "<|bos|>special tokens inline<|eos|><|pad|>, and one this vocabulary lacks: <|endoftext|>",
    "   leading spaces, trailing spaces   ",
)


def on_cpu(source: str):
    return load_model(ModelSpec(source, dtype="float32", device="cpu"))


@pytest.fixture(scope="module")
def prompt_ids(tiny_zoo) -> torch.Tensor:
    tokenizer = load_tokenizer(str(tiny_zoo.target_dir))
    return torch.tensor([[tokenizer.bos_token_id, *tokenizer.encode(tiny_zoo.prompts(DRAFT)[0])]])  # [1, seq]


def test_the_tokenizer_read_from_the_file_is_the_directorys(tiny_zoo, gguf_target):
    ours, theirs = load_tokenizer(gguf_target), load_tokenizer(str(tiny_zoo.target_dir))
    assert ours.get_vocab() == theirs.get_vocab()
    assert ours.special_tokens_map == theirs.special_tokens_map and ours.unk_token is theirs.unk_token is None
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    check_compatible(ours, load_tokenizer(str(tiny_zoo.draft_dir(DRAFT))))


def test_f32_weights_and_logits_are_the_directorys(tiny_zoo, gguf_target, prompt_ids):
    ours, theirs = on_cpu(gguf_target), on_cpu(str(tiny_zoo.target_dir))
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "intermediate_size", "max_position_embeddings", "vocab_size", "tie_word_embeddings",
                "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(ours.config, key) == getattr(theirs.config, key), key
    assert ours.config.rope_parameters["rope_theta"] == theirs.config.rope_parameters["rope_theta"]
    reference = theirs.state_dict()
    for name, tensor in ours.state_dict().items():  # Q and K included: the row permutation round-trips
        assert torch.equal(tensor, reference[name]), name
    with torch.no_grad():
        torch.testing.assert_close(ours(prompt_ids).logits, theirs(prompt_ids).logits, rtol=0, atol=1e-4)


@pytest.mark.parametrize(("dtype", "atol"), [("f16", 5e-3), ("q8_0", 2e-2)])
def test_a_rounded_file_loads_as_the_directorys_weights_rounded(tiny_zoo, tmp_path, prompt_ids, dtype, atol):
    """The tied-embedding draft: each matrix comes back dequantised to float32, equal to the directory's
    rounded to the file's type by the gguf package's own reference; norms stay float32, as llama.cpp keeps them."""
    source = tiny_zoo.draft_dir(DRAFT)
    ours = on_cpu(str(write_gguf(source, tmp_path / f"draft-{dtype}.gguf", dtype=dtype)))
    theirs = on_cpu(str(source))
    assert ours.config.tie_word_embeddings and theirs.config.tie_word_embeddings
    qtype = gguf.GGMLQuantizationType[dtype.upper()]
    reference = theirs.state_dict()
    for name, tensor in ours.state_dict().items():
        expected = reference[name]
        if expected.ndim > 1:
            expected = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(expected.numpy(), qtype), qtype))
        assert tensor.dtype == torch.float32 and torch.equal(tensor, expected), name
    with torch.no_grad():
        torch.testing.assert_close(ours(prompt_ids).logits, theirs(prompt_ids).logits, rtol=0, atol=atol)


def test_greedy_speculation_with_a_gguf_target_matches_the_directory_target(tiny_zoo, gguf_target):
    draft = {DRAFT: ModelSpec(str(tiny_zoo.draft_dir(DRAFT)), device="cpu")}
    from_file = SpecEngine.load(ModelSpec(gguf_target, dtype="float32", device="cpu"), draft)  # checks tokenizers
    from_dir = SpecEngine.load(ModelSpec(str(tiny_zoo.target_dir), dtype="float32", device="cpu"), draft)
    params = GenerationParams(max_tokens=24, k=4)
    for prompt in tiny_zoo.prompts(DRAFT)[:3]:
        ours = from_file.generate(prompt, params, draft=DRAFT).complete()
        theirs = from_dir.generate(prompt, params, draft=DRAFT).complete()
        assert ours.token_ids == theirs.token_ids and ours.text == theirs.text
        assert ours.stats.accepted_per_position == theirs.stats.accepted_per_position  # same verdicts
